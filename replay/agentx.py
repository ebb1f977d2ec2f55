"""``--timing agentx``: replay comparable with InferenceX AgentX (AIPerf's
``inferencex-agentx-mvp`` scenario, alone or with InferenceX's AgentX settings, and its
``agentic_replay`` timing), on the same results and reports as every run.

* ``lanes`` (``--concurrency``) session trees are live at once. A lane that finishes a tree
  takes the next session of the plan (cycling): recycling. Every play gets its own
  ``clone`` number, and with it a fresh cache-bust marker at the first user turn (see
  ``cache_bust``): the tools + system prefix stays shareable between plays, the
  conversation does not.
* Start point (``first_play``): each lane's first play is cut at an instant t* drawn
  uniformly in ``start_range`` of its session's time span, from numpy's ``default_rng``
  seeded with the first 8 bytes (big-endian) of sha256(``"{seed}:{session}:{lane}"``), as
  AIPerf seeds its trajectory lanes: the requests at or after t* are played.
* Warm-up (``warm_spread``): before the measured phase, every stream of every lane (the
  main agent and each subagent) that has requests both before and at or after t* sends its
  last request before t* with its full prompt and one output token (flagged ``warmup``,
  left out of every statistic). They are spread as AIPerf spreads them: a warm-up whose
  turn was recorded ``lead`` before its lane's t* goes at (the longest lead of all lanes -
  ``lead``) after the warm-up starts, so that every lane's t* falls at the same instant;
  with a trace idle cap, each lead is capped to it first; the system idle cap moves these
  waits like any other. Then ``warmup_requests`` more turns of each first play back to
  back, also flagged. The measured phase starts when the last warm-up has ended, for every
  lane at once; the duration counts from there (the warm-up has no deadline of its own).
* First play: a request whose dependencies were all before t* goes at (its ``t`` - t*)
  after the measured phase starts (with a trace idle cap, the lane's leading idle is
  capped too, as AIPerf's ``_leading_idle_shift_ms``); a recycled play's first request goes
  at once. Dependencies on requests left out count as met.
* Inside a tree (``stream_rules``), per request kind: a stream's next turn goes its
  end-to-start delay after the stream's previous turn ends; a subagent's first turn goes
  (its ``t`` - its branch's start) after the spawning turn ends, the branch being the
  subagents with the same spawning and joining turns (the main agent's flattened agents
  a branch apart) and its start the earliest of their first ``t``; a join turn goes the
  moment its last subagent ends when a subagent was still running at the end of the
  parent's previous turn, else its end-to-start delay after that turn (AIPerf's
  ``BranchOrchestrator``). Then no request goes before the calls of its barrier ended
  (``interval_barriers``: AIPerf's recorded-interval waits between an agent and its
  flattened agents; left-out calls count as ended). With ``tree_idle_cap_ns`` every
  recorded stretch where nothing of the tree was in flight is shortened to at most that
  first (AIPerf's trace idle gap cap; ``idle_warp``).
* System idle cap (AIPerf's ``system_idle_gap_cap_seconds``): when nothing at all is in
  flight, the idle time before the next send is at most ``idle_cap_ns``; every waiting
  request's intended send time moves earlier by the same amount (the skip), except a
  subagent's first turn waiting out its branch offset (AIPerf sleeps that outside its
  scheduler, so the cap does not move it). A request's recorded ``think_ns`` is then the
  think time it got.
* Context overflow (``overflow_ends``): a request answered with a context-length error
  (``replay.validity.OVERFLOW_RULES``, AIPerf's list by default) that is not its stream's
  last turn ends its stream in that play, as AIPerf ends a
  trajectory's stream: the stream's later turns, and the subagents it or they would spawn,
  are not sent (``dropped``); a join of another stream goes as if the ended stream had
  ended then; the lane takes its next play when the rest of the tree is done.
* Lanes stop starting requests at the duration: a request due after it is not sent, nor
  are the rest of its tree, and a lane whose play was cut starts no other; requests in
  flight finish.
* Validity (``replay.validity.agentx_validity``, written to run.json by the run): the rules
  in its text.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agent_replay.replay.clock import Clock
from agent_replay.replay.driver import Driver, Transport, _SessionState
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest, PlannedSession, stable_hash
from agent_replay.replay.validity import (
    DEFAULT_OVERFLOW_RULE,
    MAX_OVERFLOW_FRACTION,
    ValidityInput,
    ValidityRules,
    agentx_validity,
    coverage_ratio,
    is_overflow,
)
from agent_replay.traces.importers.weka_chains import flat_owner, interval_waits
from agent_replay.traces.tree import MAIN

__all__ = [
    "DEFAULT_DURATION_S",
    "IDLE_CAP_NS",
    "MAX_OVERFLOW_FRACTION",
    "AgentXDriver",
    "LaneStart",
    "Rule",
    "ValidityInput",
    "ValidityRules",
    "agentx_validity",
    "cache_bust",
    "capped_times",
    "coverage_ratio",
    "first_play",
    "first_plays",
    "idle_warp",
    "is_overflow",
    "lane_seed",
    "overflow_ends",
    "play_starts",
    "sample_t_star",
    "stream_rules",
    "warm_spread",
]

IDLE_CAP_NS = 10_000_000_000
"""AIPerf's ``system_idle_gap_cap_seconds`` of both AgentX scenarios (10 s)."""
DEFAULT_DURATION_S = 1800.0
START_RANGE = (0.25, 0.75)


