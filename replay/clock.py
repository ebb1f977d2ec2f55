"""Clocks for the scheduler: integer monotonic nanoseconds and a way to wait.

``MonotonicClock`` is the real one: ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by
every process on the host, so workers agree on one t0). Its ``sleep_until`` sleeps on the
event loop until shortly before the deadline, then yields to the loop until the clock
says the deadline has passed: asyncio timers wake 0-1 ms late and uvloop's up to 1.4 ms
early, so the clock is re-read after every wake and the loop's own time is never used.
``pause`` is the imprecise wait (pacing, periodic ticks): one timer, no spinning.

``FakeClock`` is a virtual clock with autojump (as trio's MockClock): when the event loop
has nothing left to run, time jumps to the earliest deadline. It learns that from the one
place asyncio itself decides it: the loop asks its selector to block. ``FakeClock.run``
runs a coroutine on a loop whose selector tells the clock so (``SelectorEventLoop`` takes
a selector as a public argument), so the clock reads no private loop state and a run
depends only on the program: the same input gives the same virtual times on every run.
Tests replay an hour of trace in milliseconds with it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from agent_replay.engines import aio

T = TypeVar("T")


class Clock(Protocol):
    def now_ns(self) -> int: ...

    async def sleep_until(self, deadline_ns: int) -> None: ...

    async def pause(self, ns: int) -> None: ...


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

    async def pause(self, ns: int) -> None:
        await asyncio.sleep(ns / 1e9)


class _IdleSelector(selectors.BaseSelector):
    """The default selector, plus a hook called whenever the event loop is about to block:
    an asyncio loop calls ``select`` with a zero timeout while callbacks are ready and a
    longer (or no) timeout only when nothing is runnable. A hook that returns True made
    something runnable, so the loop is told not to block."""

    def __init__(self, on_idle: Callable[[], bool]) -> None:
        self._inner = selectors.DefaultSelector()
        self._on_idle = on_idle

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if (timeout is None or timeout > 0) and self._on_idle():
            timeout = 0
        return self._inner.select(timeout)

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class FakeClock:
    """A virtual clock whose time moves only by autojump (or ``advance``).

    Sleepers sit in a heap ordered by (deadline, arrival). When the loop created by
    ``run`` (or ``new_loop``) has nothing runnable, time moves to the earliest deadline and
    the sleepers due then wake, in arrival order. Only coroutines that wait on this clock
    (or on each other) may run under it: a wait for real I/O or a real timer looks like
    idleness and lets virtual time jump past it.
    """

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now = start_ns
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def now_ns(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        self._now += ns
        self._wake()

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """A fresh event loop whose idleness moves this clock."""
        self._loop = asyncio.SelectorEventLoop(_IdleSelector(self._jump))
        return self._loop

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on ``new_loop()`` (as ``asyncio.run`` does)."""
        return aio.run(main, loop_factory=self.new_loop)

    async def sleep_until(self, deadline_ns: int) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise RuntimeError(
                "FakeClock sleeps only on its own loop: run the coroutine "
                "with clock.run(...) so the clock sees when the loop is idle"
            )
        if deadline_ns <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._heap, (deadline_ns, next(self._seq), fut))
        await fut

    async def pause(self, ns: int) -> None:
        await self.sleep_until(self._now + ns)

    def _wake(self) -> None:
        while self._heap and self._heap[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(None)

    def _jump(self) -> bool:
        """The loop is idle: move to the earliest live deadline; False when none is left."""
        heap = self._heap
        while heap and heap[0][2].done():  # cancelled sleepers
            heapq.heappop(heap)
        if not heap:
            return False
        self._now = max(self._now, heap[0][0])
        self._wake()
        return True
