"""OpenTelemetry exports in OTLP JSON (the Collector's file exporter, one export request a
line, or one OTLP/HTTP JSON body): LLM spans of the GenAI semantic conventions or of
OpenInference, and the API-request log events of Claude Code and Codex.

Spans:

* a request is a span whose ``gen_ai.operation.name`` is ``chat``, ``text_completion`` or
  ``generate_content``, or whose ``openinference.span.kind`` is ``LLM``; arrival = span
  start, ``end_ns`` = span end - start; ``ttft_ns`` from ``gen_ai.response.time_to_first_chunk``
  (seconds) or OpenInference's ``First Token Stream Event``;
* ``input_tokens`` = ``gen_ai.usage.input_tokens`` / ``llm.token_count.prompt`` (cache reads
  and writes included, as both conventions say; a count below its cache parts is taken as
  excluding them and they are added), ``output_tokens`` = ``gen_ai.usage.output_tokens`` /
  ``llm.token_count.completion``, ``cached_tokens`` = ``gen_ai.usage.cache_read.input_tokens``
  / ``llm.token_count.prompt_details.cache_read``;
* session = ``gen_ai.conversation.id`` (OpenInference: ``session.id``) of the span or its
  nearest ancestor that has one, else the trace id;
* agents: ``invoke_agent`` spans (OpenInference ``AGENT``). A request belongs to its nearest
  agent ancestor; the outermost agent (or none) is ``main``, an agent under another agent
  is a subagent (schema v2), spawned by the enclosing agent's latest request before it
  started and joined by that agent's first request after it ended;
* within an agent, each request follows the one before (``parent_index``); ``think_ns`` =
  arrival - the latest dependency's end: tool time (``execute_tool`` / ``TOOL`` spans) or
  the user's time.

Log events, one request each: Claude Code's ``claude_code.api_request`` (``input_tokens``,
plus ``cache_read_tokens`` + ``cache_creation_tokens`` where the session's counts are
Anthropic's uncached part, ``uncached_sessions``; ``cached_tokens`` = cache reads,
end = ``event.timestamp``, arrival = end - ``duration_ms``, session = ``session.id``);
Codex's ``codex.sse_event`` of kind ``response.completed`` (``input_token_count`` including
``cached_token_count``; arrival = the conversation's latest ``codex.api_request`` minus its
``duration_ms``, session = ``conversation.id``). Neither names an agent: one stream per
session.

Hash ids: from the prompt where it was captured (``gen_ai.input.messages`` with
``gen_ai.system_instructions``, OpenInference ``llm.input_messages``), hashed as the
recorder hashes content; otherwise from cache counts (``hashing.cached_prefix_hashes``):
each request's cached tokens are its parent's leading blocks; without a cache count, from
token counts alone (``hashing.chain_hashes``: the context taken as append-only).

Bad input (a span without token counts, one that ends before it starts, a cycle in parent
ids, a line that is not JSON) gets one line naming it in the notes; the rest is imported.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from agent_replay.errors import TraceError
from agent_replay.traces.builder import Request, build_table
from agent_replay.traces.hashing import cached_prefix_hashes, chain_hashes
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    head_bytes,
    parse_iso_ns,
)
from agent_replay.traces.otlp import (
    attributes,
    log_records,
    looks_like_otlp,
    nanos,
    read_exports,
    spans,
)
from agent_replay.traces.schema import TraceMeta

NAME = "otel"
BLOCK_SIZE = 16
LLM_OPERATIONS = ("chat", "text_completion", "generate_content")
MAX_PROBLEM_LINES = 20
"""Problems listed one line each in the notes; past this many, a count."""
FIRST_TOKEN_EVENT = "First Token Stream Event"
AGENT_TOOLS = ("Agent", "Task")
"""Claude Code's tools that run a subagent."""


def sniff(path: Path, head: bytes) -> bool:
    return looks_like_otlp(head)


@dataclass(slots=True)
class _Span:
    """What a request, agent or tool span contributes (the rest of it is dropped on read)."""

    sid: str
    trace: str
    kind: str  # "llm", "agent", "tool"
    name: str
    start: int
    end: int
    session: str | None = None
    model: str | None = None
    n_in: int | None = None
    n_out: int | None = None
    cached: int | None = None
    ttft_ns: int | None = None
    prompt: list[Any] | None = None
    agent: str | None = None  # the agent's name (agent spans)


