"""OpenTelemetry exports in OTLP JSON (the Collector's file exporter, one export request a
line, or one OTLP/HTTP JSON body): LLM spans of the GenAI semantic conventions, of
OpenInference and of Claude Code's enhanced telemetry, and the API-request log events of
Claude Code and Codex. What each convention's attributes mean is in ``otel_spans``; the
agent tree is built by ``otel_tree``.

Spans:

* a request is a span whose ``gen_ai.operation.name`` is ``chat``, ``text_completion`` or
  ``generate_content``, whose ``openinference.span.kind`` is ``LLM``, or Claude Code's
  ``claude_code.llm_request``; ``end_ns`` = span end - arrival; ``ttft_ns`` from
  ``gen_ai.response.time_to_first_chunk`` (seconds), OpenInference's ``First Token Stream
  Event`` or Claude Code's ``ttft_ms``;
* arrival = when the request left the client: the start of the request span's HTTP client
  child span (an ``http.request.method`` CLIENT span, as HTTP instrumentations such as
  opentelemetry-instrumentation-httpx make; the last, after retries), else Claude Code's
  last ``gen_ai.request.attempt`` event, else the span's start, which comes before the
  client has built and sent the request;
* ``input_tokens`` = ``gen_ai.usage.input_tokens`` / ``llm.token_count.prompt`` (cache reads
  and writes included, as both conventions say; a count below its cache parts is taken as
  excluding them and they are added), ``output_tokens`` = ``gen_ai.usage.output_tokens`` /
  ``llm.token_count.completion``, ``cached_tokens`` = ``gen_ai.usage.cache_read.input_tokens``
  / ``llm.token_count.prompt_details.cache_read``; Claude Code's spans as its events below;
* session = ``gen_ai.conversation.id`` (OpenInference, Claude Code: ``session.id``) of the
  span or its nearest ancestor that has one, else the trace id;
* agents: ``invoke_agent`` spans (OpenInference ``AGENT``). A request belongs to its nearest
  agent ancestor; the outermost agent (or none) is ``main``, an agent under another agent
  is a subagent (schema v2), spawned by the enclosing agent's latest request before it
  started and joined by that agent's first request after it ended. Claude Code's spans
  name their agent (``agent_id``, ``parent_agent_id``; none: the main agent);
* within an agent, each request follows the one before (``parent_index``); ``think_ns`` =
  arrival - the latest dependency's end: tool time (``execute_tool`` / ``TOOL`` spans) or
  the user's time.

Log events, one request each: Claude Code's ``claude_code.api_request`` (``input_tokens``,
plus ``cache_read_tokens`` + ``cache_creation_tokens`` where the session's counts are
Anthropic's uncached part, ``otel_tree.uncached_sessions``; ``cached_tokens`` = cache reads,
end = ``event.timestamp``, arrival = end - ``duration_ms``, both in whole milliseconds,
session = ``session.id``); Codex's ``codex.sse_event`` of kind ``response.completed``
(``input_token_count`` including ``cached_token_count``; arrival = the conversation's latest
``codex.api_request`` minus its ``duration_ms``, session = ``conversation.id``). A Claude
Code session that also sent its spans is read from the spans alone, except that a span its
event calls a side request (``query_source``, which 2.1.1xx's spans lack) is one. Codex's
events name no
agent: one stream per session; Claude Code's subagents from the order of its events
(``otel_tree.claude_streams``).

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

from agent_replay.traces.builder import Request, build_table
from agent_replay.traces.hashing import cached_prefix_hashes, chain_hashes
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    head_bytes,
)
from agent_replay.traces.importers.otel_spans import (
    LLM_OPERATIONS,
    SIDE_SOURCES,
    Convention,
    Span,
    agent_name,
    classify,
    int_attr,
    num_attr,
    record_time,
    str_attr,
)
from agent_replay.traces.importers.otel_tree import (
    Mark,
    assemble,
    claude_streams,
    uncached_sessions,
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
MAX_PROBLEM_LINES = 20
"""Problems listed one line each in the notes; past this many, a count."""
AGENT_TOOLS = ("Agent", "Task")
"""Claude Code's tools that run a subagent."""
CLAUDE_REQUEST = "claude_code.api_request"
AGENT_CALL_EVENTS = {
    "tool_decision",
    "claude_code.tool_decision",
    "tool_result",
    "claude_code.tool_result",
}
RESULT_EVENTS = {"tool_result", "claude_code.tool_result"}
SIDE_MATCH_NS = 1_000_000_000
"""A Claude Code span and its ``api_request`` event end this close (the event's time is
whole milliseconds, logged after the span ends)."""

