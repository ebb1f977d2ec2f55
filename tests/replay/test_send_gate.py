"""The send gate: at most ``per_iteration`` request starts per event-loop iteration, in
arrival order, and a cancelled waiter gives its turn away."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from agent_replay.replay.client import SendGate


@pytest.mark.parametrize("per_iteration", [1, 3])
async def test_bounded_starts_per_iteration_in_order(per_iteration: int) -> None:
    gate = SendGate(per_iteration)
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
    await asyncio.gather(*(sender(i) for i in range(12)))
    tick.cancel()
    assert [i for i, _ in starts] == list(range(12))
    its = [it for _, it in starts]
    per_it = Counter(its)
    assert max(per_it.values()) == per_iteration, per_it  # never more, and it is used
    assert len(per_it) == -(-12 // per_iteration)  # so the 12 starts span this many
    assert its == sorted(its)


async def test_cancelled_waiter_gives_its_turn_away() -> None:
    gate = SendGate(1)
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