def cache_bust(q: PlannedRequest, play: int) -> PlannedRequest:
    """Request ``q`` in play ``play`` with AIPerf's ``first_turn_prefix`` cache bust: a
    marker ``[rid:<hex>]`` opens the first user turn, so in block terms the blocks before it
    (``q.shared_blocks``, the tools + system prefix) keep the trace's own ids and stay
    shared between plays, and every block from it on gets an id of this play (one id per
    trace id, so the sharing inside a play is kept). Without a known prefix, every block
    is the play's own (``clone``)."""
    k = q.shared_blocks
    if k <= 0:
        return replace(q, clone=play)
    ids = q.hash_ids[:k] + [-1 - (stable_hash("rid", play, h) >> 2) for h in q.hash_ids[k:]]
    return replace(q, clone=play, prompt_clone=0, hash_ids=ids)


def idle_warp(reqs: list[PlannedRequest], cap_ns: int) -> Callable[[int], int]:
    """AIPerf's trace idle gap cap as a warp of one session's clock: every stretch where
    nothing of the session was in flight (recorded ``offset_ns`` to ``offset_ns +
    service_ns``) longer than ``cap_ns`` is shortened to it; returns t -> the time removed
    before t. A request's think time loses the part removed between its latest
    dependency's end and its arrival (idle stretches lie wholly inside that or outside)."""
    gaps: list[tuple[int, int]] = []  # (end of the stretch, time removed)
    busy: int | None = None
    for start, end in sorted((q.offset_ns, q.offset_ns + (q.service_ns or 0)) for q in reqs):
        if busy is not None and start - busy > cap_ns:
            gaps.append((start, start - busy - cap_ns))
        busy = end if busy is None else max(busy, end)

    def removed(t: int) -> int:
        return sum(cut for end, cut in gaps if end <= t)

    return removed


def capped_times(reqs: list[PlannedRequest], cap_ns: int | None) -> tuple[list[int], list[int]]:
    """(offsets, think times) of a session's requests with its idle stretches capped at
    ``cap_ns`` (``idle_warp``; None: as recorded). A think time whose dependency's end is
    unknown is capped at ``cap_ns`` itself."""
    if cap_ns is None:
        return [q.offset_ns for q in reqs], [q.think_ns for q in reqs]
    removed = idle_warp(reqs, cap_ns)
    offsets = [q.offset_ns - removed(q.offset_ns) for q in reqs]
    thinks = []
    for q in reqs:
        ends = [reqs[d].offset_ns + svc for d in q.deps if (svc := reqs[d].service_ns) is not None]
        if q.deps and len(ends) == len(q.deps):
            thinks.append(max(0, q.think_ns - (removed(q.offset_ns) - removed(max(ends)))))
        else:
            thinks.append(min(q.think_ns, cap_ns))
    return offsets, thinks


@dataclass(frozen=True, slots=True)
class Rule:
    """When one request of a session goes, once its dependencies completed.

    ``kind``: ``root`` (no dependency: at its offset), ``next`` (``delay_ns`` after the
    end of ``prev``, the previous turn of its stream), ``join`` (the moment the last of its
    other dependencies ends if that is after ``prev``'s end, else as ``next``), ``child``
    (a subagent's first turn: ``delay_ns`` after the end of ``anchor``, the turn that
    spawned it, a wait the system idle cap does not shorten) or ``after`` (``delay_ns``
    after the latest dependency's end: a request with no dependency in its own stream
    that is not a stream's first). ``deps``: the request's dependencies. ``barrier``:
    requests it is also held back for (``interval_barriers``): it goes at the later of its
    rule's time and the last of their ends. ``branch``: for a ``child``, the first turns of
    every agent of its branch (their offsets count from the branch's start). ``at_send``:
    a ``child`` whose branch started while its spawning main-agent turn was in flight in the
    recording goes ``delay_ns`` (its offset minus the spawning turn's) after that turn is
    sent, not after it ends (``overlaps_spawn``)."""

    kind: str
    delay_ns: int
    prev: int | None = None
    anchor: int | None = None
    deps: tuple[int, ...] = ()
    barrier: tuple[int, ...] = ()
    branch: tuple[int, ...] = ()
    at_send: bool = False


def interval_barriers(reqs: list[PlannedRequest], offsets: list[int]) -> list[tuple[int, ...]]:
    """AIPerf's recorded-interval waits (its ``infer_cross_stream_predecessors``, one replay
    scope at a time): an agent and the flattened agents split off it (``fa:NNN`` off the
    main agent, ``<subagent>:fa:NNN`` off a subagent) form a scope, and in a scope of two or
    more streams each request is held back for the requests ``weka_chains.interval_waits``
    names (on ``offsets``; a request without a service time ends at its start). Positions
    as in ``reqs``."""
    out: list[tuple[int, ...]] = [()] * len(reqs)
    for pos in _replay_scopes(reqs).values():
        streams = [reqs[p].agent_id for p in pos]
        if len(set(streams)) < 2:
            continue
        starts = [offsets[p] for p in pos]
        ends = [offsets[p] + max(0, reqs[p].service_ns or 0) for p in pos]
        for k, waits in enumerate(interval_waits(streams, starts, ends)):
            out[pos[k]] = tuple(pos[w] for w in waits)
    return out


def _replay_scopes(reqs: list[PlannedRequest]) -> dict[str, list[int]]:
    """The positions of each replay scope: an agent with the flattened agents split off it."""
    scopes: dict[str, list[int]] = {}
    for p, q in enumerate(reqs):
        owner = flat_owner(q.agent_id)
        scopes.setdefault(q.agent_id if owner is None else owner, []).append(p)
    return scopes


def branch_key(
    reqs: list[PlannedRequest], first: int, join: int | None
) -> tuple[int, int | None, bool]:
    """The branch of the agent whose first turn is ``first``: its spawning turn, its
    joining turn (None: background) and whether it is a flattened agent of the main agent.
    AIPerf groups subagents (``spawn:<agent>``, a subagent's own flattened agents in its
    branch) and the main agent's flattened agents (``flatspawn:N``) apart, even when
    spawned and joined by the same turns."""
    return (max(reqs[first].deps), join, flat_owner(reqs[first].agent_id) == MAIN)