__all__ = [
    "BLOCK_SIZE",
    "LLM_OPERATIONS",
    "NAME",
    "Collector",
    "collect",
    "load",
    "result",
    "sniff",
]


def sniff(path: Path, head: bytes) -> bool:
    return looks_like_otlp(head)


def _order(a: dict[str, Any], ts: int) -> tuple[int, int]:
    """Claude Code's ``event.sequence`` (its own order), then the time."""
    seq = int_attr(a, "event.sequence")
    return (seq if seq is not None else -1, ts)


def _event_names(rec: dict[str, Any], a: dict[str, Any]) -> set[Any]:
    body = rec.get("body")
    return {
        rec.get("eventName"),
        a.get("event.name"),
        body.get("stringValue") if isinstance(body, dict) else None,
    }


@dataclass
class _Streams:
    """The agent streams of a trace being assembled (see ``otel_tree.assemble``)."""

    agent_ids: dict[object, str] = field(default_factory=dict)
    outer_of: dict[object, object] = field(default_factory=dict)
    end_of: dict[object, int] = field(default_factory=dict)


@dataclass
class Collector:
    """Spans and log events of OTLP export requests, fed one request at a time
    (``add``), turned into requests at the end (``requests``). Spans that are neither
    requests, agents nor tools leave only their parent link."""

    links: ParentLinks = field(default_factory=lambda: ParentLinks())
    kept: dict[int, Span] = field(default_factory=dict)
    """Request and agent spans by ``span_key`` of their id."""
    http: ChildStarts = field(default_factory=lambda: ChildStarts())
    """HTTP client spans: their parents and start times."""
    events: list[Request] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    n_problems: int = 0
    n_spans: int = 0
    n_tools: int = 0
    n_metrics: int = 0
    _codex_sent: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """By conversation: its latest ``codex.api_request``'s send time and its span."""
    endpoint_starts: dict[int, int] = field(default_factory=dict)
    """Codex's endpoint spans (``api.path``, e.g. ``/responses``): start by span key."""
    sources: set[str] = field(default_factory=set)
    _cycles: set[str] = field(default_factory=set)
    _marks: list[Mark] = field(default_factory=list)
    """Claude Code events in a session's order: requests, subagent spawns and returns."""
    n_flat_sessions: int = 0
    n_uncached_sessions: int = 0
    n_http_sent: int = 0
    _named_sessions: set[str] = field(default_factory=set)
    """Claude Code sessions whose events name their agent (``agent_id``)."""
    n_endpoint_sent: int = 0

    def problem(self, line: str) -> None:
        self.n_problems += 1
        if len(self.problems) < MAX_PROBLEM_LINES:
            self.problems.append(line)

    def add(self, export: dict[str, Any], where: str) -> None:
        if "resourceMetrics" in export:
            self.n_metrics += 1
        for _, sp in spans(export):
            self._span(sp, where)
        for _, rec in log_records(export):
            self._log(rec, where)

    # spans

    def _span(self, sp: dict[str, Any], where: str) -> None:
        self.n_spans += 1
        sid = _span_id(sp)
        if sid is None:
            self.problem(f"{where}: a span without spanId/traceId: skipped")
            return
        key = span_key(sid)
        parent = sp.get("parentSpanId")
        parent_key = span_key(parent) if isinstance(parent, str) and parent else None
        if parent_key is not None:
            self.links.add(key, parent_key)
        a = attributes(sp.get("attributes"))
        kind, convention = classify(a, sp)
        if kind in ("llm", "agent"):
            self._keep(key, kind, convention, sp, a, _label(where, sid, str(sp.get("name") or "")))
        elif kind is not None:
            self._mark_time(kind, key, parent_key, nanos(sp.get("startTimeUnixNano")))

    def _mark_time(self, kind: str, key: int, parent_key: int | None, start: int | None) -> None:
        """What a tool, HTTP client or endpoint span leaves: a count, or its start (an HTTP
        client span's for its parent request span)."""
        if kind == "tool":
            self.n_tools += 1
        elif start is None:
            return
        elif kind == "http" and parent_key is not None:
            self.http.add(parent_key, start)
        elif kind == "endpoint":
            self.endpoint_starts[key] = start

    def _keep(
        self,
        key: int,
        kind: str,
        convention: Convention | None,
        sp: dict[str, Any],
        a: dict[str, Any],
        label: str,
    ) -> None:
        """Keep an agent span, or a request span with its counts."""
        s = self._timed(kind, sp, a, label)
        if s is not None and (convention is None or self._counted(s, convention, a, sp, label)):
            self.kept[key] = s

    def _http(self, sp: dict[str, Any], parent_key: int | None) -> None:
        start = nanos(sp.get("startTimeUnixNano"))
        if parent_key is not None and start is not None:
            self.http.add(parent_key, start)

    def _timed(self, kind: str, sp: dict[str, Any], a: dict[str, Any], label: str) -> Span | None:
        """The span with its times, session and agent name; None (a problem) when its
        times are missing or run backwards."""
        start, end = nanos(sp.get("startTimeUnixNano")), nanos(sp.get("endTimeUnixNano"))
        if start is None or end is None:
            self.problem(f"{label}: no start or end time: skipped")
            return None
        if end < start:
            self.problem(f"{label}: ends {(start - end) / 1e6:.3f} ms before it starts: skipped")
            return None
        session = a.get("gen_ai.conversation.id") or a.get("session.id")
        s = Span(
            str(sp["spanId"]),
            str(sp["traceId"]),
            kind,
            str(sp.get("name") or ""),
            start,
            end,
            session=session if isinstance(session, str) and session else None,
        )
        if kind == "agent":
            s.agent = agent_name(a)
        return s

    def _counted(
        self, s: Span, convention: Convention, a: dict[str, Any], sp: dict[str, Any], label: str
    ) -> bool:
        """Read a request span's counts; False (a problem) without input or output."""
        self.sources.add(convention.source)
        n_in, n_out, read, write = convention.read(s, a, sp)
        if n_in is None or n_out is None:
            missing = [k for k, v in (("input", n_in), ("output", n_out)) if v is None]
            self.problem(f"{label}: no {' or '.join(missing)} token count: skipped")
            return False
        parts = (read or 0) + (write or 0)
        if s.cache_parts is None and n_in < parts:
            n_in += parts  # a count of the uncached part alone
        s.n_in, s.n_out, s.cached = n_in, n_out, read
        return True

    # log events

    def _log(self, rec: dict[str, Any], where: str) -> None:
        a = attributes(rec.get("attributes"))
        names = _event_names(rec, a)
        ts = record_time(rec, a, where)
        if CLAUDE_REQUEST in names or ("api_request" in names and "cache_read_tokens" in a):
            self.sources.add("claude-code events")
            self._claude(a, ts, where)
        elif names & AGENT_CALL_EVENTS and a.get("tool_name") in AGENT_TOOLS:
            self._agent_call(a, ts, bool(names & RESULT_EVENTS))
        elif "codex.api_request" in names:
            self._codex_request(a, ts, rec.get("spanId"))
        elif "codex.sse_event" in names and a.get("event.kind") == "response.completed":
            self.sources.add("codex events")
            self._codex(a, ts, where)

    def _codex_request(self, a: dict[str, Any], ts: int | None, span: Any) -> None:
        """Codex's ``api_request``: when its conversation's next response was sent, and
        the endpoint span it was logged in (where Codex exports its traces too)."""
        conv, dur = str_attr(a, "conversation.id"), num_attr(a, "duration_ms")
        if conv is not None and ts is not None and dur is not None:
            key = span_key(span) if isinstance(span, str) and span else None
            self._codex_sent[conv] = (ts - int(dur * 1e6), key)

    def _agent_call(self, a: dict[str, Any], ts: int | None, done: bool) -> None:
        """An accepted Agent call opens a subagent (``tool_decision``) or closes it
        (``tool_result``)."""
        sess, tid = str_attr(a, "session.id"), str_attr(a, "tool_use_id")
        if (
            sess is not None
            and tid is not None
            and ts is not None
            and a.get("decision", "accept") == "accept"
        ):
            self._marks.append(
                Mark(sess, _order(a, ts), ts, "done" if done else "spawn", tid, None)
            )

    def _claude(self, a: dict[str, Any], ts: int | None, where: str) -> None:
        checked = self._claude_checked(a, ts, _event_label(where, a))
        if checked is None:
            return
        sess, ts, n_in, n_out, dur = checked
        read = int_attr(a, "cache_read_tokens") or 0
        write = int_attr(a, "cache_creation_tokens") or 0
        span = int((dur or 0) * 1e6)
        source = str_attr(a, "query_source") or ""
        sub = str_attr(a, "agent.name") or (source[6:] if source.startswith("agent:") else None)
        self._marks.append(Mark(sess, _order(a, ts), ts, "request", len(self.events), sub))
        extra: dict[str, object] = {"cache_parts": (read, write), "side": source in SIDE_SOURCES}
        if self._named_agent(a, extra):
            self._named_sessions.add(sess)
        self.events.append(
            Request(
                session=sess,
                key=len(self.events),
                arrival_abs_ns=ts - span,
                input_tokens=n_in,
                output_tokens=n_out,
                cached_tokens=read,
                api="messages",
                model=str_attr(a, "model"),
                end_ns=span if dur is not None else None,
                extra=extra,
            )
        )

    @staticmethod
    def _named_agent(a: dict[str, Any], extra: dict[str, object]) -> bool:
        """Claude Code 2.1.3xx names the agent of a request (``agent_id``, with
        ``parent_agent_id`` for a nested one): kept in ``extra``; False when not named."""
        agent = str_attr(a, "agent_id")
        if agent is None:
            return False
        extra["agent_ids"] = (agent, str_attr(a, "parent_agent_id"))
        return True

    def _claude_checked(
        self, a: dict[str, Any], ts: int | None, label: str
    ) -> tuple[str, int, int, int, float | None] | None:
        """(session, time, input, output, duration_ms) of an api_request event, or None
        (a problem) when one of them is missing or the duration negative."""
        sess = str_attr(a, "session.id")
        n_in, n_out = int_attr(a, "input_tokens"), int_attr(a, "output_tokens")
        if n_in is None or n_out is None:
            self.problem(f"{label}: no input or output token count: skipped")
            return None
        if ts is None or sess is None:
            self.problem(f"{label}: no timestamp or session.id: skipped")
            return None
        dur = num_attr(a, "duration_ms")
        if dur is not None and dur < 0:
            self.problem(f"{label}: negative duration_ms {dur}: skipped")
            return None
        return sess, ts, n_in, n_out, dur

    def _codex(self, a: dict[str, Any], ts: int | None, where: str) -> None:
        conv = str_attr(a, "conversation.id")
        label = f"{where}: response.completed event"
        n_in, n_out = int_attr(a, "input_token_count"), int_attr(a, "output_token_count")
        if n_in is None or n_out is None:
            self.problem(f"{label}: no input or output token count: skipped")
            return
        if ts is None or conv is None:
            self.problem(f"{label}: no timestamp or conversation.id: skipped")
            return
        sent, span = self._codex_sent.pop(conv, (None, None))
        arrival = sent if sent is not None and sent <= ts else ts
        cached = int_attr(a, "cached_token_count")
        self.events.append(
            Request(
                session=conv,
                key=len(self.events),
                arrival_abs_ns=arrival,
                input_tokens=n_in,
                output_tokens=n_out,
                cached_tokens=min(cached, n_in) if cached is not None else None,
                api="responses",
                model=str_attr(a, "model"),
                end_ns=ts - arrival,
                extra={"send_span": span} if span is not None else {},
            )
        )

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

    def requests(self) -> tuple[list[Request], dict[str, list[Any]]]:
        """The requests (span requests then event requests) and, by request key, the
        captured prompts."""
        prompts: dict[str, list[Any]] = {}
        self.links.finish()
        st = _Streams()
        items = self._span_items(st, prompts)
        claude_span_sessions = {r.session for r, _ in items if "cache_parts" in r.extra}
        self._sides_from_events([r for r, _ in items], claude_span_sessions)
        items += self._event_items(st, claude_span_sessions)
        uncached = uncached_sessions(
            [
                r
                for r, _ in sorted(items, key=lambda it: it[0].arrival_abs_ns)
                if "cache_parts" in r.extra
            ]
        )
        self.n_uncached_sessions = len(uncached)
        for r, _ in items:
            parts = r.extra.get("cache_parts")
            if isinstance(parts, tuple) and r.session in uncached:
                r.input_tokens += int(parts[0]) + int(parts[1])
        items.sort(key=_item_order)
        return assemble(items, st.agent_ids, st.outer_of, st.end_of), prompts

    def _sides_from_events(self, reqs: list[Request], sessions: set[str]) -> None:
        """Claude Code spans whose ``api_request`` event calls them side requests (its
        ``query_source``; 2.1.1xx's spans carry none): the span of the event's session with
        the same token counts that ended nearest the event, within ``SIDE_MATCH_NS``."""
        by_counts: dict[tuple[object, ...], list[Request]] = {}
        for req in reqs:
            if "cache_parts" in req.extra and not req.extra.get("side"):
                by_counts.setdefault(_counts_key(req), []).append(req)
        for event in self.events:
            if event.session not in sessions or not event.extra.get("side"):
                continue
            end = event.arrival_abs_ns + (event.end_ns or 0)
            near = min(
                by_counts.get(_counts_key(event), ()),
                key=lambda r: abs(r.arrival_abs_ns + (r.end_ns or 0) - end),
                default=None,
            )
            if near is not None and abs(near.arrival_abs_ns + (near.end_ns or 0) - end) <= (
                SIDE_MATCH_NS
            ):
                near.extra["side"] = True

    def _place(self, s: Span) -> tuple[str, int | None, int | None]:
        """A request span's session, its agent span (None: the main agent) and that
        agent's enclosing agent span."""
        ups = self._ancestors_or_none(s)
        agents = [u for u in ups if u in self.kept and self.kept[u].kind == "agent"]
        session = s.session or self._ancestor_session(ups) or s.trace
        agent_span = agents[0] if len(agents) > 1 else None
        return session, agent_span, (agents[1] if len(agents) > 2 else None)

    def _ancestor_session(self, ups: list[int]) -> str | None:
        """The session of the nearest ancestor span that names one."""
        return next(
            (self.kept[u].session for u in ups if u in self.kept and self.kept[u].session), None
        )

    def _ancestors_or_none(self, s: Span) -> list[int]:
        """``_ancestors``, none on a cycle (a problem, named once however often the trace
        is built)."""
        ups = self._ancestors(s.sid)
        if ups is not None:
            return ups
        if s.sid not in self._cycles:
            self._cycles.add(s.sid)
            self.problem(
                f"span {s.sid} ({s.name}): its parent ids form a cycle: "
                "imported outside any agent, in its trace's session"
            )
        return []

    def _span_items(
        self, st: _Streams, prompts: dict[str, list[Any]]
    ) -> list[tuple[Request, object]]:
        items: list[tuple[Request, object]] = []  # (request, its stream: None is main)
        self.n_http_sent = 0
        llm = sorted(
            (s for s in self.kept.values() if s.kind == "llm"), key=lambda s: (s.start, s.sid)
        )
        sent = self.http.latest({span_key(s.sid) for s in llm})
        for s in llm:
            session, agent_span, outer = self._place(s)
            stream: object = agent_span
            if s.stream is not None:
                stream = _claude_stream(st, session, s.stream)
            elif agent_span is not None:
                a = self.kept[agent_span]
                st.agent_ids.setdefault(agent_span, f"{a.agent or 'agent'}-{a.sid[:8]}")
                st.outer_of.setdefault(agent_span, outer)
                st.end_of[agent_span] = a.end
            items.append((self._span_request(s, session, sent.get(span_key(s.sid))), stream))
            if s.prompt:
                prompts[s.sid] = s.prompt
        return items

    def _span_request(self, s: Span, session: str, http: int | None) -> Request:
        """A request span as a request: sent when its HTTP client child started (``http``)
        or its own attempt event says, else when it started."""
        sent = http if http is not None else s.sent
        if sent is not None and s.start <= sent <= s.end:
            self.n_http_sent += http is not None
        else:
            sent = s.start
        ttft = max(0, s.start + s.ttft_ns - sent) if s.ttft_ns is not None else None
        r = Request(
            session=session,
            key=s.sid,
            arrival_abs_ns=sent,
            input_tokens=s.n_in or 0,
            output_tokens=s.n_out or 0,
            cached_tokens=s.cached,
            api="messages" if s.cache_parts else "chat",
            model=s.model,
            ttft_ns=ttft,
            end_ns=s.end - sent,
        )
        if s.cache_parts is not None:
            r.extra["cache_parts"] = s.cache_parts
        if s.side:
            r.extra["side"] = True
        return r

    def _event_items(self, st: _Streams, skip: set[str]) -> list[tuple[Request, object]]:
        """Log-event requests: the main agent, and Claude Code's subagents where its events
        say so; none of the sessions in ``skip`` (their spans say more)."""
        events = sorted(
            (e for e in self.events if e.session not in skip),
            key=lambda r: (r.arrival_abs_ns, int(str(r.key))),
        )
        self.n_endpoint_sent = 0
        stream_of, self.n_flat_sessions = claude_streams(
            [m for m in self._marks if m.session not in skip | self._named_sessions],
            st.agent_ids,
            st.outer_of,
            st.end_of,
        )
        # the collector's own stay as read
        return [
            (
                self._endpoint_sent(replace(e, key=f"event-{e.key}", extra=dict(e.extra))),
                self._event_stream(st, e, stream_of),
            )
            for e in events
        ]

    def _event_stream(self, st: _Streams, e: Request, stream_of: dict[int, object]) -> object:
        """An event request's stream: the agent its event names (``agent_id``, Claude Code
        2.1.3xx; none in a session where others do: the main agent), else the one its
        session's order of events gives."""
        ids = e.extra.get("agent_ids")
        if isinstance(ids, tuple):
            return _claude_stream(st, e.session, ids)
        return None if e.session in self._named_sessions else stream_of.get(int(str(e.key)))

    def _endpoint_sent(self, r: Request) -> Request:
        """A Codex request sent when its endpoint span started, where that span came."""
        span = r.extra.pop("send_span", None)
        start = self.endpoint_starts.get(span) if isinstance(span, int) else None
        end = r.arrival_abs_ns + (r.end_ns or 0)
        if start is not None and r.arrival_abs_ns - 1_000_000_000 <= start <= end:
            r.arrival_abs_ns, r.end_ns = start, end - start
            self.n_endpoint_sent += 1
        return r