@dataclass(slots=True)
class _Mark:
    session: str
    order: tuple[int, int]
    ts: int
    kind: str  # "request", "spawn", "done"
    ref: object  # the request's index in ``events``, or the Agent call's tool_use_id
    agent: str | None  # requests: the subagent's name (None: the main agent)


def _order(a: dict[str, Any], ts: int) -> tuple[int, int]:
    """Claude Code's ``event.sequence`` (its own order), then the time."""
    seq = _int(a, "event.sequence")
    return (seq if seq is not None else -1, ts)


@dataclass
class Collector:
    """Spans and log events of OTLP export requests, fed one request at a time
    (``add``), turned into requests at the end (``requests``). Spans that are neither
    requests, agents nor tools leave only their parent link."""

    links: ParentLinks = field(default_factory=lambda: ParentLinks())
    kept: dict[int, _Span] = field(default_factory=dict)
    """Request, agent and tool spans by ``span_key`` of their id."""
    events: list[Request] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    n_problems: int = 0
    n_spans: int = 0
    n_tools: int = 0
    n_metrics: int = 0
    _codex_sent: dict[str, int] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    _cycles: set[str] = field(default_factory=set)
    _marks: list[_Mark] = field(default_factory=list)
    """Claude Code events in a session's order: requests, subagent spawns and returns."""
    n_flat_sessions: int = 0
    n_uncached_sessions: int = 0

    def problem(self, line: str) -> None:
        self.n_problems += 1
        if len(self.problems) < MAX_PROBLEM_LINES:
            self.problems.append(line)

    def add(self, export: dict[str, Any], where: str) -> None:
        if "resourceMetrics" in export:
            self.n_metrics += 1
        for res, sp in spans(export):
            self._span(res, sp, where)
        for res, rec in log_records(export):
            self._log(res, rec, where)

    # spans

    def _span(self, res: dict[str, Any], sp: dict[str, Any], where: str) -> None:
        self.n_spans += 1
        sid, tid = sp.get("spanId"), sp.get("traceId")
        if not isinstance(sid, str) or not sid or not isinstance(tid, str):
            self.problem(f"{where}: a span without spanId/traceId: skipped")
            return
        key = span_key(sid)
        parent = sp.get("parentSpanId")
        if isinstance(parent, str) and parent:
            self.links.add(key, span_key(parent))
        a = attributes(sp.get("attributes"))
        op = a.get("gen_ai.operation.name")
        oi = a.get("openinference.span.kind")
        oi = oi.upper() if isinstance(oi, str) else None
        if op in LLM_OPERATIONS or oi == "LLM":
            kind = "llm"
        elif op == "invoke_agent" or oi == "AGENT":
            kind = "agent"
        elif op == "execute_tool" or oi == "TOOL":
            self.n_tools += 1
            return
        else:
            return
        name = str(sp.get("name") or "")
        label = f"{where}: span {sid} ({name})" if name else f"{where}: span {sid}"
        start, end = nanos(sp.get("startTimeUnixNano")), nanos(sp.get("endTimeUnixNano"))
        if start is None or end is None:
            self.problem(f"{label}: no start or end time: skipped")
            return
        if end < start:
            self.problem(f"{label}: ends {(start - end) / 1e6:.3f} ms before it starts: skipped")
            return
        session = a.get("gen_ai.conversation.id") or a.get("session.id")
        s = _Span(sid, tid, kind, name, start, end,
                  session=session if isinstance(session, str) and session else None)
        if kind == "agent":
            agent = a.get("gen_ai.agent.name") or a.get("gen_ai.agent.id") or a.get("agent.name")
            s.agent = str(agent) if agent else None
            self.kept[key] = s
            return
        if oi == "LLM" and op not in LLM_OPERATIONS:
            self.sources.add("openinference")
            n_in, n_out = _int(a, "llm.token_count.prompt"), _int(a, "llm.token_count.completion")
            read = _int(a, "llm.token_count.prompt_details.cache_read")
            write = _int(a, "llm.token_count.prompt_details.cache_write")
            s.model = _str(a, "llm.model_name")
            s.prompt = _openinference_messages(a)
            for ev in sp.get("events") or ():
                if isinstance(ev, dict) and ev.get("name") == FIRST_TOKEN_EVENT:
                    t = nanos(ev.get("timeUnixNano"))
                    if t is not None and t >= start:
                        s.ttft_ns = t - start
                    break
        else:
            self.sources.add("gen_ai")
            n_in, n_out = _int(a, "gen_ai.usage.input_tokens"), _int(a, "gen_ai.usage.output_tokens")
            read = _int(a, "gen_ai.usage.cache_read.input_tokens")
            write = _int(a, "gen_ai.usage.cache_creation.input_tokens")
            s.model = _str(a, "gen_ai.response.model") or _str(a, "gen_ai.request.model")
            s.prompt = _gen_ai_messages(a)
            ttfc = a.get("gen_ai.response.time_to_first_chunk")
            if isinstance(ttfc, (int, float)) and not isinstance(ttfc, bool) and ttfc >= 0:
                s.ttft_ns = round(ttfc * 1e9)
        if n_in is None or n_out is None:
            missing = [k for k, v in (("input", n_in), ("output", n_out)) if v is None]
            self.problem(f"{label}: no {' or '.join(missing)} token count: skipped")
            return
        if n_in < (read or 0) + (write or 0):
            n_in += (read or 0) + (write or 0)  # a count of the uncached part alone
        s.n_in, s.n_out, s.cached = n_in, n_out, read
        self.kept[key] = s

    # log events

    def _log(self, res: dict[str, Any], rec: dict[str, Any], where: str) -> None:
        a = attributes(rec.get("attributes"))
        body = rec.get("body")
        names = {rec.get("eventName"), a.get("event.name"),
                 body.get("stringValue") if isinstance(body, dict) else None}
        ts = _event_time(rec, a, where)
        if names & {"claude_code.api_request"} or ("api_request" in names and "cache_read_tokens" in a):
            self.sources.add("claude-code events")
            self._claude(a, ts, where)
        elif names & {"tool_decision", "claude_code.tool_decision", "tool_result",
                      "claude_code.tool_result"} and a.get("tool_name") in AGENT_TOOLS:
            sess, tid = _str(a, "session.id"), _str(a, "tool_use_id")
            if sess is not None and tid is not None and ts is not None and \
                    a.get("decision", "accept") == "accept":
                done = bool(names & {"tool_result", "claude_code.tool_result"})
                self._marks.append(_Mark(sess, _order(a, ts), ts, "done" if done else "spawn",
                                         tid, None))
        elif "codex.api_request" in names:
            conv = _str(a, "conversation.id")
            dur = _num(a, "duration_ms")
            if conv is not None and ts is not None and dur is not None:
                self._codex_sent[conv] = ts - int(dur * 1e6)
        elif "codex.sse_event" in names and a.get("event.kind") == "response.completed":
            self.sources.add("codex events")
            self._codex(a, ts, where)

    def _claude(self, a: dict[str, Any], ts: int | None, where: str) -> None:
        sess = _str(a, "session.id")
        label = f"{where}: api_request event" + (f" (prompt {a['prompt.id']})" if a.get("prompt.id") else "")
        n_in, n_out = _int(a, "input_tokens"), _int(a, "output_tokens")
        if n_in is None or n_out is None:
            self.problem(f"{label}: no input or output token count: skipped")
            return
        if ts is None or sess is None:
            self.problem(f"{label}: no timestamp or session.id: skipped")
            return
        dur = _num(a, "duration_ms")
        if dur is not None and dur < 0:
            self.problem(f"{label}: negative duration_ms {dur}: skipped")
            return
        read = _int(a, "cache_read_tokens") or 0
        write = _int(a, "cache_creation_tokens") or 0
        span = int((dur or 0) * 1e6)
        source = _str(a, "query_source") or ""
        sub = _str(a, "agent.name") or (source[6:] if source.startswith("agent:") else None)
        self._marks.append(_Mark(sess, _order(a, ts), ts, "request", len(self.events), sub))
        self.events.append(Request(
            session=sess, key=len(self.events), arrival_abs_ns=ts - span,
            input_tokens=n_in, output_tokens=n_out, cached_tokens=read,
            api="messages", model=_str(a, "model"), end_ns=span if dur is not None else None,
            extra={"cache_parts": (read, write)}))

    def _codex(self, a: dict[str, Any], ts: int | None, where: str) -> None:
        conv = _str(a, "conversation.id")
        label = f"{where}: response.completed event"
        n_in, n_out = _int(a, "input_token_count"), _int(a, "output_token_count")
        if n_in is None or n_out is None:
            self.problem(f"{label}: no input or output token count: skipped")
            return
        if ts is None or conv is None:
            self.problem(f"{label}: no timestamp or conversation.id: skipped")
            return
        sent = self._codex_sent.pop(conv, None)
        arrival = sent if sent is not None and sent <= ts else ts
        cached = _int(a, "cached_token_count")
        self.events.append(Request(
            session=conv, key=len(self.events), arrival_abs_ns=arrival, input_tokens=n_in,
            output_tokens=n_out, cached_tokens=min(cached, n_in) if cached is not None else None,
            api="responses", model=_str(a, "model"), end_ns=ts - arrival))

    # assembly

    def _ancestors(self, sid: str) -> list[int] | None:
        """Keys up the parent chain of span ``sid`` (nearest first); None on a cycle."""
        out: list[int] = []
        key = span_key(sid)
        seen = {key}
        cur = self.links.parent(key)
        while cur is not None:
            if cur in seen:
                return None
            seen.add(cur)
            out.append(cur)
            cur = self.links.parent(cur)
        return out

    def _claude_streams(self, agent_ids: dict[object, str], outer_of: dict[object, object],
                        end_of: dict[object, int]) -> dict[int, object]:
        """Claude Code's subagents: an accepted ``Agent`` (``Task``) call opens one (after
        the ``api_request`` of the turn that made it, which Claude Code logs after the
        call's ``tool_decision``), its ``tool_result`` closes it, and a request whose
        ``agent.name`` / ``query_source`` names a subagent belongs to the innermost one
        open. Subagents run one inside
        another; two calls opened before either sends a request run side by side, and the
        events do not say whose request is whose: that session stays one stream (counted
        in ``n_flat_sessions``). Returns the stream of each event request (by index)."""
        by_session: dict[str, list[_Mark]] = {}
        for m in self._marks:
            by_session.setdefault(m.session, []).append(m)
        out: dict[int, object] = {}
        self.n_flat_sessions = 0
        for session, marks in by_session.items():
            marks.sort(key=lambda m: m.order if all(x.order[0] >= 0 for x in marks) else
                       (m.ts, m.order[0]))
            stack: list[str] = []
            quiet: set[str] = set()  # opened, no request yet
            deferred: list[str] = []
            mine: dict[int, object] = {}
            flat = False
            for m in marks:
                ref = str(m.ref)
                if m.kind == "spawn":
                    # logged before the api_request of the turn that made the call: it opens
                    # after that request
                    deferred.append(ref)
                elif m.kind == "done":
                    if ref in deferred:
                        deferred.remove(ref)
                    if ref in stack:
                        stack.remove(ref)
                        quiet.discard(ref)
                        end_of[(session, ref)] = m.ts
                else:
                    if m.agent is not None and stack:
                        quiet.discard(stack[-1])
                        mine[int(ref)] = (session, stack[-1])
                        agent_ids[(session, stack[-1])] = f"{m.agent}-{stack[-1][-8:]}"
                    for opened in deferred:
                        if quiet:
                            flat = True
                        stack.append(opened)
                        quiet.add(opened)
                        outer_of[(session, opened)] = (session, stack[-2]) if len(stack) > 1 \
                            else None
                    deferred = []
            if flat:
                self.n_flat_sessions += 1
            elif mine:
                out.update(mine)
        return out

    def requests(self) -> tuple[list[Request], dict[str, list[Any]]]:
        """The requests (span requests then event requests) and, by request key, the
        captured prompts."""
        prompts: dict[str, list[Any]] = {}
        self.links.finish()
        agent_of: dict[int, tuple[str, int | None]] = {}  # agent span -> (id, enclosing agent)
        llm = sorted((s for s in self.kept.values() if s.kind == "llm"), key=lambda s: (s.start, s.sid))
        placed: list[tuple[_Span, str, int | None]] = []  # span, session, its agent span
        for s in llm:
            ups = self._ancestors(s.sid)
            if ups is None:
                if s.sid not in self._cycles:  # once, however often the trace is built
                    self._cycles.add(s.sid)
                    self.problem(f"span {s.sid} ({s.name}): its parent ids form a cycle: "
                                 "imported outside any agent, in its trace's session")
                ups = []
            agents = [u for u in ups if u in self.kept and self.kept[u].kind == "agent"]
            session = s.session or next((self.kept[u].session for u in ups if u in self.kept
                                         and self.kept[u].session), None) or s.trace
            agent_span = agents[0] if len(agents) > 1 else None
            if agent_span is not None and agent_span not in agent_of:
                a = self.kept[agent_span]
                agent_of[agent_span] = (f"{a.agent or 'agent'}-{a.sid[:8]}",
                                        agents[1] if len(agents) > 2 else None)
            placed.append((s, session, agent_span))
        items: list[tuple[Request, object]] = []  # (request, its stream: None is main)
        agent_ids: dict[object, str] = {}
        outer_of: dict[object, object] = {}
        end_of: dict[object, int] = {}
        for s, session, agent_span in placed:
            if agent_span is not None:
                agent_ids[agent_span], outer_of[agent_span] = agent_of[agent_span]
                end_of[agent_span] = self.kept[agent_span].end
            r = Request(session=session, key=s.sid, arrival_abs_ns=s.start,
                        input_tokens=s.n_in or 0, output_tokens=s.n_out or 0,
                        cached_tokens=s.cached, api="chat", model=s.model, ttft_ns=s.ttft_ns,
                        end_ns=s.end - s.start)
            if s.prompt:
                prompts[s.sid] = s.prompt
            items.append((r, agent_span))
        # log events: the main agent, and Claude Code's subagents where its events say so
        events = sorted(self.events, key=lambda r: (r.arrival_abs_ns, int(str(r.key))))
        uncached = uncached_sessions(events)
        self.n_uncached_sessions = len(uncached)
        stream_of = self._claude_streams(agent_ids, outer_of, end_of)
        for e in events:
            r = replace(e, key=f"event-{e.key}")  # the collector's own stay as read
            if "cache_parts" in r.extra and r.session in uncached:
                parts = r.extra["cache_parts"]
                assert isinstance(parts, tuple)
                r.input_tokens += int(parts[0]) + int(parts[1])
            items.append((r, stream_of.get(int(str(e.key)))))
        items.sort(key=lambda it: (it[0].arrival_abs_ns, str(it[0].key)))
        reqs = assemble(items, agent_ids, outer_of, end_of)
        return reqs, prompts


