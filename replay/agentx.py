"""``--timing agentx``: replay comparable with InferenceX AgentX (AIPerf's ``agentx`` and
``inferencex-agentx-mvp`` scenarios, its ``agentic_replay`` timing), on the same results and
reports as every run.

* ``lanes`` (``--concurrency``) session trees are live at once. A lane that finishes a tree
  takes the next session of the plan (cycling): recycling. Every play gets its own
  ``clone`` number, and with it a fresh cache-bust marker at the first user turn (see
  ``cache_bust``): the tools + system prefix stays shareable between plays, the
  conversation does not.
* Start point (``first_play``): each lane's first play is cut at an instant t* drawn
  uniformly in ``start_range`` of its session's time span, from numpy's ``default_rng``
  seeded with the first 8 bytes (big-endian) of sha256(``"{seed}:{session}:{lane}"``), as
  AIPerf seeds its trajectory lanes: the requests at or after t* are played.
* Warm-up: before the measured phase, every stream of every lane (the main agent and each
  subagent) that has requests both before and at or after t* sends its last request before
  t* with its full prompt and one output token (flagged ``warmup``, left out of every
  statistic); all lanes' warm-ups go at once, then ``warmup_requests`` more turns of each
  first play back to back, also flagged. The measured phase starts when the last warm-up
  has ended, for every lane at once; the duration counts from there.
* First play: a request whose dependencies were all before t* goes at (its ``t`` - t*)
  after the measured phase starts (with a trace idle cap, the lane's leading idle is
  capped too, as AIPerf's ``_leading_idle_shift_ms``); a recycled play's first request goes
  at once. Dependencies on requests left out count as met.
* Inside a tree (``stream_rules``), per request kind: a stream's next turn goes its
  end-to-start delay after the stream's previous turn ends; a subagent's first turn goes
  (its ``t`` - its branch's start) after the spawning turn ends, the branch being the
  subagents with the same spawning and joining turns and its start the earliest of their
  first ``t``; a join turn goes the moment its last subagent ends when a subagent was
  still running at the end of the parent's previous turn, else its end-to-start delay
  after that turn (AIPerf's ``BranchOrchestrator``). With ``tree_idle_cap_ns`` every
  recorded stretch where nothing of the tree was in flight is shortened to at most that
  first (AIPerf's trace idle gap cap; ``idle_warp``).
* System idle cap (AIPerf's ``system_idle_gap_cap_seconds``): when nothing at all is in
  flight, the idle time before the next send is at most ``idle_cap_ns``; every waiting
  request's intended send time moves earlier by the same amount (the skip), except a
  subagent's first turn waiting out its branch offset (AIPerf sleeps that outside its
  scheduler, so the cap does not move it). A request's recorded ``think_ns`` is then the
  think time it got.
* Lanes stop starting requests at the duration: a request due after it is not sent, nor
  are the rest of its tree, and a lane whose play was cut starts no other; requests in
  flight finish.
* Validity (``replay.validity.agentx_validity``, written to run.json by the run): the rules
  in its text.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from agent_replay.replay.clock import Clock
from agent_replay.replay.driver import Driver, Transport, _SessionState
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest, PlannedSession, stable_hash
from agent_replay.replay.validity import (
    MAX_OVERFLOW_FRACTION,
    ValidityInput,
    ValidityRules,
    agentx_validity,
    coverage_ratio,
    is_overflow,
)

__all__ = ["DEFAULT_DURATION_S", "IDLE_CAP_NS", "MAX_OVERFLOW_FRACTION", "AgentXDriver", "Rule",
           "ValidityInput", "ValidityRules", "agentx_validity", "cache_bust", "capped_times",
           "coverage_ratio", "first_play", "idle_warp", "is_overflow", "lane_seed",
           "sample_t_star", "stream_rules"]

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
        ends = [reqs[d].offset_ns + svc for d in q.deps
                if (svc := reqs[d].service_ns) is not None]
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
    that is not a stream's first)."""

    kind: str
    delay_ns: int
    prev: int | None = None
    anchor: int | None = None