def _counts_key(req: Request) -> tuple[object, ...]:
    return (
        req.session,
        req.input_tokens,
        req.output_tokens,
        req.cached_tokens,
        req.extra.get("cache_parts"),
    )


def _item_order(it: tuple[Request, object]) -> tuple[int, str]:
    return it[0].arrival_abs_ns, str(it[0].key)


def _claude_stream(st: _Streams, session: str, ids: tuple[str, str | None]) -> object:
    """The stream of a Claude Code span that names its agent (``agent_id``): a subagent
    of ``parent_agent_id``'s stream, or of the main agent."""
    agent, parent = ids
    key = (session, "agent", agent)
    if key not in st.agent_ids:
        st.agent_ids[key] = f"agent-{agent[-8:]}"
        st.outer_of[key] = (session, "agent", parent) if parent else None
    return key


def _event_label(where: str, a: dict[str, Any]) -> str:
    prompt = a.get("prompt.id")
    return f"{where}: api_request event" + (f" (prompt {prompt})" if prompt else "")


def _span_id(sp: dict[str, Any]) -> str | None:
    """The span's id, None when it or its trace id is missing."""
    sid, tid = sp.get("spanId"), sp.get("traceId")
    return sid if isinstance(sid, str) and sid and isinstance(tid, str) else None


