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


def convention(trace: dict[str, Any]) -> str:
    """``WEKA`` or ``SemiAnalysis``; raises ``_Bad`` when the evidence is for both or neither."""
    typed = relative = absolute = False
    min_hash: int | None = None

    def walk(reqs: list[Any], where: str) -> None:
        nonlocal typed, relative, absolute, min_hash
        for i, r in enumerate(reqs):
            if not isinstance(r, dict):
                raise _Bad(f"{where}[{i}]", "not a JSON object")
            if r.get("type") == "subagent":
                inner = r.get("requests")
                t = r.get("t")
                if not isinstance(r.get("agent_id"), str) or not r.get("agent_id"):
                    raise _Bad(f"{where}[{i}]", "subagent without an 'agent_id' (dangling)")
                if not isinstance(inner, list) or not inner:
                    raise _Bad(f"{where}[{i}].requests", "a subagent with no requests (dangling)")
                if isinstance(inner, list) and inner and isinstance(inner[0], dict) and \
                        isinstance(t, (int, float)) and isinstance(inner[0].get("t"), (int, float)):
                    if inner[0]["t"] < t:
                        relative = True
                    elif t > 0:
                        absolute = True
                if isinstance(inner, list):
                    walk(inner, f"{where}[{i}].requests")
                continue
            typed = typed or any(k in r for k in _TYPE_FIELDS)
            h = r.get("hash_ids")
            if isinstance(h, list) and h and _all_ints(h):
                m = min(h)
                min_hash = m if min_hash is None else min(min_hash, m)

    walk(trace.get("requests") or [], "requests")
    declared = trace.get("convention")  # written by our exporter
    if declared in (WEKA, SEMIANALYSIS):
        return str(declared)
    weka = typed or relative
    sa = absolute or (not typed and min_hash == 0)
    if weka and not sa:
        return WEKA
    if sa and not weka:
        return SEMIANALYSIS
    why = ("evidence for both (" + ", ".join(
        x for x, on in (("type fields", typed), ("relative inner t", relative),
                        ("absolute inner t", absolute), ("hash ids from 0", min_hash == 0)) if on)
        + ")") if weka else "no type fields, no subagent timing and hash ids not from 0"
    raise _Bad("requests", f"cannot decide the convention (WEKA or SemiAnalysis): {why}")


def _flatten(trace: dict[str, Any], conv: str) -> tuple[list[_Call], list[_Agent]]:
    calls: list[_Call] = []
    agents: list[_Agent] = []
    seen: dict[str, str] = {MAIN: "requests"}

    def walk(reqs: Any, where: str, agent: str, base_ns: int) -> None:
        if not isinstance(reqs, list) or not reqs:
            raise _Bad(where, "a subagent with no requests (dangling)" if agent != MAIN
                       else "field 'requests' must be a non-empty list")
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
                sub = r.get("agent_id")
                if not isinstance(sub, str) or not sub:
                    raise _Bad(w, "subagent without an 'agent_id' (dangling)")
                if sub in seen:
                    raise _Bad(w, f"subagent {sub!r} appears again (first at {seen[sub]}): "
                               "a cyclic or duplicated subagent structure")
                seen[sub] = w
                dur = _num(r, "duration_ms", w, optional=True)
                end = None if dur is None else t_ns + _ns(dur / 1000)
                agents.append(_Agent(sub, agent, w, t_ns, end))
                if conv == SEMIANALYSIS:
                    inner = r.get("requests")
                    if isinstance(inner, list) and inner and isinstance(inner[0], dict) and \
                            isinstance(inner[0].get("t"), (int, float)) and inner[0]["t"] < t:
                        raise _Bad(f"{w}.requests[0]", "inner t before its subagent's t in a "
                                   "SemiAnalysis trace (relative?): conventions mixed")
                walk(r.get("requests"), f"{w}.requests", sub, t_ns)
                continue
            calls.append(_Call(agent, w, t_ns, r))

    walk(trace.get("requests"), "requests", MAIN, 0)
    for stream in [MAIN] + [a.agent for a in agents]:
        _split_flattened(stream, calls, agents)
    return calls, agents