def assemble(items: list[tuple[Request, object]], agent_ids: dict[object, str],
             outer_of: dict[object, object], end_of: dict[object, int]) -> list[Request]:
    """Parents, dependencies, agent ids and think times of requests in arrival order, each
    in a stream (None: the main agent) of its session. Within a stream each request follows
    the one before; a request that arrives while every earlier one of its stream still
    runs goes side by side, in a lane of its own (agent id ``NAME/2``, ``/3``..., as the
    recorder names them); a later request continues the free lane whose last prompt it
    extends (the longest not longer than its own; else the first free) and waits for every
    other lane's last request that has ended. A subagent's
    first request is spawned by its enclosing stream's latest
    request, and the enclosing stream's first request after the subagent ended (``end_of``)
    waits for the subagent's last one."""
    last: dict[tuple[str, object], Request] = {}
    lanes: dict[tuple[str, object], list[Request]] = {}  # the last request of each lane
    joined: set[object] = set()  # keys some later request depends on
    pending: dict[tuple[str, object], list[object]] = {}  # subagents to join
    out: list[Request] = []
    for r, stream in items:
        key = (r.session, stream)
        first = key not in lanes
        lane = lanes.setdefault(key, [])
        free = [i for i, q in enumerate(lane) if q.arrival_abs_ns + (q.end_ns or 0)
                <= r.arrival_abs_ns]
        prev: Request | None = None
        if free:
            # the lane whose prompt this one extends (the longest not longer), else the first
            grown = [i for i in free if lane[i].input_tokens <= r.input_tokens]
            n = max(grown, key=lambda i: (lane[i].input_tokens, -i)) if grown else free[0]
            prev = lane[n]
            lane[n] = r
        else:  # every lane still running: one more lane, side by side
            n = len(lane)
            lane.append(r)
        deps: list[Request] = [prev] if prev is not None else []
        # the other lanes' ends this request has seen come back
        deps += [q for i, q in enumerate(lane) if i != n and q.key not in joined
                 and q.arrival_abs_ns + (q.end_ns or 0) <= r.arrival_abs_ns]
        parent = prev
        if stream is not None and first:
            outer = (r.session, outer_of.get(stream))
            spawner = last.get(outer)
            if spawner is not None:
                deps.append(spawner)
                parent = spawner
            pending.setdefault(outer, []).append(stream)
        waiting = pending.get(key, [])
        for sub in list(waiting):
            sub_last = last.get((r.session, sub))
            if sub_last is not None and end_of.get(sub, sub_last.arrival_abs_ns) <= r.arrival_abs_ns:
                deps.append(sub_last)
                waiting.remove(sub)
        r.agent_id = ("main" if stream is None else agent_ids[stream]) + \
            (f"/{n + 1}" if n else "")
        r.parent_key = parent.key if parent is not None else None
        r.depends_on_keys = [d.key for d in deps]
        joined.update(d.key for d in deps)
        ends = [d.arrival_abs_ns + (d.end_ns or 0) for d in deps]
        r.think_ns = max(0, r.arrival_abs_ns - max(ends)) if ends else None
        last[key] = r
        out.append(r)
    return out