def _label(where: str, sid: str, name: str) -> str:
    return f"{where}: span {sid} ({name})" if name else f"{where}: span {sid}"


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
        keys = (
            np.frombuffer(self._child, dtype=np.uint64) if self._child else np.zeros(0, np.uint64)
        )
        vals = (
            np.frombuffer(self._parent, dtype=np.uint64) if self._parent else np.zeros(0, np.uint64)
        )
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


class ChildStarts:
    """Parent span -> the start of a child span, 16 bytes each (as ``ParentLinks``): every
    HTTP client span of an export may be kept, a million of them in 16 MB."""

    def __init__(self) -> None:
        self._parent = array("Q")
        self._start = array("Q")

    def add(self, parent: int, start: int) -> None:
        self._parent.append(parent)
        self._start.append(start)

    def latest(self, parents: set[int]) -> dict[int, int]:
        """The latest child start of each of ``parents`` that has a child."""
        if not self._parent or not parents:
            return {}
        par = np.frombuffer(self._parent, dtype=np.uint64)
        hit = np.flatnonzero(np.isin(par, np.fromiter(parents, np.uint64, len(parents))))
        out: dict[int, int] = {}
        for i in hit.tolist():
            p, t = int(self._parent[i]), int(self._start[i])
            out[p] = max(t, out.get(p, t))
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


