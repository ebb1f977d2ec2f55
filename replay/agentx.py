"""``--timing agentx``: replay comparable with InferenceX AgentX (AIPerf's
``inferencex-agentx-mvp`` scenario), on the same results and reports as every run.

* ``lanes`` (``--concurrency``) session trees are live at once. A lane that finishes a tree
  takes the next session of the plan (cycling): recycling. Every play gets its own
  ``clone`` number, and with it disjoint prompt blocks (a fresh cache-bust prefix): copies
  of one trace never share cache, and a copy's prefix-cache hits are those of a first play.
* A lane's first play starts at a point sampled uniformly in 25-75% of its session's
  requests (seeded per lane). Before it, a warm-up request (flagged ``warmup``, so left out
  of every statistic) sends the prompt of that turn's prefix parent with one output token:
  the cache then holds what it would hold in steady state. Dependencies on skipped turns
  count as met at the warm-up's end.
* Inside a tree, timing is ``session`` timing (dependencies, then think time).
* When nothing at all is in flight and the next send is more than ``IDLE_SKIP_NS`` away,
  the gap is skipped: every waiting request's intended send time moves earlier by it
  (its recorded ``think_ns`` is then the think time it got).
* Lanes stop starting requests at the duration (default ``DEFAULT_DURATION_S``): a request
  due after it is not sent, nor are the rest of its tree, and a lane whose play was cut
  starts no other; requests in flight finish.
* Validity (``agentx_validity``, written to run.json by the run): a run where more than
  ``MAX_OVERFLOW_FRACTION`` of the responses were context-length overflows is invalid.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from agent_replay.replay.clock import Clock
from agent_replay.replay.driver import Driver, Transport
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest, PlannedSession

IDLE_SKIP_NS = 10_000_000_000
DEFAULT_DURATION_S = 1800.0
MAX_OVERFLOW_FRACTION = 0.01
START_RANGE = (0.25, 0.75)
OVERFLOW_MARKERS = ("maximum model length", "maximum context length", "context length",
                    "too long", "prompt is too long")
"""Substrings (lower case) of an HTTP 400 error that mark a context-length overflow."""


def is_overflow(http_status: int | None, error: str | None) -> bool:
    return http_status == 400 and error is not None and any(m in error.lower() for m in OVERFLOW_MARKERS)


def agentx_validity(rows: Iterable[tuple[bool, int | None, str | None]]) -> dict[str, Any]:
    """From (warmup, http_status, error) of every result row: responses counted (warm-up
    excluded), context overflows, and whether the run is valid (overflows <= 1%)."""
    n = over = 0
    for warm, status, error in rows:
        if warm:
            continue
        n += 1
        over += is_overflow(status, error)
    frac = over / n if n else 0.0
    valid = frac <= MAX_OVERFLOW_FRACTION
    out: dict[str, Any] = {"responses": n, "context_overflows": over, "overflow_fraction": frac,
                           "valid": valid}
    if not valid:
        out["invalid_reason"] = (f"{over:,} of {n:,} responses ({frac:.1%}) overflowed the context "
                                 f"(AgentX allows {MAX_OVERFLOW_FRACTION:.0%})")
    return out


class AgentXDriver(Driver):
    def __init__(self, plan: Plan, transport: Transport, clock: Clock, *, t0_ns: int,
                 on_record: Callable[[RequestRecord], None], lanes: int, seed: int = 0,
                 worker: int = 0, run_id: str = "run", duration_ns: int | None = None,
                 lookahead_ns: int = 1_000_000_000) -> None:
        if lanes < 1:
            raise ValueError("agentx needs at least one lane")
        if duration_ns is None:
            duration_ns = int(DEFAULT_DURATION_S * 1e9)
        super().__init__(plan, transport, clock, mode="session", t0_ns=t0_ns,
                         on_record=self._record, worker=worker, run_id=run_id,
                         duration_ns=duration_ns, lookahead_ns=lookahead_ns)
        self._user_record = on_record
        self.lanes = lanes
        self.seed = seed
        self.idle_skipped_ns = 0
        self.plays = 0
        self.warmups = 0
        self._cursor = 0
        self._shift = 0
        self._waiting: dict[int, int] = {}  # waiter id -> target (shift not applied)
        self._wake = asyncio.Event()
        self._next_waiter = 0
        self.total = 0  # unknown up front: counts as requests start

    # -- idle-gap skipping ---------------------------------------------------------------
    def _record(self, rec: RequestRecord) -> None:
        if rec.parent_end_ns is not None and rec.think_ns is not None:
            rec.think_ns = rec.intended_ns - rec.parent_end_ns  # after any skipped gap
        self._user_record(rec)
        self._maybe_skip()

    def _in_flight(self) -> int:
        return self.sent - self.done

    def _maybe_skip(self) -> None:
        if not self._waiting or self._in_flight() > 0:
            return
        now = self.clock.now_ns()
        nearest = min(self._waiting.values()) - self._shift
        if nearest - now > IDLE_SKIP_NS:
            gap = nearest - now
            self._shift += gap
            self.idle_skipped_ns += gap
            self._wake.set()
            self._wake = asyncio.Event()

    def _past_deadline(self, due: int) -> bool:
        """Whether ``due``, after any idle gap it lets skip now, falls after the deadline."""
        wid = self._next_waiter
        self._next_waiter += 1
        self._waiting[wid] = due
        try:
            self._maybe_skip()
        finally:
            del self._waiting[wid]
        return self.deadline is not None and due - self._shift >= self.deadline

    async def _sleep_to(self, due: int) -> int:
        wid = self._next_waiter
        self._next_waiter += 1
        self._waiting[wid] = due
        try:
            while True:
                target = due - self._shift
                if self.clock.now_ns() >= target:
                    return target
                self._maybe_skip()
                target = due - self._shift
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
        while self.clock.now_ns() < self.deadline and self._failure is None:
            s = self._next_session()
            play = self.worker * 1_000_000 + self.plays + 1  # clone 0 stays the trace's own
            self.plays += 1
            start = 0
            if first and len(s.requests) > 1:
                lo, hi = START_RANGE
                start = int(len(s.requests) * (lo + (hi - lo) * rng.random()))
                start = min(max(start, 0), len(s.requests) - 1)
            first = False
            cut_before = self.skipped
            await self._play(s, play, start)
            if self.skipped > cut_before:
                break  # the deadline cut this play: the lane is done

    async def _play(self, s: PlannedSession, play: int, start: int) -> None:
        now = max(self.clock.now_ns(), self.t0)
        reqs = s.requests
        if start > 0:
            warm_end = await self._warm_up(s, play, start)
            if warm_end is None:
                return
            now = max(now, warm_end)
        keep = list(range(start, len(reqs)))
        pos = {p: i for i, p in enumerate(keep)}
        base = reqs[start].offset_ns
        out: list[PlannedRequest] = []
        for p in keep:
            q = reqs[p]
            deps = [pos[d] for d in q.deps if d in pos]
            out.append(replace(q, clone=play, deps=deps, children=[],
                               parent=pos.get(q.parent, -1),
                               offset_ns=now - self.t0 + max(0, q.offset_ns - base),
                               think_ns=q.think_ns if deps else 0))
        for i, q in enumerate(out):
            if q.deps:
                out[q.deps[-1]].children.append(i)
        self.total += len(out)
        await self._session(PlannedSession(s.session_id, play, now - self.t0, out))

    async def _warm_up(self, s: PlannedSession, play: int, start: int) -> int | None:
        """Sends the prompt of request ``start``'s prefix parent (one output token), flagged
        warm-up; returns its end, or None past the deadline."""
        q = s.requests[start]
        src = s.requests[q.parent] if q.parent >= 0 else None
        if src is None:
            return self.clock.now_ns()
        w = replace(src, clone=play, output_tokens=1, deps=[], children=[])
        rid = f"{self.run_id}-{s.session_id}#{play}-warmup"
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