def uncached_sessions(events: list[Request]) -> set[str]:
    """Sessions whose Claude Code ``input_tokens`` count the uncached part of the prompt
    alone (Anthropic's API), as opposed to the whole prompt (vLLM, and servers like it,
    report the whole prompt on the Messages API too). In arrival order, a request whose
    cache read is larger than its own ``input_tokens``, or than every earlier request's of
    its session (subagents interleave: any earlier prompt may hold the prefix), read more
    from the cache than a whole-prompt count allows: the counts are uncached. Where no
    request reads the cache the two readings agree."""
    out: set[str] = set()
    most: dict[str, int] = {}
    for r in events:
        parts = r.extra.get("cache_parts")
        if not isinstance(parts, tuple):
            continue
        read = int(parts[0])
        if read > r.input_tokens or read > most.get(r.session, read):
            out.add(r.session)
        most[r.session] = max(most.get(r.session, 0), r.input_tokens)
    return out


def span_key(span_id: str) -> int:
    """A span id (16 hex digits) as an unsigned 64-bit int; any other string hashed to one."""
    if len(span_id) <= 16:
        try:
            return int(span_id, 16)
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(span_id.encode(), digest_size=8).digest(), "little")


class ParentLinks:
    """Span -> parent span, 16 bytes a link (two ``uint64`` arrays, sorted once read), not
    a dict of strings: a file of a million spans keeps 16 MB of links, every span's, so
    that a request finds its agent through spans of any other kind."""

    def __init__(self) -> None:
        self._child = array("Q")
        self._parent = array("Q")
        self._keys: np.ndarray | None = None
        self._vals: np.ndarray | None = None

    def add(self, child: int, parent: int) -> None:
        self._child.append(child)
        self._parent.append(parent)
        self._keys = None

    def finish(self) -> None:
        keys = np.frombuffer(self._child, dtype=np.uint64) if self._child else \
            np.zeros(0, np.uint64)
        vals = np.frombuffer(self._parent, dtype=np.uint64) if self._parent else \
            np.zeros(0, np.uint64)
        order = np.argsort(keys, kind="stable")
        self._keys, self._vals = keys[order], vals[order]

    def parent(self, child: int) -> int | None:
        if self._keys is None:
            self.finish()
        assert self._keys is not None and self._vals is not None
        i = int(np.searchsorted(self._keys, np.uint64(child)))
        if i < len(self._keys) and int(self._keys[i]) == child:
            return int(self._vals[i])
        return None