def result(
    c: Collector,
    bs: int,
    name_files: list[str],
    where: str,
    prompt_hasher: Callable[[int], Any] | None = None,
) -> ImportResult:
    """The trace of a collector's requests, hash ids from content or cache counts."""
    reqs, prompts = c.requests()
    if not reqs:
        raise fail(where, None, _nothing(c))
    ways = assign_hashes(reqs, prompts, bs, prompt_hasher)
    table, start = build_table(reqs)
    hashed_from = " and ".join(k for k, n in ways.items() if n)
    meta = TraceMeta(
        block_size=bs,
        source=f"imported:{NAME}",
        start_wall_ns=start,
        content_mode="hashed" if ways["content"] else "none",
        extra={"imported_from": name_files, "hash_ids_from": hashed_from},
    )
    notes = _notes(c, reqs, ways, hashed_from) + _source_notes(c, reqs)
    if prompts and not ways["content"]:
        notes.append(f"{len(prompts):,} requests carry their prompt, unused: no content hasher")
    return ImportResult(table, meta, NAME, notes + _problem_notes(c))


def _nothing(c: Collector) -> str:
    """Why a collector made no request."""
    what = (
        (
            "metrics only: export traces (GenAI or OpenInference spans) or logs "
            "(Claude Code / Codex events)"
        )
        if c.n_metrics
        else "no LLM spans (gen_ai.operation.name chat/text_completion/generate_content, "
        "openinference.span.kind LLM) and no api_request events"
    )
    detail = f"; first problem: {c.problems[0]}" if c.problems else ""
    return f"{what}{detail}"