def stream_rules(reqs: list[PlannedRequest], offsets: list[int], thinks: list[int]) -> list[Rule]:
    """AIPerf's agentic replay rule for every request of a session (positions as in
    ``reqs``; ``offsets`` and ``thinks`` as ``capped_times`` gives them).

    * a stream's next turn (its only dependency the stream's previous turn): the think
      time, end-to-start;
    * a join (also waiting for other streams): end-to-start after the stream's previous
      turn, ``offset - (offset_prev + service_prev)`` floored at 0 (the recorded think
      time where the previous turn's service time is unknown);
    * a subagent's first turn: its offset minus its branch's start, the branch being the
      subagents spawned by the same turn and joined by the same turn (or by none), its
      start the earliest first offset among them.
    """
    agent = [q.agent_id for q in reqs]
    first_of: dict[str, int] = {}
    last_of: dict[str, int] = {}
    for p, a in enumerate(agent):
        first_of.setdefault(a, p)
        last_of[a] = p
    join_of: dict[str, int] = {}
    for p, q in enumerate(reqs):
        for d in q.deps:
            if agent[d] != agent[p] and d == last_of[agent[d]]:
                join_of.setdefault(agent[d], p)
    branch_of: dict[str, tuple[int, int | None]] = {}
    branch_start: dict[tuple[int, int | None], int] = {}
    for a, p in first_of.items():
        if reqs[p].deps:
            key = (max(reqs[p].deps), join_of.get(a))
            branch_of[a] = key
            branch_start[key] = min(branch_start.get(key, offsets[p]), offsets[p])
    out: list[Rule] = []
    for p, q in enumerate(reqs):
        if not q.deps:
            out.append(Rule("root", 0))
            continue
        own = [d for d in q.deps if agent[d] == agent[p]]
        if not own:
            if p == first_of[agent[p]]:
                out.append(Rule("child", max(0, offsets[p] - branch_start[branch_of[agent[p]]]),
                                anchor=max(q.deps)))
            else:
                out.append(Rule("after", thinks[p]))
            continue
        prev = max(own)
        if len(own) == len(q.deps):
            out.append(Rule("next", thinks[p], prev=prev))
            continue
        svc = reqs[prev].service_ns
        delay = thinks[p] if svc is None else max(0, offsets[p] - offsets[prev] - svc)
        out.append(Rule("join", delay, prev=prev))
    return out


