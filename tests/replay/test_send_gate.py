"""The send gate: at most one request start per event-loop iteration, in arrival order,
and a cancelled waiter gives its turn away."""

from __future__ import annotations

import asyncio

from replay.client import SendGate


async def test_one_start_per_iteration_in_order() -> None:
    gate = SendGate()
    iteration = 0
    starts: list[tuple[int, int]] = []

    async def counter() -> None:
        nonlocal iteration
        while True:
            await asyncio.sleep(0)
            iteration += 1

    async def sender(i: int) -> None:
        await gate.enter()
        starts.append((i, iteration))

    tick = asyncio.create_task(counter())
    await asyncio.gather(*(sender(i) for i in range(6)))
    tick.cancel()
    assert [i for i, _ in starts] == list(range(6))
    its = [it for _, it in starts]
    assert len(set(its)) == 6, its  # no two starts in the same iteration
    assert its == sorted(its)


async def test_cancelled_waiter_gives_its_turn_away() -> None:
    gate = SendGate()
    order: list[str] = []

    async def sender(name: str) -> None:
        await gate.enter()
        order.append(name)

    a = asyncio.create_task(sender("a"))
    b = asyncio.create_task(sender("b"))
    c = asyncio.create_task(sender("c"))
    await asyncio.sleep(0)  # all three at the gate: a passed, b and c wait
    b.cancel()
    await asyncio.gather(a, c, return_exceptions=True)
    assert order == ["a", "c"]
    assert b.cancelled()
    # the gate is free again: an entry now passes without waiting an iteration
    await asyncio.wait_for(gate.enter(), 1)