def _notes(c: Collector, reqs: list[Request], ways: dict[str, int], hashed_from: str) -> list[str]:
    subagents = {(r.session, r.agent_id) for r in reqs if r.agent_id not in (None, "main")}
    return [
        f"sources: {', '.join(sorted(c.sources))}; {c.n_spans:,} spans read",
        f"{len(subagents)} subagents (invoke_agent / AGENT spans under another agent, or "
        "named by Claude Code's agent_id); "
        f"{c.n_tools:,} tool spans (their time is the think time before the next request)",
        f"hash ids from {hashed_from}: {ways['content']:,} requests from the captured prompt, "
        f"{ways['cache counts']:,} from cache counts (each request's cached tokens are its "
        f"parent's leading blocks), {ways['token counts']:,} from token counts alone (no "
        "cache count: the context taken as append-only)",
    ]


def _source_notes(c: Collector, reqs: list[Request]) -> list[str]:
    notes = []
    if c.n_http_sent:
        notes.append(
            f"{c.n_http_sent:,} requests sent when their HTTP client span started "
            "(the rest: when their LLM span started)"
        )
    if c.n_endpoint_sent:
        notes.append(
            f"{c.n_endpoint_sent:,} Codex requests sent when the endpoint span their "
            "api_request event names started (the rest: its time - duration_ms)"
        )
    if any(r.api == "responses" for r in reqs):
        notes.append("Codex events name no agent: one stream per session")
    if c.n_flat_sessions:
        notes.append(
            f"{c.n_flat_sessions} Claude Code sessions ran subagents side by side, "
            "which its events do not tell apart: one stream each"
        )
    claude = {r.session for r in reqs if "cache_parts" in r.extra}
    if claude:
        notes.append(
            f"Claude Code input_tokens: the uncached part (Anthropic's API: cache "
            f"reads and writes added) in {c.n_uncached_sessions} sessions, the whole "
            f"prompt (a vLLM-like server) in {len(claude) - c.n_uncached_sessions}"
        )
    return notes


