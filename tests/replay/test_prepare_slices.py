"""A big prompt with new blocks is prepared in slices: the same token ids as in one go, and
the event loop runs other work between the slices."""

from __future__ import annotations

import asyncio

import orjson

from agent_replay.engines.prompts import TokenPrompts
from agent_replay.replay.plan import PlannedRequest
from agent_replay.replay.prepare import Preparer


def request(tokens: int, clone: int = 0) -> PlannedRequest:
    return PlannedRequest(
        "s",
        clone,
        1,
        0,
        0,
        0,
        0,
        tokens,
        8,
        list(range(-(-tokens // 16))),
        "completions",
        None,
        None,
        None,
    )


async def test_sliced_prompt_has_the_same_tokens_and_lets_the_loop_run() -> None:
    prep = Preparer(model="m", block_size=16, salt=5)
    q = request(20_007)  # 1,251 blocks: 10 slices of 128
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.ensure_future(other())
    await asyncio.sleep(0)
    before = ticks
    got = await prep.prepare(q, "r", "k")
    t.cancel()
    assert ticks - before >= 20_007 // (16 * Preparer.BLOCKS_PER_SLICE)
    want = TokenPrompts(16, salt=5).prompt(q.hash_ids, q.input_tokens, q.clone)
    assert orjson.loads(got.body)["prompt"] == want.tolist()


async def test_a_small_or_cached_prompt_is_made_in_one_go() -> None:
    prep = Preparer(model="m", block_size=16, salt=5)
    assert list(prep.tokens.uncached(request(1_000).hash_ids, 1_000)) == list(range(63))
    await prep.prepare(request(20_007), "r", "k")
    # the whole prefix is cached now: only the last, partial block is left to make
    assert len(prep.tokens.uncached(request(20_007).hash_ids, 20_007)) <= 1
