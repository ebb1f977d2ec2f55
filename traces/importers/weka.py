"""The "weka" agentic trace format (SemiAnalysis InferenceX AgentX, WEKA kv-cache-tester),
replayed by NVIDIA AIPerf: one JSON object per trace (``.json``, or one per line in a
``.jsonl``), ``requests`` holding the main agent's calls with subagents inline
(``type: "subagent"``, their own ``requests``).

Two conventions share the name; each trace is classified and the summary names them:

* ``WEKA`` (kv-cache-tester): inner subagent ``t`` relative to the spawn, ``in`` the real
  prompt with ``len(hash_ids) == floor(in / block_size)``, ``input_types`` / ``stop`` present.
* ``SemiAnalysis`` (cc-traces-weka-*): inner ``t`` on the session clock, ``in`` a hashed
  count, hash ids from 0, no ``input_types`` / ``stop``.

A trace-level ``"convention"`` (``WEKA`` / ``SemiAnalysis``, written by ``traces convert
--to weka``) decides. Otherwise evidence for WEKA: request type fields, or an inner first
``t`` earlier than its subagent's ``t`` (AIPerf's rule: relative; AIPerf applies it to
every inner call, so a WEKA inner ``t`` at or after its subagent's ``t`` is absolute to AIPerf:
the summary counts such calls). Evidence for SemiAnalysis: an inner first
``t`` at or after a nonzero spawn ``t``, or (without type fields) hash ids starting at 0.
Evidence for both or for neither: the trace is refused.

Mapping: one session per trace (``id``); agent ``main`` for top-level calls, the subagent's
``agent_id`` inside; arrival = ``t`` on the session clock; ``end_ns`` = ``api_time``;
``ttft_ns`` = ``ttft`` (both null when absent, as on cut-off streams); prefix parent = the previous call of the same stream. Dependencies
as AIPerf derives them (``traces.tree.derive_depends_on``): a subagent is spawned off its
spawner's last call at or before its ``t``; the first later spawner call whose ``t`` is
at or after the subagent's end (``t + duration_ms``) joins it; none: a background branch.
``think_ns`` = arrival - the latest dependency's end, floored at 0 (end-to-start, as
AIPerf replays; the recorded ``think_time`` differs between conventions), a dependency
without ``api_time`` (its end unknown) ending at its start, as AIPerf counts it. Hash ids are
kept; the partial last block the format leaves unhashed gets a fresh negative id so that
``len(hash_ids) == ceil(in / block_size)``. ``tool_tokens + system_tokens`` of the trace and
of each subagent (the shared prefix before the first user turn) go to the metadata
(``extra.weka[].prefix_tokens``). Ids are local to a trace: the k-th trace of an
import (k >= 1) has ``k << 40`` added, so traces never share blocks by accident.

Flattened agents: calls of one stream (the top level or a subagent) that AIPerf's loader
tells apart as another agent by their hash ids (``weka_chains``) get their own agent id,
``fa:NNN`` on the top level and ``<subagent>:fa:NNN`` inside a subagent; the summary and
``extra.weka[].flattened`` name them with their call counts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agent_replay.errors import TraceError
from agent_replay.traces.builder import Request, build_table
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    file_contains,
    first_json_object,
)
from agent_replay.traces.importers.weka_chains import (
    ChainCall,
    detect,
    flat_agent_id,
    interval_waits,
)
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.tree import MAIN, derive_depends_on

NAME = "weka"
BLOCK_SIZE = 64
WEKA, SEMIANALYSIS = "WEKA", "SemiAnalysis"
TRACE_ID_SHIFT = 40
_TYPE_FIELDS = ("input_types", "output_types", "stop")


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with ``requests`` whose calls carry ``hash_ids`` and ``api_time``. The
    first call's prompt can be long enough (hash ids of a 700k-token prompt) that its
    ``api_time`` lies past ``head``: the rest of the file is then searched, a chunk at a
    time, up to ``SCAN_LIMIT``."""
    obj = first_json_object(head)
    if obj is not None:
        return isinstance(obj.get("requests"), list) and "id" in obj
    text = head.lstrip()
    if not (text.startswith((b"{", b"[")) and b'"requests"' in head and b'"hash_ids"' in head):
        return False
    return b'"api_time"' in head or file_contains(path, b'"api_time"', start=max(0, len(head) - 16))


