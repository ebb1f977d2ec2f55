"""AIPerf as an oracle for ``--timing agentx``: pure functions that put AIPerf's per-request
records and ours on one footing and compare them.

A request is named by where it sits in its weka trace: ``(trace, outer, inner)``, ``outer``
the index in the trace's top-level ``requests`` list, ``inner`` the index inside a subagent
entry's ``requests`` (None for a main-agent call). AIPerf writes exactly these
(``source_trace_id``, ``source_outer_idx``, ``source_inner_idx``) on every record; our rows are
mapped by walking the trace file (the k-th call of agent A in our session is the k-th call of
A in the trace, checked on its input token count).

What is compared:

* the static plan: which requests each tool makes a request wait for, the kind of rule and
  the delay it adds after them, read from AIPerf's own plan (its dataset metadata) and from
  the rules our replay applies (``replay.agentx.stream_rules`` on our imported trace), so
  differences there hold whatever the load;
* the measured schedule: per request, its gap after its same-stream predecessor's end (or,
  for a subagent's first call, after the spawning turn's end) in the same play, on each
  side, and the difference between the sides' medians (ms);
* token counts (the server's prompt and completion counts, per request);
* the AgentX interactivity score, one definition for both sides (``interactivity``).

Nothing here imports AIPerf or talks to a server: the runner (bench_agentx_aiperf.py) does.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_replay.replay.plan import Plan, PlannedSession

Key = tuple[str, int, int | None]
"""(trace id, outer index, inner index or None)."""

MAIN = "main"
_JOIN_EPS_S = 1e-6


def key_str(k: Key) -> str:
    t, o, i = k
    return f"{t}[{o}]" if i is None else f"{t}[{o}].{i}"


# -- the trace ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TraceCall:
    """One call of a weka trace, on the trace's clock (seconds)."""

    key: Key
    stream: str  # "main" or the subagent's agent_id
    t: float
    api_time: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TraceSubagent:
    trace: str
    outer: int
    agent_id: str
    t: float
    end: float


@dataclass
class TraceIndex:
    calls: dict[Key, TraceCall] = field(default_factory=dict)
    streams: dict[tuple[str, str], list[Key]] = field(default_factory=dict)
    subagents: list[TraceSubagent] = field(default_factory=list)


def index_trace(obj: Mapping[str, Any], into: TraceIndex | None = None) -> TraceIndex:
    """The calls of one weka trace object, by key and by (trace, stream) in trace order.
    An inner ``t`` earlier than its subagent's ``t`` is relative to the spawn (WEKA). A
    flattened agent (``traces.importers.weka_chains``) is a stream of its own, named as the
    importer names it."""
    from agent_replay.traces.importers.weka_chains import ChainCall, detect, flat_agent_id

    ix = into if into is not None else TraceIndex()
    tid = str(obj["id"])
    found: dict[str, list[tuple[Key, float, dict[str, Any]]]] = {}
    for o, r in enumerate(obj.get("requests") or []):
        if r.get("type") == "subagent":
            agent = str(r["agent_id"])
            spawn = float(r["t"])
            inner = r.get("requests") or []
            relative = bool(inner) and float(inner[0]["t"]) + _JOIN_EPS_S < spawn
            for i, q in enumerate(inner):
                found.setdefault(agent, []).append(
                    ((tid, o, i), float(q["t"]) + (spawn if relative else 0.0), q)
                )
            dur = r.get("duration_ms")
            ix.subagents.append(
                TraceSubagent(
                    tid, o, agent, spawn, spawn + float(dur) / 1000 if dur is not None else spawn
                )
            )
            continue
        found.setdefault(MAIN, []).append(((tid, o, None), float(r["t"]), r))
    for agent, calls in found.items():
        stream_of = [agent] * len(calls)
        _, flat = detect(
            [
                ChainCall(
                    n,
                    t,
                    t + max(float(q.get("api_time") or 0.0), 0.0),
                    str(q.get("model") or ""),
                    tuple(q.get("hash_ids") or ()),
                    int(q["in"]),
                    int(q["out"]),
                )
                for n, (_, t, q) in enumerate(calls)
            ]
        )
        for n, chain in enumerate(flat):
            for p in chain:
                stream_of[p] = flat_agent_id(None if agent == MAIN else agent, n)
        for (key, t, q), stream in zip(calls, stream_of, strict=True):
            c = TraceCall(
                key, stream, t, float(q.get("api_time") or 0.0), int(q["in"]), int(q["out"])
            )
            ix.calls[key] = c
            ix.streams.setdefault((tid, stream), []).append(key)
    return ix


