"""Clocks for the scheduler: integer monotonic nanoseconds and a way to wait for a deadline.

``MonotonicClock`` is the real one: ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by
every process on the host, so workers agree on one t0). Its ``sleep_until`` sleeps on the
event loop until shortly before the deadline, then yields to the loop until the clock
says the deadline has passed: asyncio timers wake 0-1 ms late and uvloop's up to 1.4 ms
early, so the clock is re-read after every wake and the loop's own time is never used.

``FakeClock`` is a virtual clock with autojump (as trio's MockClock): when every task is
blocked on the fake clock, time jumps to the earliest deadline. Tests replay an hour of
trace in milliseconds with it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int: ...

    async def sleep_until(self, deadline_ns: int) -> None: ...


class MonotonicClock:
    """The real clock. ``spin_ns``: how long before a deadline to stop trusting timers."""

    __slots__ = ("spin_ns",)

    def __init__(self, spin_ns: int = 1_500_000) -> None:
        self.spin_ns = spin_ns

    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep_until(self, deadline_ns: int) -> None:
        delta = deadline_ns - time.monotonic_ns()
        if delta > self.spin_ns:
            await asyncio.sleep((delta - self.spin_ns) / 1e9)
        while time.monotonic_ns() < deadline_ns:
            await asyncio.sleep(0)


class FakeClock:
    """A virtual clock whose time moves only by autojump (or ``advance``).

    Waiters sit in a heap. A jumper task runs while anyone waits: it yields to the event
    loop until nothing else is runnable, then moves time to the earliest deadline and
    wakes its waiters. Only coroutines that block on this clock (or on each other) may run
    under it: real I/O would look like idleness.
    """

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now = start_ns
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._jumper: asyncio.Task[None] | None = None

    def now_ns(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        self._now += ns
        self._wake()

    async def sleep_until(self, deadline_ns: int) -> None:
        if deadline_ns <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (deadline_ns, next(self._seq), fut))
        if self._jumper is None or self._jumper.done():
            self._jumper = asyncio.get_running_loop().create_task(self._autojump())
        await fut

    def _wake(self) -> None:
        while self._heap and self._heap[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(None)

    async def _autojump(self) -> None:
        loop = asyncio.get_running_loop()
        while self._heap:
            # Let everything runnable run. The loop's ready queue is the only honest
            # idleness signal asyncio has; a few extra yields cover callbacks that
            # schedule further callbacks.
            idle_rounds = 0
            while idle_rounds < 3:
                await asyncio.sleep(0)
                ready = getattr(loop, "_ready", None)
                idle_rounds = idle_rounds + 1 if not ready else 0
            self._heap = [h for h in self._heap if not h[2].done()]
            heapq.heapify(self._heap)
            if not self._heap:
                break
            self._now = max(self._now, self._heap[0][0])
            self._wake()