def _problem_notes(c: Collector) -> list[str]:
    if not c.n_problems:
        return []
    notes = [f"{c.n_problems:,} problems, the rest imported:", *(f"  {p}" for p in c.problems)]
    if c.n_problems > len(c.problems):
        notes.append(f"  ... and {c.n_problems - len(c.problems):,} more")
    return notes


def assign_hashes(
    reqs: list[Request],
    prompts: dict[str, list[Any]],
    bs: int,
    prompt_hasher: Callable[[int], Any] | None,
) -> dict[str, int]:
    """Set every request's hash ids: from its captured prompt (with ``prompt_hasher``),
    else from its cache count (``hashing.cached_prefix_hashes``), else from token counts
    alone (``hashing.chain_hashes``). Returns how many requests each way."""
    ways = {"content": 0, "cache counts": 0, "token counts": 0}
    if prompt_hasher is not None and prompts:
        ways["content"] = _content_hashes(reqs, prompts, prompt_hasher(bs))
    by_key = {(r.session, r.key): r for r in reqs}
    for r in sorted(reqs, key=lambda r: r.arrival_abs_ns):
        if r.hash_ids is None:
            p = by_key.get((r.session, r.parent_key)) if r.parent_key is not None else None
            ways[_count_hashes(r, p, bs)] += 1
    return ways