def overlaps_spawn(reqs: list[PlannedRequest], offsets: list[int], anchor: int, start: int) -> bool:
    """Whether a branch starting at ``start`` overlapped its spawning turn ``anchor`` in the
    recording: AIPerf then dispatches it when that turn is sent (its runtime's
    ``BranchOrchestrator.on_credit_issued``: a turn of a root conversation with a recorded
    ``api_time``, a branch whose start is before the turn's recorded end), each child at its
    offset from the turn's start."""
    svc = reqs[anchor].service_ns
    return (
        (reqs[anchor].agent_id or MAIN) == MAIN
        and svc is not None
        and svc > 0
        and start < offsets[anchor] + svc
    )


def _child_rule(
    reqs: list[PlannedRequest],
    offsets: list[int],
    p: int,
    start: int,
    branch: tuple[int, ...],
    bar: tuple[int, ...],
) -> Rule:
    """The rule of a subagent's first turn ``p``, its branch starting at ``start``."""
    anchor = max(reqs[p].deps)
    if overlaps_spawn(reqs, offsets, anchor, start):
        return Rule(
            "child",
            max(0, offsets[p] - offsets[anchor]),
            anchor=anchor,
            deps=tuple(reqs[p].deps),
            barrier=bar,
            branch=branch,
            at_send=True,
        )
    return Rule(
        "child",
        max(0, offsets[p] - start),
        anchor=anchor,
        deps=tuple(reqs[p].deps),
        barrier=bar,
        branch=branch,
    )


def stream_rules(reqs: list[PlannedRequest], offsets: list[int], thinks: list[int]) -> list[Rule]:
    """AIPerf's agentic replay rule for every request of a session (positions as in
    ``reqs``; ``offsets`` and ``thinks`` as ``capped_times`` gives them).

    * a stream's next turn (its only dependency the stream's previous turn): the think
      time, end-to-start;
    * a join (also waiting for other streams): end-to-start after the stream's previous
      turn, ``offset - (offset_prev + service_prev)`` floored at 0 (an unknown service
      time counts as 0: AIPerf's start-to-start gap);
    * a subagent's first turn: its offset minus its branch's start, the branch being the
      agents spawned by the same turn and joined by the same turn (or by none), subagents
      apart from the main agent's flattened agents (``branch_key``), its start the earliest
      first offset among them; counted from the spawning turn's end, or from its send when
      the branch overlapped it (``overlaps_spawn``: then its offset minus the turn's);
    * every request: the barrier of ``interval_barriers``.
    """
    branches = _Branches.of(reqs, offsets)
    barriers = interval_barriers(reqs, offsets)
    out: list[Rule] = []
    for p, q in enumerate(reqs):
        deps, bar = tuple(q.deps), barriers[p]
        own = [d for d in q.deps if reqs[d].agent_id == q.agent_id]
        if not q.deps:
            out.append(Rule("root", 0, deps=deps, barrier=bar))
        elif own:
            out.append(
                _stream_rule(reqs, p, max(own), len(own) == len(q.deps), offsets, thinks, bar)
            )
        elif p == branches.first_of[q.agent_id]:
            out.append(branches.child_rule(reqs, p, offsets, bar))
        else:
            out.append(Rule("after", thinks[p], deps=deps, barrier=bar))
    return out


def _stream_rule(
    reqs: list[PlannedRequest],
    p: int,
    prev: int,
    only_own: bool,
    offsets: list[int],
    thinks: list[int],
    bar: tuple[int, ...],
) -> Rule:
    """The rule of a turn after ``prev``, its stream's previous turn: ``next`` when that is
    its only kind of dependency, else ``join`` (end-to-start, floored at 0)."""
    deps = tuple(reqs[p].deps)
    if only_own:
        return Rule("next", thinks[p], prev=prev, deps=deps, barrier=bar)
    delay = max(0, offsets[p] - offsets[prev] - (reqs[prev].service_ns or 0))
    return Rule("join", delay, prev=prev, deps=deps, barrier=bar)


BranchKey = tuple[int, int | None, bool]


@dataclass
class _Branches:
    """Each stream's first turn, and the branches of the spawned streams (``branch_key``):
    which branch a stream is in, the branch's start (its earliest first offset) and the
    first turns of its members."""

    first_of: dict[str, int]
    branch_of: dict[str, BranchKey]
    start: dict[BranchKey, int]
    members: dict[BranchKey, list[int]]

    @classmethod
    def of(cls, reqs: list[PlannedRequest], offsets: list[int]) -> _Branches:
        first_of: dict[str, int] = {}
        for p, q in enumerate(reqs):
            first_of.setdefault(q.agent_id, p)
        join_of = _joins(reqs)
        b = cls(first_of, {}, {}, {})
        for a, p in first_of.items():
            if reqs[p].deps:
                key = branch_key(reqs, p, join_of.get(a))
                b.branch_of[a] = key
                b.start[key] = min(b.start.get(key, offsets[p]), offsets[p])
                b.members.setdefault(key, []).append(p)
        return b

    def child_rule(
        self, reqs: list[PlannedRequest], p: int, offsets: list[int], bar: tuple[int, ...]
    ) -> Rule:
        """A subagent's first turn, its branch's start and members from the table
        (``_child_rule``)."""
        key = self.branch_of[reqs[p].agent_id]
        return _child_rule(reqs, offsets, p, self.start[key], tuple(self.members[key]), bar)


def _joins(reqs: list[PlannedRequest]) -> dict[str, int]:
    """For each stream, the first turn of another stream that waits for its last turn."""
    last_of = {q.agent_id: p for p, q in enumerate(reqs)}
    join_of: dict[str, int] = {}
    for p, q in enumerate(reqs):
        for d in q.deps:
            a = reqs[d].agent_id
            if a != q.agent_id and d == last_of[a]:
                join_of.setdefault(a, p)
    return join_of