def _int(a: dict[str, Any], key: str) -> int | None:
    v = a.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        n = int(v) if not isinstance(v, float) else (int(v) if v == int(v) else None)
    except (TypeError, ValueError):
        return None
    return n if n is not None and n >= 0 else None


def _num(a: dict[str, Any], key: str) -> float | None:
    v = a.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _str(a: dict[str, Any], key: str) -> str | None:
    v = a.get(key)
    return v if isinstance(v, str) and v else None


def _event_time(rec: dict[str, Any], a: dict[str, Any], where: str) -> int | None:
    ts = a.get("event.timestamp")
    if isinstance(ts, str):
        try:
            return parse_iso_ns(ts, where, None, "event.timestamp")
        except TraceError:
            pass  # an unreadable stamp: the record's own time
    return nanos(rec.get("timeUnixNano")) or nanos(rec.get("observedTimeUnixNano"))


def _loads(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return v
    return v


def _gen_ai_messages(a: dict[str, Any]) -> list[Any] | None:
    """Chat messages from ``gen_ai.system_instructions`` and ``gen_ai.input.messages``
    (each a JSON string or a structured value), or None when not captured."""
    msgs = _loads(a.get("gen_ai.input.messages"))
    if not isinstance(msgs, list) or not msgs:
        return None
    out: list[Any] = []
    system = _loads(a.get("gen_ai.system_instructions"))
    if system:
        out.append({"role": "system", "content": _parts_text(system)})
    for m in msgs:
        if isinstance(m, dict):
            out.append({"role": m.get("role"), "content": _parts_text(m.get("parts", m.get("content")))})
    return out


def _parts_text(parts: Any) -> Any:
    """Text parts as their text; others as they are (hashed as their JSON)."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return [p.get("content") if isinstance(p, dict) and p.get("type") == "text"
                and isinstance(p.get("content"), str) else p for p in parts]
    return parts


def _openinference_messages(a: dict[str, Any]) -> list[Any] | None:
    """``llm.input_messages.<i>.message.*`` gathered into messages, or None."""
    prefix = "llm.input_messages."
    by_index: dict[int, dict[str, Any]] = {}
    for k, v in a.items():
        if not k.startswith(prefix):
            continue
        idx, _, rest = k[len(prefix):].partition(".")
        if not idx.isdigit():
            continue
        rest = rest.removeprefix("message.")
        by_index.setdefault(int(idx), {})[rest] = v
    if not by_index:
        return None
    out: list[Any] = []
    for i in sorted(by_index):
        m = by_index[i]
        msg: dict[str, Any] = {"role": m.pop("role", None), "content": m.pop("content", None)}
        if m:
            msg["more"] = dict(sorted(m.items()))
        out.append(msg)
    return out


def collect(paths: Iterable[Path]) -> Collector:
    """Every export request of ``paths`` fed to a collector, a line at a time."""
    c = Collector()
    for p in paths:
        if not head_bytes(p, 1):
            raise fail(p, None, "empty file")
        try:
            for line, obj in read_exports(p):
                if isinstance(obj, str):
                    c.problem(f"{p.name} line {line}: {obj}: skipped")
                else:
                    c.add(obj, f"{p.name} line {line}")
        except OSError as exc:
            raise fail(p, None, f"cannot read ({exc.strerror})") from exc
    return c


def result(c: Collector, bs: int, name_files: list[str], where: str,
           prompt_hasher: Callable[[int], Any] | None = None) -> ImportResult:
    """The trace of a collector's requests, hash ids from content or cache counts."""
    reqs, prompts = c.requests()
    if not reqs:
        what = ("metrics only: export traces (GenAI or OpenInference spans) or logs "
                "(Claude Code / Codex events)") if c.n_metrics else \
            "no LLM spans (gen_ai.operation.name chat/text_completion/generate_content, " \
            "openinference.span.kind LLM) and no api_request events"
        detail = f"; first problem: {c.problems[0]}" if c.problems else ""
        raise fail(where, None, f"{what}{detail}")
    ways = assign_hashes(reqs, prompts, bs, prompt_hasher)
    n_content = ways["content"]
    table, start = build_table(reqs)
    hashed_from = " and ".join(k for k, n in ways.items() if n)
    meta = TraceMeta(block_size=bs, source=f"imported:{NAME}", start_wall_ns=start,
                     content_mode="hashed" if n_content else "none",
                     extra={"imported_from": name_files, "hash_ids_from": hashed_from})
    subagents = {(r.session, r.agent_id) for r in reqs if r.agent_id not in (None, "main")}
    notes = [
        f"sources: {', '.join(sorted(c.sources))}; {c.n_spans:,} spans read",
        f"{len(subagents)} subagents (invoke_agent / AGENT spans under another agent); "
        f"{c.n_tools:,} tool spans (their time is the think time before the next request)",
        f"hash ids from {hashed_from}: {n_content:,} requests from the captured prompt, "
        f"{ways['cache counts']:,} from cache counts (each request's cached tokens are its "
        f"parent's leading blocks), {ways['token counts']:,} from token counts alone (no "
        "cache count: the context taken as append-only)",
    ]
    if any(r.api == "responses" for r in reqs):
        notes.append("Codex events name no agent: one stream per session")
    if c.n_flat_sessions:
        notes.append(f"{c.n_flat_sessions} Claude Code sessions ran subagents side by side, "
                     "which its events do not tell apart: one stream each")
    claude = {r.session for r in reqs if r.api == "messages" and str(r.key).startswith("event-")}
    if claude:
        notes.append(f"Claude Code input_tokens: the uncached part (Anthropic's API: cache "
                     f"reads and writes added) in {c.n_uncached_sessions} sessions, the whole "
                     f"prompt (a vLLM-like server) in {len(claude) - c.n_uncached_sessions}")
    if prompts and not n_content:
        notes.append(f"{len(prompts):,} requests carry their prompt, unused: no content hasher")
    if c.n_problems:
        notes.append(f"{c.n_problems:,} problems, the rest imported:")
        notes += [f"  {p}" for p in c.problems]
        if c.n_problems > len(c.problems):
            notes.append(f"  ... and {c.n_problems - len(c.problems):,} more")
    return ImportResult(table, meta, NAME, notes)


def assign_hashes(reqs: list[Request], prompts: dict[str, list[Any]], bs: int,
                  prompt_hasher: Callable[[int], Any] | None) -> dict[str, int]:
    """Set every request's hash ids: from its captured prompt (with ``prompt_hasher``),
    else from its cache count (``hashing.cached_prefix_hashes``), else from token counts
    alone (``hashing.chain_hashes``). Returns how many requests each way."""
    ways = {"content": 0, "cache counts": 0, "token counts": 0}
    n = 0
    if prompt_hasher is not None and prompts:
        hasher = prompt_hasher(bs)
        # in the order the requests finished, as the recorder's flush does
        for r in sorted((r for r in reqs if r.key in prompts),
                        key=lambda r: r.arrival_abs_ns + (r.end_ns or 0)):
            ids, _ = hasher.hash_ids("chat", {"messages": prompts[str(r.key)]}, r.input_tokens)
            r.hash_ids = ids
            n += 1
    by_key = {(r.session, r.key): r for r in reqs}
    for r in sorted(reqs, key=lambda r: r.arrival_abs_ns):
        if r.hash_ids is not None:
            continue
        p = by_key.get((r.session, r.parent_key)) if r.parent_key is not None else None
        tag = f"{r.session}#{r.key}"
        if r.cached_tokens is None:
            r.hash_ids = chain_hashes(p.hash_ids if p else None, p.input_tokens if p else None,
                                      r.input_tokens, None, bs, tag)
            ways["token counts"] += 1
        else:
            r.hash_ids = cached_prefix_hashes(p.hash_ids if p else None, r.cached_tokens,
                                              r.input_tokens, bs, tag, f"shared#{r.model}")
            ways["cache counts"] += 1
    ways["content"] = n
    return ways


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    return result(collect(paths), bs, [p.name for p in paths], str(paths[0]), opts.prompt_hasher)