def _content_hashes(reqs: list[Request], prompts: dict[str, list[Any]], hasher: Any) -> int:
    """Hash ids from the captured prompts, in the order the requests finished (as the
    recorder's flush does); returns how many."""
    n = 0
    for r in sorted(
        (r for r in reqs if r.key in prompts), key=lambda r: r.arrival_abs_ns + (r.end_ns or 0)
    ):
        r.hash_ids, _ = hasher.hash_ids("chat", {"messages": prompts[str(r.key)]}, r.input_tokens)
        n += 1
    return n


def _count_hashes(r: Request, p: Request | None, bs: int) -> str:
    """Hash ids of ``r`` from its cache count (its parent ``p``'s leading blocks), else
    from token counts alone; returns which."""
    tag = f"{r.session}#{r.key}"
    if r.cached_tokens is None:
        r.hash_ids = chain_hashes(
            p.hash_ids if p else None, p.input_tokens if p else None, r.input_tokens, None, bs, tag
        )
        return "token counts"
    r.hash_ids = cached_prefix_hashes(
        p.hash_ids if p else None, r.cached_tokens, r.input_tokens, bs, tag, f"shared#{r.model}"
    )
    return "cache counts"


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    return result(collect(paths), bs, [p.name for p in paths], str(paths[0]), opts.prompt_hasher)