def overflow_ends(reqs: list[PlannedRequest], rules: list[Rule], p: int) -> set[int]:
    """The requests of a play that a context overflow of request ``p`` leaves unsent (AIPerf
    ends a trajectory's stream at an overflow on any turn but its last): the later turns of
    ``p``'s stream, and every stream that ``p`` or one of those turns would have spawned
    (a subagent whose first turn's ``anchor`` is among them), with its own later spawns.
    A child dispatched at ``p``'s send (``Rule.at_send``) is on its way already.
    Empty when ``p`` is its stream's last turn (AIPerf spawns that turn's subagents). A
    join of another stream still goes: a dropped request counts as ended when dropped."""
    agent = [q.agent_id for q in reqs]
    dead = _turns_from(agent, p + 1, agent[p])
    if not dead:
        return set()
    ended = dead | {p}
    first_of: dict[str, int] = {}
    for i, a in enumerate(agent):
        first_of.setdefault(a, i)
    while spawned := [
        a for a, f in first_of.items() if f not in dead and _spawned_by(rules[f], ended, p)
    ]:
        for a in spawned:
            stream = _turns_from(agent, first_of[a], a)
            dead |= stream
            ended |= stream
    return dead


def _turns_from(agent: list[str], start: int, a: str) -> set[int]:
    """The positions of stream ``a``'s turns from ``start`` on."""
    return {i for i in range(start, len(agent)) if agent[i] == a}


def _spawned_by(r: Rule, turns: set[int], overflowed: int) -> bool:
    """Whether ``r`` is a subagent's first turn spawned by one of ``turns``, and not one
    already dispatched at the send of ``overflowed`` (``Rule.at_send``)."""
    return r.kind == "child" and r.anchor in turns and not (r.at_send and r.anchor == overflowed)


def _ended(deps: tuple[int, ...], ends: list[int | None], but: int | None) -> list[int]:
    """The ends of the dependencies that ended, ``but`` left out."""
    return [e for d in deps if d != but and (e := ends[d]) is not None]


def _stream_due(r: Rule, ends: list[int | None], latest: int) -> int:
    """A ``next`` or ``join`` turn's time: after its stream's previous turn, or at the end
    of another dependency that outlived it."""
    others = _ended(r.deps, ends, but=r.prev)
    prev_end = None if r.prev is None else ends[r.prev]
    if prev_end is None:
        return latest  # the stream's previous turn was before t*: join at once
    if others and max(others) > prev_end:
        return max(others)  # a subagent outlived the previous turn: join at its end
    return prev_end + r.delay_ns


def _play_rule(r: Rule, pos: dict[int, int]) -> Rule:
    """Rule ``r`` on a play's positions (``pos``: session position -> play position): the
    requests the play leaves out dropped."""

    def kept(ps: Sequence[int]) -> tuple[int, ...]:
        return tuple(pos[d] for d in ps if d in pos)

    anchor = None if r.anchor is None else pos.get(r.anchor)
    return replace(
        r,
        prev=None if r.prev is None else pos.get(r.prev),
        anchor=anchor,
        deps=kept(r.deps),
        barrier=kept(r.barrier),
        branch=kept(r.branch),
        at_send=r.at_send and anchor is not None,
    )


def lane_seed(seed: int, session_id: str, lane: int) -> int:
    """AIPerf's per-(trace, lane) seed: the first 8 bytes of sha256(``"{seed}:{trace}:{lane}"``),
    big-endian."""
    return int.from_bytes(
        hashlib.sha256(f"{seed}:{session_id}:{lane}".encode()).digest()[:8], "big"
    )


def sample_t_star(
    offsets: list[int], lo: float, hi: float, seed: int, session_id: str, lane: int
) -> float:
    """The start instant t* (ms on the session's clock) of lane ``lane``: uniform in
    [first + lo x span, first + hi x span] of the session's request offsets, drawn as AIPerf
    draws it (``numpy.random.default_rng(lane_seed(...)).uniform``, in milliseconds)."""
    ms = [o / 1e6 for o in offsets]
    first, last = min(ms), max(ms)
    a, b = first + lo * (last - first), first + hi * (last - first)
    if b < a:
        b = a
    if a == b:
        return a
    return float(np.random.default_rng(lane_seed(seed, session_id, lane)).uniform(a, b))


@dataclass(frozen=True, slots=True)
class FirstPlay:
    """A lane's first play cut at t*: the positions played (``keep``, at or after t*)
    and the warm-up of every stream live at t* (its last position before t*)."""

    t_star_ns: int
    keep: list[int]
    warm: list[int]


def first_play(reqs: list[PlannedRequest], offsets: list[int], t_star_ms: float) -> FirstPlay:
    """The cut of a session at ``t_star_ms`` (AIPerf's trajectory snapshot): every request
    at or after t* is played; every stream (agent) with requests on both sides warms its
    last one before t*."""
    keep = [p for p, o in enumerate(offsets) if o / 1e6 >= t_star_ms]
    kept = set(keep)
    last_before: dict[str, int] = {}
    live: set[str] = set()
    for p, q in enumerate(reqs):
        if p in kept:
            live.add(q.agent_id)
        else:
            last_before[q.agent_id] = p
    warm = sorted(p for a, p in last_before.items() if a in live)
    return FirstPlay(round(t_star_ms * 1e6), keep, warm)


def warm_spread(leads_ns: list[int], cap_ns: int | None) -> list[int]:
    """AIPerf's spread warm-up (``AgenticReplayStrategy._execute_warmup``): the send time,
    after the warm-up starts, of warm-ups whose warmed turns were recorded ``leads_ns``
    before their lanes' t*. Each lead is capped at ``cap_ns`` (the trace idle cap; None:
    none); the longest goes at 0 and every other at (longest - its lead), so that every
    lane's t* falls at the same instant, the warm-up's planned end."""
    capped = [lead if cap_ns is None else min(lead, cap_ns) for lead in leads_ns]
    top = max(capped, default=0)
    return [top - lead for lead in capped]