def _chain_call(i: int, c: _Call) -> ChainCall:
    r = c.obj
    api = r.get("api_time")
    api_s = float(api) if isinstance(api, (int, float)) and not isinstance(api, bool) and api > 0 else 0.0
    h = r.get("hash_ids")
    ids = (tuple(h) if _all_ints(h) else tuple(x for x in h if isinstance(x, int))) \
        if isinstance(h, list) else ()
    model, n_in, n_out = r.get("model"), r.get("in"), r.get("out")
    return ChainCall(i, c.t_ns / 1e9, c.t_ns / 1e9 + api_s, model if isinstance(model, str) else "",
                     ids, n_in if isinstance(n_in, int) else 0, n_out if isinstance(n_out, int) else 0)


def _split_flattened(stream: str, calls: list[_Call], agents: list[_Agent]) -> None:
    """Give the flattened agents of ``stream`` (``weka_chains.detect``) their own agent ids:
    ``fa:NNN`` on the top level, ``<subagent>:fa:NNN`` inside a subagent (AIPerf's
    ``trace::fa:NNN`` and ``trace::sa:<subagent>:fa:NNN``). A top-level one is spawned at
    its first call and ends with its last; one inside a subagent shares that subagent's
    spawner, spawn and end (AIPerf puts it in the subagent's branch)."""
    mine = [i for i, c in enumerate(calls) if c.agent == stream]
    _, flat = detect([_chain_call(i, calls[i]) for i in mine])
    if not flat:
        return
    owner = next((a for a in agents if a.agent == stream), None)
    taken = {a.agent for a in agents} | {MAIN}
    for n, chain in enumerate(flat):
        name = flat_agent_id(None if owner is None else stream, n)
        if name in taken:
            raise _Bad(calls[chain[0]].where, f"agent id {name!r} is needed for a flattened "
                       "agent and already names a subagent")
        for i in chain:
            calls[i].agent = name
        first = calls[chain[0]]
        if owner is None:
            end = max(_chain_call(i, calls[i]).end for i in chain)
            agents.append(_Agent(name, MAIN, first.where, first.t_ns, _ns(end), flat=True,
                                 scope=stream))
        else:
            agents.append(_Agent(name, owner.spawner, first.where, owner.spawn_ns, owner.end_ns,
                                 flat=True, scope=stream))