def load_traces(paths: Iterable[str | Path]) -> TraceIndex:
    ix = TraceIndex()
    for p in paths:
        index_trace(json.loads(Path(p).read_text()), ix)
    return ix


# -- requests as sent ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sent:
    """One request as a tool sent it (times in ns on that run's own clock)."""

    side: str
    run: int
    key: Key
    stream: str
    play: str
    warmup: bool
    send_ns: int
    first_token_ns: int | None
    end_ns: int | None
    input_tokens: int | None
    output_tokens: int | None
    error: bool


def _stream_of_conversation(conv: str) -> str:
    """AIPerf's ``trace::sa:agent_001:aux:002`` -> ``agent_001``; a flattened agent of the
    top level, ``trace::fa:000``, -> ``fa:000``; a root -> ``main``."""
    if "::sa:" not in conv:
        return conv.split("::", 1)[1] if "::" in conv else MAIN
    agent = conv.split("::sa:", 1)[1]
    for marker in (":aux:", ":fa:", ":wg:"):
        if marker in agent:
            agent = agent.rsplit(marker, 1)[0]
    return agent


def _metric(metrics: Mapping[str, Any], name: str) -> float | None:
    m = metrics.get(name)
    if isinstance(m, Mapping):
        v = m.get("value")
        return float(v) if isinstance(v, (int, float)) else None
    return None


def aiperf_sent(records: Iterable[Mapping[str, Any]], run: int) -> list[Sent]:
    """AIPerf ``profile_export.jsonl`` records -> ``Sent`` rows. The play is the tree
    (``root_correlation_id``); warm-up is ``benchmark_phase == "warmup"``; server token
    counts (``usage_*``) are preferred to AIPerf's own."""
    out: list[Sent] = []
    for rec in records:
        md = rec.get("metadata") or {}
        mt = rec.get("metrics") or {}
        trace = md.get("source_trace_id")
        outer = md.get("source_outer_idx")
        if trace is None or outer is None:
            continue
        inner = md.get("source_inner_idx")
        start = int(md["request_start_ns"])
        ttft = _metric(mt, "time_to_first_token")
        end = md.get("request_end_ns")
        isl = _metric(mt, "usage_prompt_tokens")
        if isl is None:
            isl = _metric(mt, "input_sequence_length")
        osl = _metric(mt, "usage_completion_tokens")
        if osl is None:
            osl = _metric(mt, "output_sequence_length")
        error = bool(rec.get("error")) or bool(md.get("was_cancelled"))
        out.append(
            Sent(
                side="aiperf",
                run=run,
                key=(str(trace), int(outer), None if inner is None else int(inner)),
                stream=_stream_of_conversation(str(md.get("conversation_id", ""))),
                play=str(md.get("root_correlation_id") or md.get("x_correlation_id")),
                warmup=md.get("benchmark_phase") == "warmup",
                send_ns=start,
                first_token_ns=None if ttft is None else start + round(ttft * 1e6),
                end_ns=None if end is None else int(end),
                input_tokens=None if isl is None else int(isl),
                output_tokens=None if osl is None else int(osl),
                error=error,
            )
        )
    return out