def play_starts(
    reqs: list[PlannedRequest],
    keep: list[int],
    offsets: list[int],
    t_star_ns: int,
    tree_idle_cap_ns: int | None,
) -> dict[int, int]:
    """When each request of a play cut at t* goes after the play starts, for a request
    none of whose dependencies is played: (its offset - t*), floored at 0; with a trace
    idle cap, the play's leading idle (t* to its earliest such request) is capped to it
    by moving all of them alike (AIPerf's ``_leading_idle_shift_ms``). A recycled play
    (t* its first offset) starts its first request at once. Every position of ``keep`` is
    in the result: a request with dependencies falls back to it only when none of them
    started."""
    kept = set(keep)
    roots = [offsets[p] - t_star_ns for p in keep if not any(d in kept for d in reqs[p].deps)]
    lead = 0
    if tree_idle_cap_ns is not None and roots:
        lead = max(0, min(roots) - tree_idle_cap_ns)
    return {p: max(0, offsets[p] - t_star_ns - lead) for p in keep}


@dataclass(frozen=True, slots=True)
class LaneStart:
    """A lane's first play before it is played: its session, the session's (capped)
    offsets and think times, and its cut at t*."""

    lane: int
    session: PlannedSession
    offsets: list[int]
    thinks: list[int]
    cut: FirstPlay

    def warm_leads(self) -> list[int]:
        """How long before t* each warm-up's turn was recorded (ns), in ``cut.warm`` order."""
        return [self.cut.t_star_ns - self.offsets[p] for p in self.cut.warm]


def first_plays(
    plan: Plan,
    lanes: int,
    *,
    seed: int,
    start_range: tuple[float, float],
    tree_idle_cap_ns: int | None,
    first_lane: int = 0,
) -> list[LaneStart]:
    """Every lane's first play: lane k plays the plan's k-th session (cycling), cut at the
    t* drawn for it (``sample_t_star``, the run-wide lane ``first_lane + k`` seeding it)."""
    out = []
    lo, hi = start_range
    for k in range(lanes):
        s = plan.sessions[k % len(plan.sessions)]
        offsets, thinks = capped_times(s.requests, tree_idle_cap_ns)
        t_star = sample_t_star(offsets, lo, hi, seed, s.session_id, first_lane + k)
        out.append(LaneStart(k, s, offsets, thinks, first_play(s.requests, offsets, t_star)))
    return out


@dataclass
class _Live:
    """A play in progress: its requests, their state, which completed."""

    session: PlannedSession
    st: _SessionState
    pos_of: dict[int, int]
    finished: set[int] = field(default_factory=set)

    def over(self) -> bool:
        """Every request completed or was cut: the lane is about to start its next play."""
        ev = self.st.events
        return all(p in self.finished or ev[p].is_set() for p in range(len(ev)))

    def ready(self) -> int:
        """Requests whose dependencies all completed and that have not completed: each is
        waiting for its send time, in flight, or about to be scheduled."""
        done = self.st.events
        n = 0
        for p, q in enumerate(self.session.requests):
            if p in self.finished or done[p].is_set():
                continue
            if all(done[d].is_set() or d in self.finished for d in q.deps):
                n += 1
        return n


@dataclass
class _Lane:
    """A lane's first play, chosen before the warm-up phase."""

    session: PlannedSession
    play: int
    offsets: list[int]
    thinks: list[int]
    cut: FirstPlay