class _Bad(Exception):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


@dataclass
class _Call:
    agent: str
    where: str
    t_ns: int
    obj: dict[str, Any]


@dataclass
class _Agent:
    agent: str
    spawner: str
    where: str
    spawn_ns: int
    end_ns: int | None
    flat: bool = False
    scope: str = ""  # a flattened agent's stream (the top level or a subagent)


def _num(obj: dict[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    v = obj.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise _Bad(where, f"field {key!r} must be a number >= 0, got {v!r}")
    return float(v)


def _all_ints(xs: list[Any], *, bools: bool = True) -> bool:
    """Whether every item is an int (``bools``: or a bool), checked at C speed: hash id
    lists hold millions of items in a corpus."""
    kinds = set(map(type, xs))
    return kinds <= ({int, bool} if bools else {int})


def _tail_id(*parts: object) -> int:
    """A fresh negative id (as the planner's synthesized ones) for a partial last block."""
    raw = "\x1f".join(str(p) for p in ("weka-tail", *parts)).encode()
    return -1 - (int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 2)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _first_inner_t(sub: dict[str, Any]) -> float | None:
    """The ``t`` of a subagent's first inner entry, when there is one and it is a number."""
    inner = sub.get("requests")
    if isinstance(inner, list) and inner and isinstance(inner[0], dict):
        t = inner[0].get("t")
        if isinstance(t, (int, float)):
            return t
    return None


def _subagent_id(r: dict[str, Any], where: str) -> str:
    sub = r.get("agent_id")
    if not isinstance(sub, str) or not sub:
        raise _Bad(where, "subagent without an 'agent_id' (dangling)")
    return sub


@dataclass
class _Evidence:
    """What a trace's entries say about its convention (see ``convention``)."""

    typed: bool = False
    relative: bool = False
    absolute: bool = False
    min_hash: int | None = None

    def walk(self, reqs: list[Any], where: str) -> None:
        for i, r in enumerate(reqs):
            w = f"{where}[{i}]"
            if not isinstance(r, dict):
                raise _Bad(w, "not a JSON object")
            if r.get("type") == "subagent":
                self._subagent(r, w)
            else:
                self._call(r)

    def _subagent(self, r: dict[str, Any], where: str) -> None:
        _subagent_id(r, where)
        inner = r.get("requests")
        if not isinstance(inner, list) or not inner:
            raise _Bad(f"{where}.requests", "a subagent with no requests (dangling)")
        t, first = r.get("t"), _first_inner_t(r)
        if isinstance(t, (int, float)) and first is not None:
            if first < t:
                self.relative = True
            elif t > 0:
                self.absolute = True
        self.walk(inner, f"{where}.requests")

    def _call(self, r: dict[str, Any]) -> None:
        self.typed = self.typed or any(k in r for k in _TYPE_FIELDS)
        h = r.get("hash_ids")
        if isinstance(h, list) and h and _all_ints(h):
            m = min(h)
            self.min_hash = m if self.min_hash is None else min(self.min_hash, m)

    def verdict(self) -> str:
        weka = self.typed or self.relative
        sa = self.absolute or (not self.typed and self.min_hash == 0)
        if weka != sa:
            return WEKA if weka else SEMIANALYSIS
        found = (
            ("type fields", self.typed),
            ("relative inner t", self.relative),
            ("absolute inner t", self.absolute),
            ("hash ids from 0", self.min_hash == 0),
        )
        why = (
            ("evidence for both (" + ", ".join(x for x, on in found if on) + ")")
            if weka
            else "no type fields, no subagent timing and hash ids not from 0"
        )
        raise _Bad("requests", f"cannot decide the convention (WEKA or SemiAnalysis): {why}")


def convention(trace: dict[str, Any]) -> str:
    """``WEKA`` or ``SemiAnalysis``; raises ``_Bad`` when the evidence is for both or neither."""
    evidence = _Evidence()
    evidence.walk(trace.get("requests") or [], "requests")
    declared = trace.get("convention")  # written by our exporter
    if declared in (WEKA, SEMIANALYSIS):
        return str(declared)
    return evidence.verdict()


def _flatten(trace: dict[str, Any], conv: str) -> tuple[list[_Call], list[_Agent]]:
    calls: list[_Call] = []
    agents: list[_Agent] = []
    seen: dict[str, str] = {MAIN: "requests"}

    def walk(reqs: Any, where: str, agent: str, base_ns: int) -> None:
        if not isinstance(reqs, list) or not reqs:
            raise _Bad(
                where,
                "a subagent with no requests (dangling)"
                if agent != MAIN
                else "field 'requests' must be a non-empty list",
            )
        last_t = -1
        for i, r in enumerate(reqs):
            w = f"{where}[{i}]"
            if not isinstance(r, dict):
                raise _Bad(w, "not a JSON object")
            t = _num(r, "t", w)
            assert t is not None
            t_ns = (base_ns + _ns(t)) if conv == WEKA else _ns(t)
            if t_ns < last_t:
                raise _Bad(w, "starts before the previous entry of its stream (t goes back)")
            last_t = t_ns
            if r.get("type") == "subagent":
                sub = _subagent_id(r, w)
                if sub in seen:
                    raise _Bad(
                        w,
                        f"subagent {sub!r} appears again (first at {seen[sub]}): "
                        "a cyclic or duplicated subagent structure",
                    )
                seen[sub] = w
                dur = _num(r, "duration_ms", w, optional=True)
                end = None if dur is None else t_ns + _ns(dur / 1000)
                agents.append(_Agent(sub, agent, w, t_ns, end))
                first = _first_inner_t(r)
                if conv == SEMIANALYSIS and first is not None and first < t:
                    raise _Bad(
                        f"{w}.requests[0]",
                        "inner t before its subagent's t in a "
                        "SemiAnalysis trace (relative?): conventions mixed",
                    )
                walk(r.get("requests"), f"{w}.requests", sub, t_ns)
                continue
            calls.append(_Call(agent, w, t_ns, r))

    walk(trace.get("requests"), "requests", MAIN, 0)
    for stream in [MAIN] + [a.agent for a in agents]:
        _split_flattened(stream, calls, agents)
    return calls, agents


def _positive_seconds(v: Any) -> float:
    """A duration in seconds, 0 when absent, not a number or not positive."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0


def _int_or_zero(v: Any) -> int:
    return v if isinstance(v, int) else 0


def _int_tuple(h: Any) -> tuple[int, ...]:
    """The integers of a hash id list (empty when it is not a list)."""
    if not isinstance(h, list):
        return ()
    return tuple(h) if _all_ints(h) else tuple(x for x in h if isinstance(x, int))


def _chain_call(i: int, c: _Call) -> ChainCall:
    r = c.obj
    model = r.get("model")
    start_s = c.t_ns / 1e9
    return ChainCall(
        i,
        start_s,
        start_s + _positive_seconds(r.get("api_time")),
        model if isinstance(model, str) else "",
        _int_tuple(r.get("hash_ids")),
        _int_or_zero(r.get("in")),
        _int_or_zero(r.get("out")),
    )


def _flat_agent(
    name: str, stream: str, chain: list[int], calls: list[_Call], owner: _Agent | None
) -> _Agent:
    """The agent record of flattened agent ``name`` (its calls: ``chain``) of ``stream``,
    whose subagent record is ``owner`` (None: the top level)."""
    first = calls[chain[0]]
    if owner is None:
        end = max(_chain_call(i, calls[i]).end for i in chain)
        return _Agent(name, MAIN, first.where, first.t_ns, _ns(end), flat=True, scope=stream)
    return _Agent(
        name, owner.spawner, first.where, owner.spawn_ns, owner.end_ns, flat=True, scope=stream
    )


def _flattened_chains(stream: str, calls: list[_Call]) -> list[list[int]]:
    """The flattened agents among the calls of ``stream``, each as its calls' positions."""
    _, flat = detect([_chain_call(i, c) for i, c in enumerate(calls) if c.agent == stream])
    return flat


def _split_flattened(stream: str, calls: list[_Call], agents: list[_Agent]) -> None:
    """Give the flattened agents of ``stream`` (``weka_chains.detect``) their own agent ids:
    ``fa:NNN`` on the top level, ``<subagent>:fa:NNN`` inside a subagent (AIPerf's
    ``trace::fa:NNN`` and ``trace::sa:<subagent>:fa:NNN``). A top-level one is spawned at
    its first call and ends with its last; one inside a subagent shares that subagent's
    spawner, spawn and end (AIPerf puts it in the subagent's branch)."""
    flat = _flattened_chains(stream, calls)
    if not flat:
        return
    owner = next((a for a in agents if a.agent == stream), None)
    taken = {a.agent for a in agents} | {MAIN}
    for n, chain in enumerate(flat):
        name = flat_agent_id(None if owner is None else stream, n)
        if name in taken:
            raise _Bad(
                calls[chain[0]].where,
                f"agent id {name!r} is needed for a flattened agent and already names a subagent",
            )
        for i in chain:
            calls[i].agent = name
        agents.append(_flat_agent(name, stream, chain, calls, owner))


@dataclass
class _Timeline:
    """A trace's calls in arrival order (stream order kept on ties) with, by position,
    their agents, arrivals, durations (None: no ``api_time``) and dependencies."""

    calls: list[_Call]
    agents: list[_Agent]
    ag: list[str]
    arr: list[int]
    dur: list[int | None]
    deps: list[list[int]]


def _timeline(trace: dict[str, Any], conv: str) -> _Timeline:
    calls, agents = _flatten(trace, conv)
    calls.sort(key=lambda c: c.t_ns)  # stable: stream order kept on ties
    ag = [c.agent for c in calls]
    arr = [c.t_ns for c in calls]
    dur: list[int | None] = []
    for c in calls:
        api = _num(c.obj, "api_time", c.where, optional=True)  # absent on cut-off streams
        dur.append(None if api is None else _ns(api))
    deps = derive_depends_on(
        ag,
        arr,
        dur,
        spawner={a.agent: a.spawner for a in agents},
        spawn_at={a.agent: a.spawn_ns for a in agents},
        agent_end={a.agent: a.end_ns for a in agents if a.end_ns is not None},
    )
    return _Timeline(calls, agents, ag, arr, dur, deps)


def _trace_id(trace: dict[str, Any]) -> str:
    tid = trace.get("id")
    if not isinstance(tid, (str, int)) or isinstance(tid, bool):
        raise _Bad("id", f"trace 'id' must be a string, got {tid!r}")
    return str(tid)


def _block_ids(c: _Call, key: int, tid: str, shift: int, need: int) -> tuple[list[int], int]:
    """(the call's ``need`` block ids, shifted by ``shift``, how many of them are fresh ids
    for blocks the format leaves unhashed)."""
    h = c.obj.get("hash_ids")
    if not isinstance(h, list) or not (_all_ints(h, bools=False) and (not h or min(h) >= 0)):
        raise _Bad(c.where, "field 'hash_ids' must be a list of integers >= 0")
    ids = [x + shift for x in h[:need]]
    kept = len(ids)
    ids += [_tail_id(tid, c.agent, key, k) for k in range(kept, need)]
    return ids, need - kept


def _request(
    tid: str, i: int, tl: _Timeline, shift: int, bs: int, parent: int | None
) -> tuple[Request, int]:
    """(call ``i`` of the timeline as a request, its count of fresh tail ids)."""
    c = tl.calls[i]
    r, w = c.obj, c.where
    n_in = _num(r, "in", w)
    n_out = _num(r, "out", w)
    assert n_in is not None and n_out is not None
    ids, padded = _block_ids(c, i, tid, shift, -(-int(n_in) // bs))
    ttft = _num(r, "ttft", w, optional=True)
    d = tl.dur[i]
    ttft_ns = None if ttft is None else (_ns(ttft) if d is None else min(_ns(ttft), d))
    model = r.get("model")
    return Request(
        session=tid,
        key=i,
        arrival_abs_ns=c.t_ns,
        input_tokens=int(n_in),
        output_tokens=int(n_out),
        parent_key=parent,
        think_ns=_think(c, tl.deps[i], tl.arr, tl.dur),
        hash_ids=ids,
        api="messages",
        model=model if isinstance(model, str) else None,
        ttft_ns=ttft_ns,
        end_ns=d,
        agent_id=c.agent,
        depends_on_keys=list(tl.deps[i]),
    ), padded


def _agent_ends(tl: _Timeline) -> dict[str, int]:
    """Agent -> its end: the recorded one, else the latest end of its calls."""
    return {
        a.agent: a.end_ns
        if a.end_ns is not None
        else max(tl.arr[i] + (tl.dur[i] or 0) for i in range(len(tl.calls)) if tl.ag[i] == a.agent)
        for a in tl.agents
    }


def _overlaps(tl: _Timeline) -> list[tuple[str, str]]:
    """Pairs of subagents (not flattened agents) that run at once."""
    ends = _agent_ends(tl)
    subs = [a for a in tl.agents if not a.flat]
    return [
        (x.agent, y.agent)
        for n, x in enumerate(subs)
        for y in subs[n + 1 :]
        if x.spawn_ns < ends[y.agent] and y.spawn_ns < ends[x.agent]
    ]


def _background(tl: _Timeline) -> list[str]:
    """Agents none of whose calls a call of their spawner depends on (never joined)."""
    joined = {(tl.ag[i], tl.ag[j]) for i, d in enumerate(tl.deps) for j in d}
    return [a.agent for a in tl.agents if (a.spawner, a.agent) not in joined]


def _requests(trace: dict[str, Any], ordinal: int, bs: int) -> tuple[list[Request], dict[str, Any]]:
    tid = _trace_id(trace)
    conv = convention(trace)
    tl = _timeline(trace, conv)
    shift = ordinal << TRACE_ID_SHIFT
    last_of: dict[str, int] = {}
    out: list[Request] = []
    padded = 0
    for i, c in enumerate(tl.calls):
        req, pad = _request(tid, i, tl, shift, bs, last_of.get(c.agent))
        out.append(req)
        padded += pad
        last_of[c.agent] = i
    info = {
        "id": tid,
        "convention": conv,
        "subagents": sum(not a.flat for a in tl.agents),
        "overlaps": _overlaps(tl),
        "flattened": {a.agent: tl.ag.count(a.agent) for a in tl.agents if a.flat},
        "background": _background(tl),
        "padded": padded,
        "prefix_tokens": _prefix_tokens(trace),
        "aiperf_absolute": _read_as_absolute(trace) if conv == WEKA else 0,
        "aiperf_interval_waits": _unapplied_interval_waits(tl),
    }
    return out, info


def _ancestors(deps: list[list[int]]) -> list[int]:
    """Bit d of item i: call i waits for call d, directly or not (dependencies come first)."""
    anc: list[int] = []
    for d_list in deps:
        bits = 0
        for d in d_list:
            bits |= anc[d] | (1 << d)
        anc.append(bits)
    return anc


def _flat_scopes(tl: _Timeline) -> list[list[int]]:
    """The positions of the calls of each scope (a stream and its flattened agents) that
    has flattened agents, scopes in name order."""
    flat = {a.agent for a in tl.agents if a.flat}
    scope = {a.agent: a.scope if a.flat else a.agent for a in tl.agents}
    by_scope: dict[str, list[int]] = {}
    for i, a in enumerate(tl.ag):
        by_scope.setdefault(scope.get(a, a), []).append(i)
    return [pos for _, pos in sorted(by_scope.items()) if any(tl.ag[i] in flat for i in pos)]


def _unapplied_interval_waits(tl: _Timeline) -> int:
    """Calls for which AIPerf's recorded-interval waits between a stream and its flattened
    agents (``weka_chains.interval_waits``) name a call that their dependencies do not
    already wait for, directly or not: held back until that one ends by ``--timing agentx``
    (``replay.agentx.interval_barriers``), not by the other timings."""
    scopes = _flat_scopes(tl)
    if not scopes:
        return 0
    anc = _ancestors(tl.deps)
    n = 0
    for pos in scopes:
        waits = interval_waits(
            [tl.ag[i] for i in pos],
            [tl.arr[i] / 1e9 for i in pos],
            [(tl.arr[i] + (tl.dur[i] or 0)) / 1e9 for i in pos],
        )
        n += sum(1 for k, i in enumerate(pos) if any(not anc[i] >> pos[w] & 1 for w in waits[k]))
    return n


def _subagent_entries(trace: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every subagent entry of the trace, at any depth."""
    stack: list[Any] = [trace.get("requests")]
    while stack:
        reqs = stack.pop()
        for r in reqs if isinstance(reqs, list) else ():
            if isinstance(r, dict) and r.get("type") == "subagent":
                yield r
                stack.append(r.get("requests"))


def _read_as_absolute(trace: dict[str, Any]) -> int:
    """Inner subagent calls of a WEKA trace whose relative ``t`` is at or after their
    subagent's ``t``: AIPerf decides relative or absolute per inner call (relative only when
    ``t + 1e-6`` is before the subagent's ``t``), so it reads these as absolute while the
    convention (and this importer) reads every inner ``t`` of a WEKA trace as relative."""
    n = 0
    for sub in _subagent_entries(trace):
        spawn, inner = sub.get("t"), sub.get("requests")
        if not isinstance(spawn, (int, float)):
            continue
        calls = [
            q
            for q in (inner if isinstance(inner, list) else ())
            if isinstance(q, dict) and q.get("type") != "subagent"
        ]
        n += sum(
            1 for q in calls if isinstance(q.get("t"), (int, float)) and q["t"] + 1e-6 >= spawn
        )
    return n


def _prefix_tokens(trace: dict[str, Any]) -> dict[str, int]:
    """Agent -> ``tool_tokens + system_tokens`` (the shared tools + system prefix) where the
    trace or the subagent records them."""
    out: dict[str, int] = {}

    def one(obj: dict[str, Any], agent: str) -> None:
        t, s = obj.get("tool_tokens"), obj.get("system_tokens")
        vals = [v for v in (t, s) if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if vals:
            out[agent] = sum(vals)

    one(trace, MAIN)
    stack = [trace.get("requests")]
    while stack:
        reqs = stack.pop()
        for r in reqs if isinstance(reqs, list) else ():
            if (
                isinstance(r, dict)
                and r.get("type") == "subagent"
                and isinstance(r.get("agent_id"), str)
            ):
                one(r, r["agent_id"])
                stack.append(r.get("requests"))
    return out


def _think(c: _Call, deps: list[int], arr: list[int], dur: list[int | None]) -> int | None:
    """End-to-start from the latest dependency's end, floored at 0, a dependency
    without ``api_time`` (a cut-off stream) ending at its start, as AIPerf's loader counts
    it: after such a call the think time is the start-to-start gap. (The recorded
    ``think_time`` is measured from the end of the stream's last call that had an
    ``api_time``, so it would count the spans of the calls after it again.)"""
    if not deps:
        return None
    return max(0, c.t_ns - max(arr[d] + (dur[d] or 0) for d in deps))


def _jsonl_docs(raw: bytes, path: Path) -> tuple[list[Any], list[str]]:
    docs: list[Any] = []
    where: list[str] = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            docs.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"line {n}: not valid JSON ({exc})", path=str(path)) from exc
        where.append(f"line {n}: ")
    return docs, where


def _docs(raw: bytes, path: Path) -> tuple[list[Any], list[str]]:
    """(the file's JSON documents, where each is: a prefix for error lines): one object, a
    list of them, or one per line."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _jsonl_docs(raw, path)
    if isinstance(doc, list):
        return doc, [f"item {i}: " for i in range(len(doc))]
    return [doc], [""]


def _traces(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, trace object) for every trace in the file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot open ({exc.strerror})", path=str(path)) from exc
    docs, where = _docs(raw, path)
    out = []
    for w, d in zip(where, docs, strict=True):
        if not isinstance(d, dict):
            raise TraceError(f"{w}a trace must be a JSON object", path=str(path))
        out.append((w, d))
    return out


def _block_size(trace: dict[str, Any], before: int | None, where: str, path: Path) -> int:
    """The trace's block size, which must equal ``before`` (that of the traces before it,
    or ``--block-size``) when that is set."""
    tid = trace.get("id", "?")
    bs = trace.get("block_size", BLOCK_SIZE)
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise TraceError(
            f"{where}trace {tid}: 'block_size' must be a positive integer, got {bs!r}",
            path=str(path),
        )
    if before is not None and bs != before:
        raise TraceError(
            f"{where}trace {tid}: block size {bs} differs from {before} of the traces before it",
            path=str(path),
        )
    return bs


def _read_all(
    paths: list[Path], block_size: int | None
) -> tuple[list[Request], list[dict[str, Any]], int | None]:
    """(every trace's requests, every trace's info, the block size)."""
    reqs: list[Request] = []
    infos: list[dict[str, Any]] = []
    seen_ids: dict[str, str] = {}
    for path in paths:
        for w, trace in _traces(path):
            block_size = _block_size(trace, block_size, w, path)
            try:
                rs, info = _requests(trace, len(infos), block_size)
            except _Bad as exc:
                raise TraceError(
                    f"{w}trace {trace.get('id', '?')}, request {exc.where}: {exc}", path=str(path)
                ) from exc
            if info["id"] in seen_ids:
                raise TraceError(
                    f"{w}trace {trace.get('id', '?')}: id also used in {seen_ids[info['id']]}",
                    path=str(path),
                )
            seen_ids[info["id"]] = path.name
            reqs += rs
            infos.append(info)
    return reqs, infos, block_size


# Per-trace tallies that only the notes report (not kept in the metadata), with their note.
_COUNTED_NOTES = {
    "aiperf_absolute": "{n} inner subagent calls have a relative t at or after their "
    "subagent's t: read as relative here; AIPerf 0.13.0 reads each such call "
    "as absolute (its rule is per call), so its schedule of them differs",
    "aiperf_interval_waits": "{n} calls of streams with flattened agents also wait for another "
    "of those streams' calls that ended before they started in the "
    "recording (AIPerf's interval barriers): --timing agentx applies "
    "them, other timings do not",
    "padded": "{n} partial last blocks got fresh hash ids (the format hashes only full blocks)",
}


def _convention_note(infos: list[dict[str, Any]]) -> str:
    convs = sorted({i["convention"] for i in infos})
    counts = ", ".join(f"{sum(i['convention'] == c for i in infos)} {c}" for c in convs)
    return f"convention: {' and '.join(convs)} ({counts} traces)"


def _structure_note(infos: list[dict[str, Any]]) -> str:
    n_sub = sum(i["subagents"] for i in infos)
    n_par = sum(len(i["overlaps"]) for i in infos)
    n_bg = sum(len(i["background"]) for i in infos)
    return (
        f"{n_sub} subagents in {sum(1 for i in infos if i['subagents'])} traces; "
        f"{n_par} pairs overlap in time (parallel); {n_bg} background (no join)"
    )


def _flattened_notes(infos: list[dict[str, Any]]) -> list[str]:
    flat = [(i["id"], a, n) for i in infos for a, n in i["flattened"].items()]
    if not flat:
        return []
    return [
        f"{len(flat)} flattened agents (calls recorded in another agent's stream, "
        "split off by their hash ids as AIPerf does): "
        + ", ".join(f"{t} {a} ({n} calls)" for t, a, n in flat)
    ]


def _notes(infos: list[dict[str, Any]]) -> list[str]:
    notes = [_convention_note(infos), _structure_note(infos), *_flattened_notes(infos)]
    for key, note in _COUNTED_NOTES.items():
        n = sum(i[key] for i in infos)
        if n:
            notes.append(note.format(n=n))
    return notes


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    reqs, infos, block_size = _read_all(paths, opts.block_size)
    if not reqs:
        raise TraceError("no traces in file", path=str(paths[0]))
    table, _ = build_table(reqs)
    meta = TraceMeta(
        block_size=block_size or BLOCK_SIZE,
        source=f"imported:{NAME}",
        extra={
            "imported_from": [p.name for p in paths],
            "weka": [{k: v for k, v in i.items() if k not in _COUNTED_NOTES} for i in infos],
        },
    )
    return ImportResult(table, meta, NAME, _notes(infos))