def _requests(trace: dict[str, Any], ordinal: int, bs: int) -> tuple[list[Request], dict[str, Any]]:
    tid = trace.get("id")
    if not isinstance(tid, (str, int)) or isinstance(tid, bool):
        raise _Bad("id", f"trace 'id' must be a string, got {tid!r}")
    tid = str(tid)
    conv = convention(trace)
    calls, agents = _flatten(trace, conv)
    calls.sort(key=lambda c: c.t_ns)  # stable: stream order kept on ties
    ag = [c.agent for c in calls]
    arr = [c.t_ns for c in calls]
    dur: list[int | None] = []
    for c in calls:
        api = _num(c.obj, "api_time", c.where, optional=True)  # absent on cut-off streams
        dur.append(None if api is None else _ns(api))
    deps = derive_depends_on(
        ag, arr, dur, spawner={a.agent: a.spawner for a in agents},
        spawn_at={a.agent: a.spawn_ns for a in agents},
        agent_end={a.agent: a.end_ns for a in agents if a.end_ns is not None})
    shift = ordinal << TRACE_ID_SHIFT
    last_of: dict[str, int] = {}
    out: list[Request] = []
    padded = 0
    for i, c in enumerate(calls):
        r, w = c.obj, c.where
        n_in = _num(r, "in", w)
        n_out = _num(r, "out", w)
        assert n_in is not None and n_out is not None
        h = r.get("hash_ids")
        if not isinstance(h, list) or not (_all_ints(h, bools=False) and (not h or min(h) >= 0)):
            raise _Bad(w, "field 'hash_ids' must be a list of integers >= 0")
        need = -(-int(n_in) // bs)
        ids = [x + shift for x in h[:need]]
        k = len(ids)
        while len(ids) < need:
            ids.append(_tail_id(tid, c.agent, i, k))
            k += 1
            padded += 1
        ttft = _num(r, "ttft", w, optional=True)
        d = dur[i]
        ttft_ns = None if ttft is None else (_ns(ttft) if d is None else min(_ns(ttft), d))
        model = r.get("model")
        out.append(Request(
            session=tid, key=i, arrival_abs_ns=c.t_ns, input_tokens=int(n_in),
            output_tokens=int(n_out), parent_key=last_of.get(c.agent),
            think_ns=_think(c, deps[i], arr, dur), hash_ids=ids, api="messages",
            model=model if isinstance(model, str) else None,
            ttft_ns=ttft_ns, end_ns=d,
            agent_id=c.agent, depends_on_keys=list(deps[i])))
        last_of[c.agent] = i
    ends = {a.agent: a.end_ns if a.end_ns is not None else max(
        arr[i] + (dur[i] or 0) for i in range(len(calls)) if ag[i] == a.agent) for a in agents}
    subs = [a for a in agents if not a.flat]
    overlaps = [(x.agent, y.agent) for n, x in enumerate(subs) for y in subs[n + 1:]
                if x.spawn_ns < ends[y.agent] and y.spawn_ns < ends[x.agent]]
    flattened = {a.agent: sum(x == a.agent for x in ag) for a in agents if a.flat}
    background = [a.agent for a in agents
                  if not any(ag[i] == a.spawner and ag[j] == a.agent
                             for i, d in enumerate(deps) for j in d)]
    info = {"id": tid, "convention": conv, "subagents": len(subs), "overlaps": overlaps,
            "flattened": flattened, "background": background, "padded": padded, "prefix_tokens": _prefix_tokens(trace),
            "aiperf_absolute": _read_as_absolute(trace) if conv == WEKA else 0,
            "aiperf_interval_waits": _unapplied_interval_waits(agents, ag, arr, dur, deps)}
    return out, info


def _unapplied_interval_waits(agents: list[_Agent], ag: list[str], arr: list[int],
                              dur: list[int | None], deps: list[list[int]]) -> int:
    """Calls for which AIPerf's recorded-interval waits between a stream and its flattened
    agents (``weka_chains.interval_waits``) name a call that their dependencies do not
    already wait for, directly or not: held back until that one ends by ``--timing agentx``
    (``replay.agentx.interval_barriers``), not by the other timings."""
    flat = {a.agent for a in agents if a.flat}
    if not flat:
        return 0
    scope = {a.agent: a.scope if a.flat else a.agent for a in agents}
    scope_of = [scope.get(a, a) for a in ag]
    anc: list[int] = []  # bit d of anc[i]: i waits for d, directly or not (deps come first)
    for d_list in deps:
        bits = 0
        for d in d_list:
            bits |= anc[d] | (1 << d)
        anc.append(bits)
    n = 0
    for sc in sorted(set(scope_of)):
        pos = [i for i, s in enumerate(scope_of) if s == sc]
        if not any(ag[i] in flat for i in pos):
            continue
        waits = interval_waits([ag[i] for i in pos], [arr[i] / 1e9 for i in pos],
                               [(arr[i] + (dur[i] or 0)) / 1e9 for i in pos])
        n += sum(1 for k, i in enumerate(pos) if any(not anc[i] >> pos[w] & 1 for w in waits[k]))
    return n


def _read_as_absolute(trace: dict[str, Any]) -> int:
    """Inner subagent calls of a WEKA trace whose relative ``t`` is at or after their
    subagent's ``t``: AIPerf decides relative or absolute per inner call (relative only when
    ``t + 1e-6`` is before the subagent's ``t``), so it reads these as absolute while the
    convention (and this importer) reads every inner ``t`` of a WEKA trace as relative."""
    n = 0
    stack: list[Any] = [trace.get("requests")]
    while stack:
        reqs = stack.pop()
        for r in reqs if isinstance(reqs, list) else ():
            if not isinstance(r, dict) or r.get("type") != "subagent":
                continue
            inner = r.get("requests")
            spawn = r.get("t")
            for q in inner if isinstance(inner, list) else ():
                t = q.get("t") if isinstance(q, dict) else None
                if isinstance(t, (int, float)) and isinstance(spawn, (int, float)) and \
                        q.get("type") != "subagent" and t + 1e-6 >= spawn:
                    n += 1
            stack.append(inner)
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
            if isinstance(r, dict) and r.get("type") == "subagent" and isinstance(r.get("agent_id"), str):
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


def _traces(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, trace object) for every trace in the file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot open ({exc.strerror})", path=str(path)) from exc
    try:
        doc = orjson.loads(raw)
        docs = doc if isinstance(doc, list) else [doc]
        where = ["" if not isinstance(doc, list) else f"item {i}: " for i in range(len(docs))]
    except orjson.JSONDecodeError:
        docs, where = [], []
        for n, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"line {n}: not valid JSON ({exc})", path=str(path)) from exc
            where.append(f"line {n}: ")
    out = []
    for w, d in zip(where, docs, strict=True):
        if not isinstance(d, dict):
            raise TraceError(f"{w}a trace must be a JSON object", path=str(path))
        out.append((w, d))
    return out


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    reqs: list[Request] = []
    infos: list[dict[str, Any]] = []
    block_size: int | None = opts.block_size
    ordinal = 0
    seen_ids: dict[str, str] = {}
    for path in paths:
        for w, trace in _traces(path):
            tid = trace.get("id", "?")
            bs = trace.get("block_size", BLOCK_SIZE)
            if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
                raise TraceError(f"{w}trace {tid}: 'block_size' must be a positive integer, "
                                 f"got {bs!r}", path=str(path))
            if block_size is None:
                block_size = bs
            elif bs != block_size:
                raise TraceError(f"{w}trace {tid}: block size {bs} differs from {block_size} "
                                 "of the traces before it", path=str(path))
            try:
                rs, info = _requests(trace, ordinal, block_size)
            except _Bad as exc:
                raise TraceError(f"{w}trace {tid}, request {exc.where}: {exc}", path=str(path)) from exc
            if info["id"] in seen_ids:
                raise TraceError(f"{w}trace {tid}: id also used in {seen_ids[info['id']]}",
                                 path=str(path))
            seen_ids[info["id"]] = path.name
            ordinal += 1
            reqs += rs
            infos.append(info)
    if not reqs:
        raise TraceError("no traces in file", path=str(paths[0]))
    table, _ = build_table(reqs)
    convs = sorted({i["convention"] for i in infos})
    notes = [f"convention: {' and '.join(convs)} ("
             + ", ".join(f"{sum(i['convention'] == c for i in infos)} {c}" for c in convs) + " traces)"]
    n_sub = sum(i["subagents"] for i in infos)
    n_par = sum(len(i["overlaps"]) for i in infos)
    n_bg = sum(len(i["background"]) for i in infos)
    notes.append(f"{n_sub} subagents in {sum(1 for i in infos if i['subagents'])} traces; "
                 f"{n_par} pairs overlap in time (parallel); {n_bg} background (no join)")
    flat = [(i["id"], a, n) for i in infos for a, n in i["flattened"].items()]
    if flat:
        notes.append(f"{len(flat)} flattened agents (calls recorded in another agent's stream, "
                     "split off by their hash ids as AIPerf does): "
                     + ", ".join(f"{t} {a} ({n} calls)" for t, a, n in flat))
    absolute = sum(i["aiperf_absolute"] for i in infos)
    if absolute:
        notes.append(f"{absolute} inner subagent calls have a relative t at or after their "
                     "subagent's t: read as relative here; AIPerf 0.13.0 reads each such call "
                     "as absolute (its rule is per call), so its schedule of them differs")
    barred = sum(i["aiperf_interval_waits"] for i in infos)
    if barred:
        notes.append(f"{barred} calls of streams with flattened agents also wait for another of "
                     "those streams' calls that ended before they started in the recording "
                     "(AIPerf's interval barriers): --timing agentx applies them, other timings "
                     "do not")
    padded = sum(i["padded"] for i in infos)
    if padded:
        notes.append(f"{padded} partial last blocks got fresh hash ids (the format hashes "
                     "only full blocks)")
    meta = TraceMeta(block_size=block_size or BLOCK_SIZE, source=f"imported:{NAME}",
                     extra={"imported_from": [p.name for p in paths],
                            "weka": [{k: v for k, v in i.items() if k not in ("padded", "aiperf_absolute", "aiperf_interval_waits")}
                              for i in infos]})
    return ImportResult(table, meta, NAME, notes)
