"""The session driver: runs a plan on an event loop with an injected clock and transport.

Timing modes (the intended send time S of each request; ``t0`` is the run's start):

* ``session``: a session's root requests at ``t0 + offset``; every other request when all
  its dependencies completed in this run plus its think time, counted from the latest
  dependency's end (``max(dep ends) + think``). Sessions are trees: parallel subagent
  branches are in flight together, a join waits for every branch, a branch nothing joins
  runs on in the background (the session ends when it does).
* ``absolute``: every request at ``t0 + offset``, whatever happened before.
* ``max-rate``: no timing; a request goes as soon as its dependencies completed and one
  of ``concurrency`` slots is free; S is the moment both held.

A request is prepared (prompt built, body encoded) before its S: roots when their session
starts (``lookahead_ns`` before its first S), others while their latest-positioned
dependency is in flight.
So s - S, the schedule lag, measures the load generator and not prompt building. Requests
whose S falls after the ``duration`` deadline are not sent. Requests whose S falls inside
the warm-up window are sent and flagged.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from agent_replay.replay.clock import Clock
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest, PlannedSession

REFILL_PACE_NS = 500_000


class Transport(Protocol):
    async def prepare(self, q: PlannedRequest, request_id: str, session_key: str) -> Any: ...

    async def send(self, prepared: Any, rec: RequestRecord) -> None: ...


class _SessionState:
    __slots__ = ("ends", "events")

    def __init__(self, n: int) -> None:
        self.ends: list[int | None] = [None] * n
        self.events = [asyncio.Event() for _ in range(n)]


class Driver:
    def __init__(
        self,
        plan: Plan,
        transport: Transport,
        clock: Clock,
        *,
        mode: str = "session",
        t0_ns: int,
        on_record: Callable[[RequestRecord], None],
        worker: int = 0,
        run_id: str = "run",
        concurrency: int | None = None,
        duration_ns: int | None = None,
        warmup_ns: int = 0,
        lookahead_ns: int = 1_000_000_000,
    ) -> None:
        if mode not in ("session", "absolute", "max-rate"):
            raise ValueError(f"unknown timing mode {mode!r}")
        if mode == "max-rate" and not concurrency:
            raise ValueError("max-rate needs a concurrency")
        self.plan = plan
        self.transport = transport
        self.clock = clock
        self.mode = mode
        self.t0 = t0_ns
        self.on_record = on_record
        self.worker = worker
        self.run_id = run_id
        self.deadline = None if duration_ns is None else t0_ns + duration_ns
        self.warmup_end = t0_ns + warmup_ns
        self.lookahead = lookahead_ns
        self._sem = asyncio.Semaphore(concurrency) if concurrency else None
        self._concurrency = concurrency
        self._session_slots = (
            asyncio.Semaphore(max(2 * concurrency, 16))
            if (mode == "max-rate" and concurrency)
            else None
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._idle = asyncio.Event()
        self.total = plan.n_requests
        self.sent = 0
        self.done = 0
        self.skipped = 0
        self.active_sessions = 0
        self.schedule_lag = array("q")

    # -- task bookkeeping ----------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._failure is not None:  # the run is being torn down
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None and self._failure is None:
                self._failure = exc
                for t in list(self._tasks):
                    t.cancel()
        if not self._tasks:
            self._idle.set()

    async def run(self) -> None:
        """Run the whole plan; returns when every request was sent and completed (or
        skipped). Re-raises the first exception of any request task."""
        try:
            if self.mode == "absolute":
                await self._launch_absolute()
            else:
                await self._launch_sessions()
            while self._tasks:
                await self._idle.wait()
        except asyncio.CancelledError:
            await self.cancel()
            raise
        if self._failure is not None:
            raise self._failure

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- launchers -----------------------------------------------------------------------
    async def _launch_sessions(self) -> None:
        for s in self.plan.sessions:
            if self._failure is not None:
                return
            start = self.t0 + s.start_ns
            if self.deadline is not None and start >= self.deadline and self.mode != "max-rate":
                self.skipped += len(s.requests)
                continue
            if self._session_slots is not None:
                await self._session_slots.acquire()
                if self.deadline is not None and self.clock.now_ns() >= self.deadline:
                    self._session_slots.release()
                    self.skipped += len(s.requests)
                    continue
            else:
                await self.clock.sleep_until(start - self.lookahead)
            self._spawn(self._session(s))
            if (
                self._session_slots is not None
                and self._concurrency is not None
                and self.active_sessions > self._concurrency
            ):
                # max-rate refill: a new session prepares its first request (~0.1 ms) at
                # once, and slots free up in waves (all streams of a wave end together).
                # While more sessions than slots are active, the next wave is already
                # prepared, so the refill is paced instead of landing on the loop in the
                # same few ms as the wave's request starts and first chunks.
                await self.clock.pause(REFILL_PACE_NS)
            else:
                await asyncio.sleep(0)  # see _launch_absolute

    async def _launch_absolute(self) -> None:
        items = sorted(
            (
                (q.offset_ns, i, p)
                for i, s in enumerate(self.plan.sessions)
                for p, q in enumerate(s.requests)
            )
        )
        for offset, i, p in items:
            if self._failure is not None:
                return
            due = self.t0 + offset
            if self.deadline is not None and due >= self.deadline:
                self.skipped += 1
                continue
            await self.clock.sleep_until(due - self.lookahead)
            s = self.plan.sessions[i]
            self._spawn(self._request(s, None, p))
            # One prepare per loop iteration: a burst of arrivals must not build all its
            # prompts in one iteration while sends and chunks of other requests wait.
            await asyncio.sleep(0)

    async def _session(self, s: PlannedSession) -> None:
        st = _SessionState(len(s.requests))
        self.active_sessions += 1
        try:
            for p, q in enumerate(s.requests):
                if not q.deps:
                    self._spawn(self._request(s, st, p))
            for ev in st.events:
                await ev.wait()
        finally:
            self.active_sessions -= 1
            if self._session_slots is not None:
                self._session_slots.release()

    # -- one request ---------------------------------------------------------------------
    async def _request(self, s: PlannedSession, st: _SessionState | None, p: int) -> None:
        q = s.requests[p]
        key = s.key
        rid = f"{self.run_id}-{key}-{q.request_index}"
        rec = RequestRecord(
            session_id=q.session_id,
            request_index=q.request_index,
            parent_index=q.parent_index,
            clone=q.clone,
            worker=self.worker,
            request_id=rid,
            api=q.api,
            expected_input_tokens=q.input_tokens,
            expected_output_tokens=q.output_tokens,
            implied_cached_tokens=q.implied_cached,
        )
        rec.agent_id = q.agent_id
        rec.depends_on = q.depends_on
        try:
            prepared = await self.transport.prepare(q, rid, key)
            parent_end = await self._await_deps(s, st, p)
            clock = self.clock
            due = self._due(s, st, p, parent_end)
            if self.mode == "max-rate":
                # Nothing leaves before the run's t0 (workers share a t0 set slightly ahead):
                # a first wave sent early would sit before t0 and count as warm-up.
                await clock.sleep_until(self.t0)
                if self.deadline is not None and clock.now_ns() >= self.deadline:
                    self._skip(s, st, p, clock.now_ns())
                    return
                assert self._sem is not None
                await self._sem.acquire()
                due = clock.now_ns()
            else:
                if self._past_deadline(due):
                    self._skip(s, st, p, due)
                    return
                woke = await self._sleep_to(due)
                if woke is None:  # the deadline came first
                    self._skip(s, st, p, clock.now_ns())
                    return
                due = woke
            rec.intended_ns = due
            rec.parent_end_ns = parent_end
            rec.think_ns = q.think_ns if parent_end is not None and self.mode == "session" else None
            rec.warmup = due < self.warmup_end
            if st is not None:
                self._issued(s, p, due)
                for c in q.children:
                    self._spawn(self._request(s, st, c))
            self.sent += 1
            try:
                await self.transport.send(prepared, rec)
            except asyncio.CancelledError:
                self.on_record(rec)
                raise
            finally:
                if self._sem is not None and self.mode == "max-rate":
                    self._sem.release()
            if rec.sent_ns is not None:
                self.schedule_lag.append(rec.sent_ns - due)
            self.done += 1
            self.on_record(rec)
            if st is not None:
                st.ends[p] = rec.end_ns if rec.end_ns is not None else clock.now_ns()
                st.events[p].set()
        finally:
            if st is not None and not st.events[p].is_set():
                # prepare failed or the task was cancelled: release waiting children
                st.events[p].set()

    async def _await_deps(self, s: PlannedSession, st: _SessionState | None, p: int) -> int | None:
        """Wait until every dependency of request ``p`` completed; the latest one's end
        (None when it has none, or none of them started)."""
        q = s.requests[p]
        if st is None or not q.deps:
            return None
        for d in q.deps:
            await st.events[d].wait()
        ends = [e for e in (st.ends[d] for d in q.deps) if e is not None]
        return max(ends) if ends else None

    def _issued(self, s: PlannedSession, p: int, due: int) -> None:
        """Request ``p`` of ``s`` goes now, intended at ``due`` (its children are spawned
        next): a hook for drivers whose rules count from a send."""

    def _due(
        self, s: PlannedSession, st: _SessionState | None, p: int, parent_end: int | None
    ) -> int:
        """The intended send time of request ``p`` once its dependencies completed
        (``parent_end``: the latest one's end, None when it has none that started)."""
        q = s.requests[p]
        if self.mode == "absolute" or parent_end is None:
            return self.t0 + q.offset_ns
        return parent_end + q.think_ns

    def _past_deadline(self, due: int) -> bool:
        return self.deadline is not None and due >= self.deadline

    async def _sleep_to(self, due: int) -> int | None:
        """Wait until ``due``; returns the intended send time (``agentx`` timing moves it
        earlier when it skips an idle gap, and returns None when the deadline comes first)."""
        await self.clock.sleep_until(due)
        return due

    def _skip(self, s: PlannedSession, st: _SessionState | None, p: int, t: int) -> None:
        """Past the deadline: this request and its descendants are not sent."""
        self.skipped += 1
        if st is None:
            return
        st.ends[p] = t
        st.events[p].set()
        stack = list(s.requests[p].children)
        while stack:
            c = stack.pop()
            self.skipped += 1
            st.ends[c] = t
            st.events[c].set()
            stack.extend(s.requests[c].children)