def ours_sent(
    rows: Iterable[Mapping[str, Any]],
    ix: TraceIndex,
    ranks: Mapping[tuple[str, int], int],
    run: int,
) -> tuple[list[Sent], list[str]]:
    """Our result rows (``session_id``, ``request_index``, ``clone``, ``agent_id``,
    ``warmup``, ``sent_ns``, ``first_token_ns``, ``end_ns``, ``prompt_tokens``,
    ``completion_tokens``, ``status``, ``expected_input_tokens``) -> ``Sent`` rows, and the
    problems met mapping them (one line each). ``ranks``: ``stream_ranks`` of the plan."""
    problems: list[str] = []
    out: list[Sent] = []
    for r in rows:
        s, a = r["session_id"], r["agent_id"] or MAIN
        stream = ix.streams.get((s, a))
        k = ranks.get((s, int(r["request_index"])))
        if stream is None or k is None or k >= len(stream):
            problems.append(f"ours: {s}/{a} request {r['request_index']} is not in the traces")
            continue
        key = stream[k]
        want = ix.calls[key].input_tokens
        got = r.get("expected_input_tokens")
        if got is not None and int(got) != want and not r.get("warmup"):
            problems.append(f"ours: {key_str(key)} expected {want} input tokens, row says {got}")
        out.append(
            Sent(
                side="ours",
                run=run,
                key=key,
                stream=a,
                play=f"{s}#{r.get('clone', 0)}",
                warmup=bool(r.get("warmup")),
                send_ns=int(r["sent_ns"]),
                first_token_ns=r.get("first_token_ns"),
                end_ns=r.get("end_ns"),
                input_tokens=r.get("prompt_tokens"),
                output_tokens=r.get("completion_tokens"),
                error=r.get("status") not in (None, "ok"),
            )
        )
    return out, problems