class AgentXDriver(Driver):
    def __init__(
        self,
        plan: Plan,
        transport: Transport,
        clock: Clock,
        *,
        t0_ns: int,
        on_record: Callable[[RequestRecord], None],
        lanes: int,
        seed: int = 0,
        worker: int = 0,
        run_id: str = "run",
        duration_ns: int | None = None,
        lookahead_ns: int = 1_000_000_000,
        start_range: tuple[float, float] = START_RANGE,
        warmup_requests: int = 0,
        idle_cap_ns: int | None = IDLE_CAP_NS,
        tree_idle_cap_ns: int | None = None,
        cache_bust: Callable[[PlannedRequest, int], PlannedRequest] | None = None,
        first_lane: int = 0,
        overflow_rule: str = DEFAULT_OVERFLOW_RULE,
    ) -> None:
        if lanes < 1:
            raise ValueError("agentx needs at least one lane")
        if duration_ns is None:
            duration_ns = int(DEFAULT_DURATION_S * 1e9)
        super().__init__(
            plan,
            transport,
            clock,
            mode="session",
            t0_ns=t0_ns,
            on_record=self._record,
            worker=worker,
            run_id=run_id,
            duration_ns=duration_ns,
            lookahead_ns=lookahead_ns,
        )
        self._user_record = on_record
        self.duration_ns = duration_ns
        self.lanes = lanes
        self.first_lane = first_lane
        """The run-wide index of this driver's lane 0 (lanes seed their start instants)."""
        self.seed = seed
        self.start_range = start_range
        self.warmup_requests = warmup_requests
        self.idle_cap_ns = idle_cap_ns
        self.tree_idle_cap_ns = tree_idle_cap_ns
        self.cache_bust = cache_bust
        self.overflow_rule = overflow_rule
        """``replay.validity.OVERFLOW_RULES``: the responses that end their stream."""
        self.idle_skipped_ns = 0
        self.idle_skips = 0
        self.plays = 0
        self.warmups = 0
        self.dropped = 0
        """Requests not sent because their stream ended on a context overflow."""
        self.measured_start_ns: int | None = None
        """When the measured phase started (the last warm-up's end)."""
        self._cursor = 0
        self._shift = 0
        self._waiting: dict[
            int, int
        ] = {}  # waiter id -> intended send + the shift when it registered
        self._pinned: dict[int, int] = {}  # waiter id -> intended send the idle cap does not move
        self._handoff: int | None = None
        self._pin = False
        self._wake = asyncio.Event()
        self._next_waiter = 0
        self._live: dict[str, _Live] = {}
        self._rules: dict[str, list[Rule]] = {}
        self._settling = 0  # lanes between plays (about to schedule a play's first requests)
        self._idle_since: int | None = None
        self._dead: dict[str, set[int]] = {}  # play -> positions its overflows ended
        self._issue: dict[str, dict[int, int]] = {}  # play -> position -> intended send
        self._failed = asyncio.Event()  # a request task raised (``_lanes_or_failure``)
        self._drop = False
        self.total = 0  # unknown up front: counts as requests start

    # -- the system idle cap ----------------------------------------------------------------
    def _record(self, rec: RequestRecord) -> None:
        if rec.parent_end_ns is not None and rec.think_ns is not None:
            rec.think_ns = rec.intended_ns - rec.parent_end_ns  # after any skipped gap
        if not rec.warmup:
            key = f"{rec.session_id}#{rec.clone}"
            live = self._live.get(key)
            if live is not None and rec.request_index in live.pos_of:
                p = live.pos_of[rec.request_index]
                live.finished.add(p)
                if is_overflow(rec.http_status, rec.error, self.overflow_rule):
                    self._dead.setdefault(key, set()).update(
                        overflow_ends(live.session.requests, self._rules[key], p)
                    )
        self._user_record(rec)
        if self._in_flight() == 0:
            self._idle_since = self.clock.now_ns()
        self._maybe_skip()

    def _in_flight(self) -> int:
        return self.sent - self.done

    def _settled(self) -> bool:
        """Whether every request that can go next is waiting for its send time: none is
        being scheduled (a completion's children wake only after the completion's record)
        and no lane is between plays (or has just finished one)."""
        if self._settling or any(live.over() for live in self._live.values()):
            return False
        ready = sum(live.ready() for live in self._live.values())
        return ready <= len(self._waiting) + len(self._pinned)

    def _maybe_skip(self) -> None:
        if self.idle_cap_ns is None or not self._waiting or self._in_flight() > 0:
            return
        now = self.clock.now_ns()
        since = self._idle_since if self._idle_since is not None else now
        nearest = min(self._waiting.values()) - self._shift
        gap = nearest - max(since + self.idle_cap_ns, now)
        if gap <= 0 or not self._settled():
            return
        self._shift += gap
        self.idle_skipped_ns += gap
        self.idle_skips += 1
        self._wake.set()
        self._wake = asyncio.Event()

    # -- when a request goes -----------------------------------------------------------------
    def _due(
        self, s: PlannedSession, st: _SessionState | None, p: int, parent_end: int | None
    ) -> int:
        """``stream_rules``' send time of request ``p`` of a play (every dependency done),
        then no earlier than the end of its barrier; a subagent's first turn is marked for a
        wait the idle cap does not move."""
        self._pin = False
        self._drop = p in self._dead.get(s.key, ())
        rules = self._rules.get(s.key)
        if rules is None or st is None or (parent_end is None and not rules[p].at_send):
            return super()._due(s, st, p, parent_end)
        r = rules[p]
        ends = st.ends
        held = _ended(r.barrier, ends, but=None)
        if r.at_send and r.anchor is not None:  # spawned when its spawning turn was sent
            self._pin = True
            issued = self._issue.get(s.key, {}).get(r.anchor)
            if issued is None:  # its spawning turn was dropped (an overflow): so is it
                return self.clock.now_ns()
            return max([issued + r.delay_ns] + held)
        mine = _ended(r.deps, ends, but=None)
        if not mine:  # every dependency was before t*: at its offset in the play
            return max([super()._due(s, st, p, None)] + held)
        return max([self._rule_due(r, ends, max(mine))] + held)

    async def _await_deps(self, s: PlannedSession, st: _SessionState | None, p: int) -> int | None:
        """As ``Driver._await_deps``, but a child dispatched at its spawning turn's send
        (``Rule.at_send``) waits for its other dependencies only (None: its time counts
        from that send, ``_due``)."""
        rules = self._rules.get(s.key)
        r = None if rules is None else rules[p]
        if r is None or st is None or not r.at_send or r.anchor is None:
            return await super()._await_deps(s, st, p)
        for d in s.requests[p].deps:
            if d != r.anchor:
                await st.events[d].wait()
        return None

    def _issued(self, s: PlannedSession, p: int, due: int) -> None:
        self._issue.setdefault(s.key, {})[p] = due

    def _rule_due(self, r: Rule, ends: list[int | None], latest: int) -> int:
        """The time rule ``r`` gives a request whose dependencies (``r.deps``) ended,
        the latest at ``latest``."""
        spawned = None if r.anchor is None else ends[r.anchor]
        if r.kind == "child" and spawned is not None:
            self._pin = True
            return max([spawned + r.delay_ns] + _ended(r.deps, ends, but=r.anchor))
        if r.kind in ("next", "join"):
            return _stream_due(r, ends, latest)
        return latest + r.delay_ns

    def _register(self, due: int) -> int:
        """A waiter for ``due`` that idle skips move (from now on); its id."""
        wid = self._next_waiter
        self._next_waiter += 1
        self._waiting[wid] = due + self._shift
        return wid

    def _past_deadline(self, due: int) -> bool:
        """Never decided here: a later idle skip can still bring ``due`` before the
        deadline, so ``_sleep_to`` decides when the deadline comes. The request is
        registered (and may let an idle gap be skipped now); ``_sleep_to``, which the driver
        calls next without yielding, takes the registration over. A request whose stream
        ended on a context overflow is past it: ``_skip`` drops it."""
        if self._drop:
            return True
        if self._pin:
            wid = self._next_waiter
            self._next_waiter += 1
            self._pinned[wid] = due
        else:
            wid = self._register(due)
        self._pin = False
        self._handoff = wid
        self._maybe_skip()
        return False

    def _skip(self, s: PlannedSession, st: _SessionState | None, p: int, t: int) -> None:
        """A request past the deadline is skipped (``Driver._skip``); one whose stream ended
        on a context overflow is dropped: not sent, not planned any more, done now (a join
        waiting for it goes as if its subagent had ended now)."""
        if not self._drop:
            super()._skip(s, st, p, t)
            return
        self._drop = False
        self.dropped += 1
        self.total -= 1
        if st is not None:
            st.ends[p] = self.clock.now_ns()
            st.events[p].set()
            for c in s.requests[p].children:  # each decides for itself: dropped too, or not
                self._spawn(self._request(s, st, c))

    async def _sleep_to(self, due: int) -> int | None:
        """Wait for the (shifted) intended send time and return it; None when the deadline
        comes first (the request is not sent)."""
        wid, self._handoff = self._handoff, None
        if wid is None:
            wid = self._register(due)
        if wid in self._pinned:
            try:
                while True:
                    now = self.clock.now_ns()
                    if now >= due:
                        return due
                    if self.deadline is not None and now >= self.deadline:
                        return None
                    await self.clock.sleep_until(
                        due if self.deadline is None else min(due, self.deadline)
                    )
            finally:
                del self._pinned[wid]
        return await self._wait(wid)

    async def _wait(self, wid: int) -> int | None:
        """Wait for waiter ``wid``'s (shifted) send time and return it; None when the
        deadline comes first."""
        try:
            while True:
                target = self._waiting[wid] - self._shift
                now = self.clock.now_ns()
                if now >= target:
                    return target
                if self.deadline is not None and now >= self.deadline:
                    return None
                self._maybe_skip()
                target = self._waiting[wid] - self._shift
                if self.clock.now_ns() >= target:
                    return target
                if self.deadline is not None:
                    target = min(target, self.deadline)
                wake = self._wake
                sleeper = asyncio.ensure_future(self.clock.sleep_until(target))
                shifted = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait({sleeper, shifted}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for f in (sleeper, shifted):
                        if not f.done():
                            f.cancel()
        finally:
            del self._waiting[wid]

    # -- lanes ---------------------------------------------------------------------------
    async def run(self) -> None:
        if not self.plan.sessions:
            return
        firsts = [
            _Lane(x.session, self._new_play(), x.offsets, x.thinks, x.cut)
            for x in first_plays(
                self.plan,
                self.lanes,
                seed=self.seed,
                start_range=self.start_range,
                tree_idle_cap_ns=self.tree_idle_cap_ns,
                first_lane=self.first_lane,
            )
        ]
        self._cursor = self.lanes
        lanes: list[asyncio.Future[None]] = []
        try:
            if not await self._warm_phase(firsts):
                return
            start = max(self.clock.now_ns(), self.t0)
            self.measured_start_ns = start
            # the measured duration counts from the end of the warm-up (AIPerf runs its
            # warm-up as a phase of its own before the profiling duration)
            self.deadline = start + self.duration_ns
            lanes = [asyncio.ensure_future(self._lane(f, start)) for f in firsts]
            await self._lanes_or_failure(lanes)
        except BaseException:
            for t in lanes:
                t.cancel()
            await self.cancel()
            raise
        while self._tasks:
            await self._idle.wait()
        if self._failure is not None:
            raise self._failure

    async def _lanes_or_failure(self, lanes: list[asyncio.Future[None]]) -> None:
        """Until every lane is done, or a request task failed: a play would then wait
        for that request's dependants forever, so the lanes are cancelled and the failure
        raised (``Driver._task_done`` keeps it)."""
        gathered: asyncio.Future[Any] = asyncio.gather(*lanes)
        failed: asyncio.Future[Any] = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({gathered, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        if gathered.done():
            gathered.result()
            return
        gathered.cancel()
        await asyncio.gather(gathered, return_exceptions=True)
        assert self._failure is not None
        raise self._failure

    def _task_done(self, task: asyncio.Task[None]) -> None:
        super()._task_done(task)
        if self._failure is not None:
            self._failed.set()

    def _next_session(self) -> PlannedSession:
        s = self.plan.sessions[self._cursor % len(self.plan.sessions)]
        self._cursor += 1
        return s

    def _new_play(self) -> int:
        self.plays += 1
        return self.worker * 1_000_000 + self.plays  # clone 0 stays the trace's own

    async def _warm_phase(self, firsts: list[_Lane]) -> bool:
        """Every lane's stream warm-ups spread over their leads (``warm_spread``), then
        each lane's ``warmup_requests`` turns back to back. No deadline cuts any of them
        (AIPerf gives its warm-up phase no duration; ``--duration`` counts from its end), so
        a warm-up longer than the duration still leaves a measured phase; False when the
        run failed meanwhile."""
        items = [(f, p, f.cut.t_star_ns - f.offsets[p]) for f in firsts for p in f.cut.warm]
        due = warm_spread([lead for _, _, lead in items], self.tree_idle_cap_ns)
        prepared = await asyncio.gather(
            *(self._warm_prepare(f.session, f.play, p) for f, p, _ in items)
        )
        await self.clock.sleep_until(self.t0)
        start = max(self.clock.now_ns(), self.t0)
        # every warm-up waits from now on, so that an idle skip moves them all alike
        wids = [self._register(start + d) for d in due]
        self._maybe_skip()
        deadline, self.deadline = self.deadline, None
        try:
            await asyncio.gather(
                *(
                    self._warm_send(prep, rec, wid)
                    for (prep, rec), wid in zip(prepared, wids, strict=True)
                )
            )
            if self.warmup_requests:
                await asyncio.gather(*(self._warm_turns(f) for f in firsts))
        finally:
            self.deadline = deadline
        return self._failure is None

    async def _warm_turns(self, f: _Lane) -> None:
        """Lane ``f``'s ``warmup_requests`` first turns back to back (the play keeps at
        least one); its cut then starts after them."""
        more = f.cut.keep[: min(self.warmup_requests, len(f.cut.keep) - 1)]
        for p in more:
            prep, rec = await self._warm_prepare(f.session, f.play, p)
            await self.clock.sleep_until(self.t0)
            await self._warm_send(prep, rec, self._register(self.clock.now_ns()))
        keep = f.cut.keep[len(more) :]
        f.cut = FirstPlay(min(f.offsets[p] for p in keep), keep, f.cut.warm)

    async def _lane(self, first: _Lane, start: int) -> None:
        assert self.deadline is not None
        self._settling += 1
        try:
            cut_before = self.skipped
            await self._play(
                first.session,
                first.play,
                first.cut.keep,
                first.cut.t_star_ns,
                start,
                first.offsets,
                first.thinks,
            )
            if self.skipped > cut_before:
                return  # the deadline cut this play: the lane is done
            while self.clock.now_ns() < self.deadline and self._failure is None:
                s = self._next_session()
                offsets, thinks = capped_times(s.requests, self.tree_idle_cap_ns)
                cut_before = self.skipped
                await self._play(
                    s,
                    self._new_play(),
                    list(range(len(s.requests))),
                    min(offsets),
                    self.clock.now_ns(),
                    offsets,
                    thinks,
                )
                if self.skipped > cut_before:
                    break
        finally:
            self._settling -= 1
            self._maybe_skip()

    def _bust(self, q: PlannedRequest, play: int) -> PlannedRequest:
        return self.cache_bust(q, play) if self.cache_bust is not None else cache_bust(q, play)

    async def _play(
        self,
        s: PlannedSession,
        play: int,
        keep: list[int],
        t_star: int,
        start: int,
        offsets: list[int],
        thinks: list[int],
    ) -> None:
        """Play ``keep`` of session ``s``: a request with no dependency among them goes at
        ``start`` + (its offset - ``t_star``); the others by ``stream_rules``."""
        reqs = s.requests
        now = max(start, self.t0)
        pos = {p: i for i, p in enumerate(keep)}
        rules = stream_rules(reqs, offsets, thinks)
        starts = play_starts(reqs, keep, offsets, t_star, self.tree_idle_cap_ns)
        out: list[PlannedRequest] = []
        play_rules: list[Rule] = []
        trigger: dict[int, int] = {}  # a child sent at its spawning turn's send -> that turn
        for p in keep:
            q = self._bust(reqs[p], play)
            r = _play_rule(rules[p], pos)
            if r.at_send and r.anchor is not None:
                trigger[pos[p]] = r.anchor
            deps, held = list(r.deps), list(r.barrier)
            play_rules.append(r)
            # the driver waits for every request of the barrier too, before ``_due``
            out.append(
                replace(
                    q,
                    deps=sorted(set(deps) | set(held)),
                    children=[],
                    parent=pos.get(q.parent, -1),
                    offset_ns=now - self.t0 + starts[p],
                    think_ns=thinks[p] if deps else 0,
                )
            )
        for i, q in enumerate(out):
            if q.deps:
                out[trigger.get(i, q.deps[-1])].children.append(i)
        self.total += len(out)
        ps = PlannedSession(s.session_id, play, now - self.t0, out)
        self._rules[ps.key] = play_rules
        await self._session(ps)

    async def _session(self, s: PlannedSession) -> None:
        st = _SessionState(len(s.requests))
        self._live[s.key] = _Live(s, st, {q.request_index: p for p, q in enumerate(s.requests)})
        self.active_sessions += 1
        try:
            for p, q in enumerate(s.requests):
                if not q.deps:
                    self._spawn(self._request(s, st, p))
            self._settling -= 1
            try:
                for ev in st.events:
                    await ev.wait()
            finally:
                self._settling += 1
        finally:
            self.active_sessions -= 1
            del self._live[s.key]
            self._rules.pop(s.key, None)
            self._dead.pop(s.key, None)
            self._issue.pop(s.key, None)

    async def _warm_prepare(
        self, s: PlannedSession, play: int, p: int
    ) -> tuple[Any, RequestRecord]:
        """Request ``p`` of ``s`` with one output token, flagged warm-up, prepared; and its
        record."""
        w = replace(self._bust(s.requests[p], play), output_tokens=1, deps=[], children=[])
        rid = f"{self.run_id}-{s.session_id}#{play}-warmup-{w.request_index}"
        rec = RequestRecord(
            session_id=w.session_id,
            request_index=w.request_index,
            parent_index=w.parent_index,
            clone=play,
            worker=self.worker,
            request_id=rid,
            api=w.api,
            expected_input_tokens=w.input_tokens,
            expected_output_tokens=1,
            implied_cached_tokens=None,
        )
        rec.agent_id = w.agent_id
        rec.depends_on = w.depends_on
        rec.warmup = True
        return await self.transport.prepare(w, rid, f"{s.session_id}#{play}"), rec

    async def _warm_send(self, prepared: Any, rec: RequestRecord, wid: int) -> None:
        """Sends a prepared warm-up at waiter ``wid``'s time."""
        intended = await self._wait(wid)
        assert intended is not None  # no deadline, or due at once
        rec.intended_ns = intended
        self.warmups += 1
        self.sent += 1
        try:
            await self.transport.send(prepared, rec)
        finally:
            self.done += 1
            self._record(rec)
