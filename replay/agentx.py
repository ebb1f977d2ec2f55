"""``--timing agentx``: replay comparable with InferenceX AgentX (AIPerf's ``agentx`` and
``inferencex-agentx-mvp`` scenarios), on the same results and reports as every run.

* ``lanes`` (``--concurrency``) session trees are live at once. A lane that finishes a tree
  takes the next session of the plan (cycling): recycling. Every play gets its own
  ``clone`` number, and with it a fresh cache-bust marker at the first user turn (see
  ``cache_bust``): the tools + system prefix stays shareable between plays, the
  conversation does not.
* A lane's first play starts at a sampled instant t* (``start_range`` of the session's
  time span, seeded per lane; AIPerf's trajectory start ratios): its first request is the
  first at or after t*. Before it, a warm-up request (flagged ``warmup``, so left out of
  every statistic) sends the prompt of that turn's prefix parent with one output token, then
  ``warmup_requests`` more turns of the play go back to back, also flagged; the measured
  play begins after them. Dependencies on turns left out count as met.
* Inside a tree, timing is ``session`` timing (dependencies, then think time); with
  ``tree_idle_cap_ns`` every recorded stretch where nothing of the tree was in flight is
  shortened to at most that (AIPerf's trace idle gap cap; ``idle_warp``).
* System idle cap (AIPerf's ``system_idle_gap_cap_seconds``): when nothing at all is in
  flight, the idle time before the next send is at most ``idle_cap_ns``; every waiting
  request's intended send time moves earlier by the same amount (the skip). A request's
  recorded ``think_ns`` is then the think time it got.
* Lanes stop starting requests at the duration, counted from the end of the last warm-up:
  a request due after it is not sent, nor
  are the rest of its tree, and a lane whose play was cut starts no other; requests in
  flight finish.
* Validity (``replay.validity.agentx_validity``, written to run.json by the run): the rules
  in its text.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

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

__all__ = ["DEFAULT_DURATION_S", "IDLE_CAP_NS", "MAX_OVERFLOW_FRACTION", "AgentXDriver",
           "ValidityInput", "ValidityRules", "agentx_validity", "cache_bust", "capped_times",
           "coverage_ratio", "idle_warp", "is_overflow", "sample_start"]

IDLE_CAP_NS = 10_000_000_000
"""AIPerf's ``system_idle_gap_cap_seconds`` of both AgentX scenarios (10 s)."""
IDLE_SKIP_NS = IDLE_CAP_NS
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


def sample_start(offsets: list[int], u: float) -> int:
    """The position of the first request at or after t* = first + u * span (AIPerf samples
    an instant, not a turn: a session is never cut before its first turn unless t* is its
    very start). ``offsets`` are in position order (non-decreasing in a trace's time)."""
    if len(offsets) < 2:
        return 0
    first, last = min(offsets), max(offsets)
    t_star = first + u * (last - first)
    for p, o in enumerate(offsets):
        if o >= t_star:
            return p
    return len(offsets) - 1


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


class AgentXDriver(Driver):
    def __init__(self, plan: Plan, transport: Transport, clock: Clock, *, t0_ns: int,
                 on_record: Callable[[RequestRecord], None], lanes: int, seed: int = 0,
                 worker: int = 0, run_id: str = "run", duration_ns: int | None = None,
                 lookahead_ns: int = 1_000_000_000,
                 start_range: tuple[float, float] = START_RANGE, warmup_requests: int = 0,
                 idle_cap_ns: int | None = IDLE_CAP_NS, tree_idle_cap_ns: int | None = None,
                 cache_bust: Callable[[PlannedRequest, int], PlannedRequest] | None = None) -> None:
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
        self._cursor = 0
        self._shift = 0
        self._waiting: dict[int, int] = {}  # waiter id -> intended send + the shift when it registered
        self._handoff: int | None = None
        self._wake = asyncio.Event()
        self._next_waiter = 0
        self._live: dict[str, _Live] = {}
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
        return ready <= len(self._waiting)

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

    def _past_deadline(self, due: int) -> bool:
        """Never decided here: a later idle skip can still bring ``due`` before the
        deadline, so ``_sleep_to`` decides when the deadline comes. The request is
        registered (and may let an idle gap be skipped now); ``_sleep_to``, which the driver
        calls next without yielding, takes the registration over."""
        wid = self._next_waiter
        self._next_waiter += 1
        self._waiting[wid] = due + self._shift
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
        lanes = [asyncio.ensure_future(self._lane(k)) for k in range(self.lanes)]
        try:
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

    async def _lane(self, lane: int) -> None:
        rng = random.Random(f"agentx\x1f{self.seed}\x1f{self.worker}\x1f{lane}")
        first = True
        assert self.deadline is not None
        self._settling += 1
        try:
            while self.clock.now_ns() < self.deadline and self._failure is None:
                s = self._next_session()
                play = self.worker * 1_000_000 + self.plays + 1  # clone 0 stays the trace's own
                self.plays += 1
                start = 0
                if first:
                    lo, hi = self.start_range
                    start = sample_start([q.offset_ns for q in s.requests], lo + (hi - lo) * rng.random())
                first = False
                cut_before = self.skipped
                await self._play(s, play, start)
                if self.skipped > cut_before:
                    break  # the deadline cut this play: the lane is done
        finally:
            self._settling -= 1
            self._maybe_skip()

    def _bust(self, q: PlannedRequest, play: int) -> PlannedRequest:
        return self.cache_bust(q, play) if self.cache_bust is not None else cache_bust(q, play)

    async def _play(self, s: PlannedSession, play: int, start: int) -> None:
        now = max(self.clock.now_ns(), self.t0)
        reqs = s.requests
        if start > 0:
            warm = [reqs[start].parent] if reqs[start].parent >= 0 else []
            end = min(start + self.warmup_requests, len(reqs) - 1)
            warm += range(start, end)
            warm_end = await self._warm_up(s, play, warm)
            if warm_end is None:
                return
            # the measured duration counts from the end of the warm-up (AIPerf runs its
            # warm-up as a phase of its own before the profiling duration)
            assert self.deadline is not None
            self.deadline = max(self.deadline, warm_end + self.duration_ns)
            start = end
            now = max(now, warm_end)
        keep = list(range(start, len(reqs)))
        pos = {p: i for i, p in enumerate(keep)}
        offsets, thinks = capped_times(reqs, self.tree_idle_cap_ns)
        base = offsets[start]
        out: list[PlannedRequest] = []
        for p in keep:
            q = self._bust(reqs[p], play)
            deps = [pos[d] for d in q.deps if d in pos]
            out.append(replace(q, deps=deps, children=[], parent=pos.get(q.parent, -1),
                               offset_ns=now - self.t0 + max(0, offsets[p] - base),
                               think_ns=thinks[p] if deps else 0))
        for i, q in enumerate(out):
            if q.deps:
                out[q.deps[-1]].children.append(i)
        self.total += len(out)
        await self._session(PlannedSession(s.session_id, play, now - self.t0, out))

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

    async def _warm_up(self, s: PlannedSession, play: int, positions: list[int]) -> int | None:
        """Sends the requests at ``positions`` one after the other with one output token,
        flagged warm-up; returns the last one's end, or None past the deadline."""
        end = self.clock.now_ns()
        for p in positions:
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
            end = rec.end_ns if rec.end_ns is not None else self.clock.now_ns()
        return end