def stream_ranks(plan_rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """From a trace table's rows (``session_id``, ``request_index``, ``agent_id``): each
    request's rank in its agent's stream, in request order."""
    by: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in plan_rows:
        by[(r["session_id"], r["agent_id"] or MAIN)].append(int(r["request_index"]))
    out: dict[tuple[str, int], int] = {}
    for (s, _a), idxs in by.items():
        for k, ri in enumerate(sorted(idxs)):
            out[(s, ri)] = k
    return out


# -- the plans -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rule:
    """What a tool makes one request wait for, the kind of rule, and its delay (ms).

    ``kind``: ``first`` (no wait), ``next`` (``delay_ms`` after the stream's previous
    turn), ``child-first`` (a subagent's first turn: ``delay_ms`` after the spawning turn
    ends), ``child-at-send`` (``delay_ms`` after the spawning turn is sent), ``join`` (the moment the last awaited subagent ends when one outlives the
    parent's previous turn, else ``delay_ms`` after that turn) or ``after`` (``delay_ms``
    after the latest wait). ``barrier``: requests it is also held back for, sent the moment
    the last of them ends when that is later than its rule's time (AIPerf's recorded-interval
    waits). ``branch``: for a child's first turn, the first turns of every child of its
    branch (the children spawned together, whose offsets count from one start)."""

    waits_for: frozenset[Key]
    delay_ms: float
    kind: str
    barrier: frozenset[Key] = frozenset()
    branch: frozenset[Key] = frozenset()


def aiperf_rules(metadata: Mapping[str, Any]) -> dict[Key, Rule]:
    """AIPerf's replay rule per request, from its dataset metadata (the ``conversations``
    list of ``dataset_metadata_json`` in its dataset cache manifest).

    * a stream's next turn: ``delay_ms`` after the same stream's previous turn ends;
    * a child's first turn: dispatched when the spawning parent turn completes, plus the
      child's recorded offset from its branch's ``start_timestamp_ms``; or, when the branch
      started before the spawning turn's recorded end and that turn is a root
      conversation's (``agent_depth`` 0, in a replay scope, with an ``api_time_ms`` above
      0), when that turn is sent, plus the child's offset from the turn's
      ``timestamp_ms`` (kind ``child-at-send``: its runtime's
      ``BranchOrchestrator.on_credit_issued``);
    * a join turn (``spawn_join`` prerequisite): if the children are still running when the
      parent's previous turn ends, it is sent the moment they are done (no delay);
      otherwise its ``delay_ms`` after the previous turn (``kind`` ``join``);
    * ``replay_predecessors``: the barrier (``Rule.barrier``).
    """
    convs = {c["conversation_id"]: c for c in metadata.get("conversations", [])}

    def key_of(turn: Mapping[str, Any]) -> Key:
        inner = turn.get("source_inner_idx")
        return (
            str(turn["source_trace_id"]),
            int(turn["source_outer_idx"]),
            None if inner is None else int(inner),
        )

    branch_children: dict[str, list[str]] = {}
    branch_spawn: dict[str, Key] = {}
    branch_start: dict[str, float | None] = {}
    spawn_turn: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
    for c in convs.values():
        for b in c.get("branches") or []:
            branch_children[b["branch_id"]] = list(b.get("child_conversation_ids") or [])
            branch_start[b["branch_id"]] = b.get("start_timestamp_ms")
        for t in c["turns"]:
            for bid in t.get("branch_ids") or []:
                branch_spawn[bid] = key_of(t)
                spawn_turn[bid] = (c, t)
    for bid, start in branch_start.items():  # as _branch_start_timestamp_ms falls back
        if start is None:
            firsts = [
                convs[k]["turns"][0].get("timestamp_ms")
                for k in branch_children[bid]
                if k in convs and convs[k]["turns"]
            ]
            known = [float(x) for x in firsts if x is not None]
            branch_start[bid] = min(known) if known else None
    rules: dict[Key, Rule] = {}
    spawned_by: dict[str, str] = {}
    for bid, kids in branch_children.items():
        for kid in kids:
            spawned_by[kid] = bid
    for cid, c in convs.items():
        turns = c["turns"]
        for i, t in enumerate(turns):
            k = key_of(t)
            extra = {
                (p["conversation_id"], int(p["turn_index"]))
                for p in t.get("replay_predecessors") or []
            }
            barrier = frozenset(key_of(convs[pc]["turns"][pt]) for pc, pt in extra if pc in convs)
            joins = [
                p["branch_id"]
                for p in t.get("prerequisites") or []
                if p.get("kind") == "spawn_join"
            ]
            if i == 0:
                bid = spawned_by.get(cid)
                if bid is None:
                    rules[k] = Rule(frozenset(), 0.0, "first", barrier)
                    continue
                start = branch_start.get(bid)
                origin = _overlap_origin(*spawn_turn[bid], start)
                kind = "child-first" if origin is None else "child-at-send"
                start = start if origin is None else origin
                off = (
                    0.0
                    if start is None or t.get("timestamp_ms") is None
                    else max(0.0, float(t["timestamp_ms"]) - float(start))
                )
                kids = frozenset(
                    key_of(convs[kid]["turns"][0])
                    for kid in branch_children[bid]
                    if kid in convs and convs[kid]["turns"]
                )
                rules[k] = Rule(frozenset({branch_spawn[bid]}), off, kind, barrier, kids)
                continue
            prev = key_of(turns[i - 1])
            if joins:
                waits = {prev}
                for bid in joins:
                    for kid in branch_children.get(bid, []):
                        if kid in convs and convs[kid]["turns"]:
                            waits.add(key_of(convs[kid]["turns"][-1]))
                rules[k] = Rule(frozenset(waits), float(t.get("delay_ms") or 0.0), "join", barrier)
                continue
            rules[k] = Rule(frozenset({prev}), float(t.get("delay_ms") or 0.0), "next", barrier)
    return rules


def _overlap_origin(
    conv: Mapping[str, Any], turn: Mapping[str, Any], branch_start: float | None
) -> float | None:
    """The spawning turn's ``timestamp_ms`` when AIPerf's runtime dispatches the branch at
    that turn's send (``BranchOrchestrator.on_credit_issued``: a root conversation's turn in
    a replay scope, with an ``api_time_ms`` above 0, and the branch's start before the
    turn's recorded end); None otherwise."""
    ts, api = turn.get("timestamp_ms"), turn.get("api_time_ms")
    if conv.get("agent_depth", 0) != 0 or conv.get("replay_scope_id") is None:
        return None
    if ts is None or api is None or float(api) <= 0 or branch_start is None:
        return None
    return float(ts) if branch_start < float(ts) + float(api) else None


OUR_KINDS = {
    "root": "first",
    "next": "next",
    "join": "join",
    "child": "child-first",
    "after": "after",
}
"""``replay.agentx.Rule`` kinds -> the kinds of ``Rule`` here."""


def session_keys(s: PlannedSession, ix: TraceIndex) -> list[Key]:
    """The trace key of every request of one of our planned sessions: the k-th call of
    agent A in the session is the k-th call of A in its trace."""
    rank: dict[str, int] = {}
    keys: list[Key] = []
    for q in s.requests:
        a = q.agent_id or MAIN
        keys.append(ix.streams[(s.session_id, a)][rank.get(a, 0)])
        rank[a] = rank.get(a, 0) + 1
    return keys


def ours_rules(plan: Plan, ix: TraceIndex, tree_idle_cap_ns: int | None = None) -> dict[Key, Rule]:
    """Our rule per request: what ``--timing agentx`` applies, ``replay.agentx.stream_rules``
    on the session's ``capped_times`` (``tree_idle_cap_ns``: the run's trace idle cap), with
    its dependencies as the wait set, its barrier and branch (keys by ``session_keys``)."""
    from agent_replay.replay.agentx import capped_times, stream_rules

    rules: dict[Key, Rule] = {}
    for s in plan.sessions:
        keys = session_keys(s, ix)
        offsets, thinks = capped_times(s.requests, tree_idle_cap_ns)
        for p, r in enumerate(stream_rules(s.requests, offsets, thinks)):
            kind = "child-at-send" if r.at_send else OUR_KINDS[r.kind]
            rules[keys[p]] = Rule(
                frozenset(keys[d] for d in s.requests[p].deps),
                r.delay_ns / 1e6,
                kind,
                frozenset(keys[d] for d in r.barrier),
                frozenset(keys[d] for d in r.branch),
            )
    return rules


def read_plan(trace: str | Path) -> Plan:
    """Our plan of an imported trace, as ``agent-replay run`` builds it."""
    from agent_replay.replay.plan import PlanOptions, build_plan
    from agent_replay.traces.io import read_trace

    table, meta = read_trace(trace)
    return build_plan(table, meta.block_size, PlanOptions())


@dataclass(frozen=True, slots=True)
class RuleDiff:
    key: Key
    aiperf: Rule | None
    ours: Rule | None
    what: str


def direct_waits(k: Key, rules: Mapping[Key, Rule]) -> frozenset[Key]:
    """``k``'s wait set without the requests another of its waits already waits for,
    directly or not (a wait implied by the others changes nothing)."""
    waits = rules[k].waits_for if k in rules else frozenset()

    def ancestors(x: Key) -> set[Key]:
        seen: set[Key] = set()
        todo = list(rules[x].waits_for) if x in rules else []
        while todo:
            y = todo.pop()
            if y not in seen:
                seen.add(y)
                todo.extend(rules[y].waits_for if y in rules else ())
        return seen

    implied: set[Key] = set()
    for w in waits:
        implied |= ancestors(w)
    return frozenset(waits - implied)


def compare_rules(
    a: Mapping[Key, Rule], o: Mapping[Key, Rule], *, tol_ms: float = 1.0
) -> list[RuleDiff]:
    """Every request whose direct wait set (``direct_waits``), barrier, branch, kind or delay
    differs between the two plans, in key order."""
    out: list[RuleDiff] = []
    for k in sorted(set(a) | set(o), key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        ra, ro = a.get(k), o.get(k)
        if ra is None or ro is None:
            out.append(RuleDiff(k, ra, ro, "only in " + ("ours" if ra is None else "AIPerf")))
            continue
        what = []
        wa, wo = direct_waits(k, a), direct_waits(k, o)
        if wa != wo:
            only_a = sorted(map(key_str, wa - wo))
            only_o = sorted(map(key_str, wo - wa))
            what.append(f"waits: AIPerf also for {only_a or '-'}, ours also for {only_o or '-'}")
        if ra.barrier != ro.barrier:
            what.append(
                f"barrier: AIPerf also for {sorted(map(key_str, ra.barrier - ro.barrier)) or '-'}, "
                f"ours also for {sorted(map(key_str, ro.barrier - ra.barrier)) or '-'}"
            )
        if ra.branch != ro.branch:
            what.append(
                f"branch: AIPerf with {sorted(map(key_str, ra.branch - ro.branch)) or '-'}, "
                f"ours with {sorted(map(key_str, ro.branch - ra.branch)) or '-'}"
            )
        if ra.kind != ro.kind:
            what.append(f"kind: AIPerf {ra.kind}, ours {ro.kind}")
        if abs(ra.delay_ms - ro.delay_ms) > tol_ms:
            what.append(
                f"delay: AIPerf {ra.delay_ms:,.0f} ms, ours {ro.delay_ms:,.0f} ms "
                f"({ra.delay_ms - ro.delay_ms:+,.0f})"
            )
        if what:
            out.append(RuleDiff(k, ra, ro, "; ".join(what)))
    return out


# -- the measured schedule -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Gap:
    """One measured send: its gap after the latest awaited end, and the gap its rule
    planned for it in that play (ms)."""

    gap_ms: float
    planned_ms: float


def measured_gaps(sent: Sequence[Sent], rules: Mapping[Key, Rule]) -> dict[Key, list[Gap]]:
    """Per request key, over every play it was measured in: the gap (ms) from the end of
    the latest request it waits for (by ``rules``, the side's own plan; for a
    ``child-at-send``, from the spawning turn's send) in the same play to its send, beside the gap planned: the rule's delay, or 0 for a join whose latest
    awaited end is a subagent's (it goes at once). A request is left out when it is a
    warm-up, failed, or when any request it waits for was not sent in that play outside
    warm-up (the first request of a play, or one after a sampled start)."""
    by_play: dict[tuple[int, str], dict[Key, Sent]] = defaultdict(dict)
    for s in sent:
        play = by_play[(s.run, s.play)]
        if not s.warmup or s.key not in play:  # a measured send wins over a warm-up
            play[s.key] = s
    out: dict[Key, list[Gap]] = defaultdict(list)
    for play in by_play.values():
        for k, s in play.items():
            if s.warmup or s.error:
                continue
            rule = rules.get(k)
            if rule is None or not rule.waits_for:
                continue
            deps = [play.get(d) for d in rule.waits_for]
            if any(d is None or d.warmup or d.end_ns is None for d in deps):
                continue
            ends = {d.key: d.end_ns for d in deps if d is not None and d.end_ns is not None}
            latest = max(ends.values())
            if rule.kind == "child-at-send":  # counts from the spawning turn's send
                latest = max(d.send_ns for d in deps if d is not None)
            planned = rule.delay_ms
            if rule.kind == "join":
                own = [e for d, e in ends.items() if play[d].stream == s.stream]
                if not own or max(own) < latest:
                    planned = 0.0
            out[k].append(Gap((s.send_ns - latest) / 1e6, planned))
    return dict(out)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default, ``method="linear"``); q in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median(xs: Sequence[float]) -> float:
    return percentile(xs, 50.0)


@dataclass(frozen=True, slots=True)
class GapDiff:
    """Medians of one request's measured and planned gaps on each side (ms)."""

    key: Key
    aiperf_ms: float
    ours_ms: float
    n_aiperf: int
    n_ours: int
    plan_aiperf_ms: float = math.nan
    plan_ours_ms: float = math.nan

    @property
    def diff_ms(self) -> float:
        return self.aiperf_ms - self.ours_ms


def compare_gaps(a: Mapping[Key, list[Gap]], o: Mapping[Key, list[Gap]]) -> list[GapDiff]:
    """Per request measured on both sides: the median gap and median planned gap of each."""

    def med(xs: list[Gap]) -> tuple[float, float]:
        return _median([x.gap_ms for x in xs]), _median([x.planned_ms for x in xs])

    out = []
    for k in sorted(set(a) & set(o), key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        (ga, pa), (go, po) = med(a[k]), med(o[k])
        out.append(GapDiff(k, ga, go, len(a[k]), len(o[k]), pa, po))
    return out


CAP_SLACK_MS = 50.0


def classify(g: GapDiff, plan_differs: bool) -> str:
    """Why a measured gap may differ: ``plan`` when the two plans differ for the request
    (``compare_rules`` lists it); ``idle-cap`` when a side sent it sooner than its planned
    gap (by more than ``CAP_SLACK_MS``: its system idle cap, which depends on what else was
    in flight, moved it); else ``lag``: both sent it after the full planned gap, so the
    difference is the two clients' dispatch lag."""
    if plan_differs:
        return "plan"
    if g.aiperf_ms < g.plan_aiperf_ms - CAP_SLACK_MS or g.ours_ms < g.plan_ours_ms - CAP_SLACK_MS:
        return "idle-cap"
    return "lag"


def summarize(diffs: Sequence[float]) -> dict[str, float | int]:
    """p50 / p99 / max of |difference| (ms), with the count."""
    ab = [abs(d) for d in diffs]
    return {
        "n": len(ab),
        "p50_ms": percentile(ab, 50),
        "p99_ms": percentile(ab, 99),
        "max_ms": max(ab) if ab else math.nan,
    }


# -- the warm-up ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WarmUps:
    """One run's warm-up as sent: each warm-up's send, and the first measured send, in ms
    after the run's first warm-up send."""

    run: int
    sends: dict[Key, float]
    measured_start_ms: float | None


def warmups(sent: Iterable[Sent]) -> dict[int, WarmUps]:
    """Per run: its warm-ups' sends and its first measured send, after its first warm-up."""
    by_run: dict[int, list[Sent]] = defaultdict(list)
    for s in sent:
        by_run[s.run].append(s)
    out: dict[int, WarmUps] = {}
    for run, xs in by_run.items():
        warm = [s for s in xs if s.warmup]
        if not warm:
            continue
        t0 = min(s.send_ns for s in warm)
        measured = [s.send_ns for s in xs if not s.warmup]
        out[run] = WarmUps(
            run,
            {s.key: (s.send_ns - t0) / 1e6 for s in warm},
            (min(measured) - t0) / 1e6 if measured else None,
        )
    return out


# -- tokens ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TokenDiff:
    key: Key
    trace_in: int
    aiperf_in: float
    ours_in: float
    trace_out: int
    aiperf_out: float
    ours_out: float


def compare_tokens(sent: Sequence[Sent], ix: TraceIndex) -> list[TokenDiff]:
    """Per request sent by both sides outside warm-up: median server prompt and completion
    tokens of each, beside the trace's ``in`` / ``out``."""
    vals: dict[tuple[str, Key], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for s in sent:
        if s.warmup or s.error or s.input_tokens is None or s.output_tokens is None:
            continue
        v = vals[(s.side, s.key)]
        v[0].append(float(s.input_tokens))
        v[1].append(float(s.output_tokens))
    keys = {k for side, k in vals if side == "aiperf"} & {k for side, k in vals if side == "ours"}
    out = []
    for k in sorted(keys, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        c = ix.calls[k]
        a, o = vals[("aiperf", k)], vals[("ours", k)]
        out.append(
            TokenDiff(
                k,
                c.input_tokens,
                _median(a[0]),
                _median(o[0]),
                c.output_tokens,
                _median(a[1]),
                _median(o[1]),
            )
        )
    return out


# -- the score ---------------------------------------------------------------------------------
def interactivity(sent: Iterable[Sent]) -> dict[str, float | int]:
    """AgentX interactivity (tokens/s/user): 1 / P90 over requests of
    (E2EL - TTFT) / (OSL - 1), linear-interpolation percentile, over non-error, non-warm-up
    requests with OSL > 1, parents and subagents pooled. Also returns the count."""
    r: list[float] = []
    for s in sent:
        if s.warmup or s.error or s.end_ns is None or s.first_token_ns is None:
            continue
        if s.output_tokens is None or s.output_tokens <= 1:
            continue
        r.append((s.end_ns - s.first_token_ns) / 1e9 / (s.output_tokens - 1))
    p90 = percentile(r, 90.0)
    return {
        "n": len(r),
        "p90_s_per_token": p90,
        "tok_s_user": (1.0 / p90) if r and p90 > 0 else math.nan,
    }


def north_star(sent: Iterable[Sent]) -> dict[str, float | int]:
    """InferenceX AgentX's North Star (tokens/s/user): 1 / P90 over requests of E2EL / OSL,
    E2EL from the send (a new connection's connect time inside), linear-interpolation
    percentile, over non-error, non-warm-up requests with OSL >= 1, parents and subagents
    pooled (``analysis.definitions.e2e_per_token`` for a results folder). Also the count."""
    r: list[float] = []
    for s in sent:
        if s.warmup or s.error or s.end_ns is None or not s.output_tokens or s.output_tokens < 1:
            continue
        r.append((s.end_ns - s.send_ns) / 1e9 / s.output_tokens)
    p90 = percentile(r, 90.0)
    return {
        "n": len(r),
        "p90_s_per_token": p90,
        "tok_s_user": (1.0 / p90) if r and p90 > 0 else math.nan,
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min, max and (max - min) / mean of replicate values."""
    xs = [v for v in values if not math.isnan(v)]
    if not xs:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "rel_range": math.nan}
    mean = sum(xs) / len(xs)
    return {
        "mean": mean,
        "min": min(xs),
        "max": max(xs),
        "rel_range": (max(xs) - min(xs)) / mean if mean else math.nan,
    }
