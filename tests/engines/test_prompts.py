"""Prompt materialization: deterministic ids, exact lengths, shared prefixes, text fitting."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from agent_replay.engines.prompts import TokenPrompts, block_seed, fit_text, splitmix64


def test_splitmix64_known_values():
    # reference values of splitmix64 seeded with 0 (Vigna's published sequence)
    assert [int(v) for v in splitmix64(0, 3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


def test_ids_are_stable_across_processes():
    code = (
        "from agent_replay.engines.prompts import TokenPrompts;"
        "print(TokenPrompts(16, salt=7).prompt([3, 4], 20).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=".",
    ).stdout
    here = TokenPrompts(16, salt=7).prompt([3, 4], 20).tolist()
    assert out.strip() == str(here)
    assert block_seed(7, 0, 3) == block_seed(7, 0, 3) != block_seed(8, 0, 3)


def test_exact_length_range_and_sharing():
    tp = TokenPrompts(16, salt=1, vocab_size=5000, low=1000)
    a = tp.prompt([1, 2, 3], 40)
    b = tp.prompt([1, 2, 9], 35)
    assert a.shape == (40,) and b.shape == (35,)
    assert a.min() >= 1000 and a.max() < 5000
    assert np.array_equal(a[:32], b[:32]) and not np.array_equal(a[32:35], b[32:35])
    c = tp.prompt([1, 2, 3], 40, clone=1)
    assert not np.array_equal(a[:16], c[:16])  # clones: disjoint blocks
    other_salt = TokenPrompts(16, salt=2, vocab_size=5000, low=1000).prompt([1, 2, 3], 40)
    assert not np.array_equal(a, other_salt)
    with pytest.raises(ValueError):
        tp.prompt([1], 17)


async def test_fit_text_reaches_exact_count():
    # a tokenizer whose cost per word varies (1 or 2 tokens) plus 3 template tokens
    async def count(text: str) -> int:
        return 3 + sum(1 + (len(w) > 5) for w in text.split())

    def tail(n: int) -> str:
        return " ".join(["abcdefg" if i % 3 == 0 else "ab" for i in range(n)])

    for target in (3, 10, 57, 200):
        text, got = (
            await fit_text("hello world", tail, target, count)
            if target > 5
            else await fit_text("", tail, target, count)
        )
        assert got == target, (target, text)
        assert await count(text) == target

    text, got = await fit_text("one two three four five six", tail, 6, count)
    assert got == 6 and text == "one two three"  # prefix longer than the target: cut


def test_prompts_from_a_cached_prefix_equal_prompts_built_whole() -> None:
    import numpy as np

    from agent_replay.engines.prompts import TokenPrompts

    warm, cold = TokenPrompts(16, salt=3), TokenPrompts(16, salt=3)
    ids = list(range(40, 100))
    warm.prompt(ids[:30], 30 * 16)  # the parent: its 30 blocks are cached joined
    child = warm.prompt(ids, 60 * 16 - 7)
    assert np.array_equal(child, cold.prompt(ids, 60 * 16 - 7))
    child[:] = 0  # the caller's array is its own
    assert np.array_equal(warm.prompt(ids[:30], 30 * 16), cold.prompt(ids[:30], 30 * 16))
