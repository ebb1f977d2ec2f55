"""FakeClock's autojump: time moves only when the loop has nothing runnable, in one order."""

from __future__ import annotations

import asyncio

import pytest

from agent_replay.replay.clock import FakeClock, MonotonicClock

MS = 1_000_000


def test_sleepers_wake_at_their_deadlines_in_deadline_then_arrival_order():
    clock = FakeClock(start_ns=0)
    woke: list[tuple[str, int]] = []

    async def sleeper(name: str, deadline: int) -> None:
        await clock.sleep_until(deadline)
        woke.append((name, clock.now_ns()))

    async def main() -> None:
        await asyncio.gather(
            sleeper("c", 30 * MS),
            sleeper("a", 10 * MS),
            sleeper("b", 10 * MS),
            sleeper("d", 20 * MS),
        )

    clock.run(main())
    assert woke == [("a", 10 * MS), ("b", 10 * MS), ("d", 20 * MS), ("c", 30 * MS)]


def test_time_stands_still_while_anything_is_runnable():
    clock = FakeClock(start_ns=0)
    seen: list[int] = []

    async def busy(ev: asyncio.Event) -> None:
        # A long chain of yields and a hand-off through an Event: all of it runs at t=0,
        # before the sleeper's deadline is reached.
        for _ in range(2_000):
            await asyncio.sleep(0)
        seen.append(clock.now_ns())
        ev.set()

    async def waiter(ev: asyncio.Event) -> None:
        await ev.wait()
        seen.append(clock.now_ns())
        await clock.pause(5 * MS)
        seen.append(clock.now_ns())

    async def sleeper() -> None:
        await clock.sleep_until(1 * MS)
        seen.append(clock.now_ns())

    async def main() -> None:
        ev = asyncio.Event()
        await asyncio.gather(busy(ev), waiter(ev), sleeper())

    clock.run(main())
    assert seen == [0, 0, 1 * MS, 5 * MS]


def test_a_cancelled_sleeper_does_not_hold_time_back():
    clock = FakeClock(start_ns=0)

    async def main() -> int:
        far = asyncio.ensure_future(clock.sleep_until(10_000 * MS))
        await asyncio.sleep(0)
        far.cancel()
        await clock.sleep_until(3 * MS)
        return clock.now_ns()

    assert clock.run(main()) == 3 * MS


def test_a_past_deadline_only_yields():
    clock = FakeClock(start_ns=7 * MS)

    async def main() -> int:
        await clock.sleep_until(1 * MS)
        return clock.now_ns()

    assert clock.run(main()) == 7 * MS


def test_sleeping_on_a_loop_the_clock_does_not_watch_is_refused():
    clock = FakeClock()
    with pytest.raises(RuntimeError, match=r"clock\.run"):
        asyncio.run(clock.sleep_until(clock.now_ns() + MS))


def test_run_returns_and_cleans_up_leftover_tasks():
    clock = FakeClock(start_ns=0)
    cancelled: list[bool] = []

    async def forever() -> None:
        try:
            await clock.sleep_until(10**18)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> str:
        left = asyncio.ensure_future(forever())
        await clock.sleep_until(2 * MS)
        assert not left.done()
        return "done"

    assert clock.run(main()) == "done"
    assert cancelled == [True]


async def test_monotonic_clock_waits_at_least_until_the_deadline():
    clock = MonotonicClock()
    deadline = clock.now_ns() + 3 * MS
    await clock.sleep_until(deadline)
    assert clock.now_ns() >= deadline
    t = clock.now_ns()
    await clock.pause(1 * MS)
    assert clock.now_ns() - t >= 900_000  # one loop timer: late under load, never much early