def lane_seed(seed: int, session_id: str, lane: int) -> int:
    """AIPerf's per-(trace, lane) seed: the first 8 bytes of sha256(``"{seed}:{trace}:{lane}"``),
    big-endian."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{session_id}:{lane}".encode()).digest()[:8], "big")


def sample_t_star(offsets: list[int], lo: float, hi: float, seed: int, session_id: str,
                  lane: int) -> float:
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
    def __init__(self, plan: Plan, transport: Transport, clock: Clock, *, t0_ns: int,
                 on_record: Callable[[RequestRecord], None], lanes: int, seed: int = 0,
                 worker: int = 0, run_id: str = "run", duration_ns: int | None = None,
                 lookahead_ns: int = 1_000_000_000,
                 start_range: tuple[float, float] = START_RANGE, warmup_requests: int = 0,
                 idle_cap_ns: int | None = IDLE_CAP_NS, tree_idle_cap_ns: int | None = None,
                 cache_bust: Callable[[PlannedRequest, int], PlannedRequest] | None = None,
                 first_lane: int = 0) -> None:
        if lanes < 1:
            raise ValueError("agentx needs at least one lane")
        if duration_ns is None:
            duration_ns = int(DEFAULT_DURATION_S * 1e9)
        super().__init__(plan, transport, clock, mode="session", t0_ns=t0_ns,
                         on_record=self._record, worker=worker, run_id=run_id,
                         duration_ns=duration_ns, lookahead_ns=lookahead_ns)
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
        self.idle_skipped_ns = 0
        self.idle_skips = 0
        self.plays = 0
        self.warmups = 0
        self.measured_start_ns: int | None = None
        """When the measured phase started (the last warm-up's end)."""
        self._cursor = 0
        self._shift = 0
        self._waiting: dict[int, int] = {}  # waiter id -> intended send + the shift when it registered
        self._pinned: dict[int, int] = {}  # waiter id -> intended send the idle cap does not move
        self._handoff: int | None = None
        self._pin = False
        self._wake = asyncio.Event()
        self._next_waiter = 0
        self._live: dict[str, _Live] = {}
        self._rules: dict[str, list[Rule]] = {}
        self._settling = 0  # lanes between plays (about to schedule a play's first requests)
        self._idle_since: int | None = None
        self.total = 0  # unknown up front: counts as requests start

    # -- the system idle cap ----------------------------------------------------------------
    def _record(self, rec: RequestRecord) -> None:
        if rec.parent_end_ns is not None and rec.think_ns is not None:
            rec.think_ns = rec.intended_ns - rec.parent_end_ns  # after any skipped gap
        if not rec.warmup:
            live = self._live.get(f"{rec.session_id}#{rec.clone}")
            if live is not None and rec.request_index in live.pos_of:
                live.finished.add(live.pos_of[rec.request_index])
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
    def _due(self, s: PlannedSession, st: _SessionState | None, p: int, parent_end: int | None) -> int:
        """``stream_rules``' send time of request ``p`` of a play (every dependency done);
        a subagent's first turn is marked for a wait the idle cap does not move."""
        self._pin = False
        q = s.requests[p]
        rules = self._rules.get(s.key)
        if rules is None or st is None or parent_end is None:
            return super()._due(s, st, p, parent_end)
        r = rules[p]
        ends = st.ends
        if r.kind == "child" and r.anchor is not None and ends[r.anchor] is not None:
            self._pin = True
            spawned = ends[r.anchor]
            assert spawned is not None
            return max([spawned + r.delay_ns] + [e for d in q.deps if d != r.anchor
                                                 and (e := ends[d]) is not None])
        if r.kind in ("next", "join"):
            others = [e for d in q.deps if d != r.prev and (e := ends[d]) is not None]
            prev_end = None if r.prev is None else ends[r.prev]
            if prev_end is None:
                return parent_end  # the stream's previous turn was before t*: join at once
            if others and max(others) > prev_end:
                return max(others)  # a subagent outlived the previous turn: join at its end
            return prev_end + r.delay_ns
        return parent_end + r.delay_ns

    def _past_deadline(self, due: int) -> bool:
        """Never decided here: a later idle skip can still bring ``due`` before the
        deadline, so ``_sleep_to`` decides when the deadline comes. The request is
        registered (and may let an idle gap be skipped now); ``_sleep_to``, which the driver
        calls next without yielding, takes the registration over."""
        wid = self._next_waiter
        self._next_waiter += 1
        if self._pin:
            self._pinned[wid] = due
        else:
            self._waiting[wid] = due + self._shift
        self._pin = False
        self._handoff = wid
        self._maybe_skip()
        return False

    async def _sleep_to(self, due: int) -> int | None:
        """Wait for the (shifted) intended send time and return it; None when the deadline
        comes first (the request is not sent)."""
        wid, self._handoff = self._handoff, None
        if wid is None:
            wid = self._next_waiter
            self._next_waiter += 1
            self._waiting[wid] = due + self._shift
        if wid in self._pinned:
            try:
                while True:
                    now = self.clock.now_ns()
                    if now >= due:
                        return due
                    if self.deadline is not None and now >= self.deadline:
                        return None
                    await self.clock.sleep_until(due if self.deadline is None else min(due, self.deadline))
            finally:
                del self._pinned[wid]
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
        firsts = [self._first(k) for k in range(self.lanes)]
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
            await asyncio.gather(*lanes)
        except BaseException:
            for t in lanes:
                t.cancel()
            await self.cancel()
            raise
        while self._tasks:
            await self._idle.wait()
        if self._failure is not None:
            raise self._failure

    def _next_session(self) -> PlannedSession:
        s = self.plan.sessions[self._cursor % len(self.plan.sessions)]
        self._cursor += 1
        return s

    def _new_play(self) -> int:
        self.plays += 1
        return self.worker * 1_000_000 + self.plays  # clone 0 stays the trace's own

    def _first(self, lane: int) -> _Lane:
        """Lane ``lane``'s first play: its session, t* and warm-up."""
        s = self._next_session()
        offsets, thinks = capped_times(s.requests, self.tree_idle_cap_ns)
        lo, hi = self.start_range
        t_star = sample_t_star(offsets, lo, hi, self.seed, s.session_id, self.first_lane + lane)
        return _Lane(s, self._new_play(), offsets, thinks, first_play(s.requests, offsets, t_star))

    async def _warm_phase(self, firsts: list[_Lane]) -> bool:
        """Every lane's stream warm-ups at once, then each lane's ``warmup_requests`` turns
        back to back; False when the deadline came first."""
        sends = [self._warm_one(f.session, f.play, p) for f in firsts for p in f.cut.warm]
        ends = await asyncio.gather(*sends)
        if any(e is None for e in ends):
            return False
        if self.warmup_requests:
            done = await asyncio.gather(*(self._warm_turns(f) for f in firsts))
            return all(done)
        return True

    async def _warm_turns(self, f: _Lane) -> bool:
        """Lane ``f``'s ``warmup_requests`` first turns back to back (the play keeps at
        least one); its cut then starts after them."""
        more = f.cut.keep[: min(self.warmup_requests, len(f.cut.keep) - 1)]
        for p in more:
            if await self._warm_one(f.session, f.play, p) is None:
                return False
        keep = f.cut.keep[len(more):]
        f.cut = FirstPlay(min(f.offsets[p] for p in keep), keep, f.cut.warm)
        return True

    async def _lane(self, first: _Lane, start: int) -> None:
        assert self.deadline is not None
        self._settling += 1
        try:
            cut_before = self.skipped
            await self._play(first.session, first.play, first.cut.keep, first.cut.t_star_ns,
                             start, first.offsets, first.thinks)
            if self.skipped > cut_before:
                return  # the deadline cut this play: the lane is done
            while self.clock.now_ns() < self.deadline and self._failure is None:
                s = self._next_session()
                offsets, thinks = capped_times(s.requests, self.tree_idle_cap_ns)
                cut_before = self.skipped
                await self._play(s, self._new_play(), list(range(len(s.requests))), min(offsets),
                                 self.clock.now_ns(), offsets, thinks)
                if self.skipped > cut_before:
                    break
        finally:
            self._settling -= 1
            self._maybe_skip()

    def _bust(self, q: PlannedRequest, play: int) -> PlannedRequest:
        return self.cache_bust(q, play) if self.cache_bust is not None else cache_bust(q, play)

    async def _play(self, s: PlannedSession, play: int, keep: list[int], t_star: int, start: int,
                    offsets: list[int], thinks: list[int]) -> None:
        """Play ``keep`` of session ``s``: a request with no dependency among them goes at
        ``start`` + (its offset - ``t_star``); the others by ``stream_rules``."""
        reqs = s.requests
        now = max(start, self.t0)
        pos = {p: i for i, p in enumerate(keep)}
        rules = stream_rules(reqs, offsets, thinks)
        roots = [offsets[p] - t_star for p in keep if not any(d in pos for d in reqs[p].deps)]
        lead = 0
        if self.tree_idle_cap_ns is not None and roots:
            lead = max(0, min(roots) - self.tree_idle_cap_ns)  # AIPerf's leading idle shift
        out: list[PlannedRequest] = []
        play_rules: list[Rule] = []
        for p in keep:
            q = self._bust(reqs[p], play)
            deps = [pos[d] for d in q.deps if d in pos]
            r = rules[p]
            play_rules.append(replace(r, prev=None if r.prev is None else pos.get(r.prev),
                                      anchor=None if r.anchor is None else pos.get(r.anchor)))
            out.append(replace(q, deps=deps, children=[], parent=pos.get(q.parent, -1),
                               offset_ns=now - self.t0 + max(0, offsets[p] - t_star - lead),
                               think_ns=thinks[p] if deps else 0))
        for i, q in enumerate(out):
            if q.deps:
                out[q.deps[-1]].children.append(i)
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

    async def _warm_one(self, s: PlannedSession, play: int, p: int) -> int | None:
        """Sends request ``p`` of ``s`` with one output token, flagged warm-up; returns its
        end, or None past the deadline."""
        w = replace(self._bust(s.requests[p], play), output_tokens=1, deps=[], children=[])
        rid = f"{self.run_id}-{s.session_id}#{play}-warmup-{w.request_index}"
        rec = RequestRecord(session_id=w.session_id, request_index=w.request_index,
                            parent_index=w.parent_index, clone=play, worker=self.worker,
                            request_id=rid, api=w.api, expected_input_tokens=w.input_tokens,
                            expected_output_tokens=1, implied_cached_tokens=None)
        rec.agent_id = w.agent_id
        rec.depends_on = w.depends_on
        rec.warmup = True
        prepared = await self.transport.prepare(w, rid, f"{s.session_id}#{play}")
        await self.clock.sleep_until(self.t0)
        if self.clock.now_ns() >= (self.deadline or 0):
            return None
        rec.intended_ns = self.clock.now_ns()
        self.warmups += 1
        self.sent += 1
        try:
            await self.transport.send(prepared, rec)
        finally:
            self.done += 1
            self._record(rec)
        return rec.end_ns if rec.end_ns is not None else self.clock.now_ns()
