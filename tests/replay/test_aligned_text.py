"""Block-aligned text prompts: calibrated once against a tokenizer's /tokenize answers,
then exact token counts through the chat template and server blocks that are shared
exactly when hash ids are, with no call per request."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent_replay.engines.prompts import AlignedText
from agent_replay.engines.sim import SimTokenizer
from agent_replay.replay.textcal import CalibrationError, calibrate

BS = 16


class FakeTarget:
    """/tokenize answers of the simulated engine's tokenizer, counting calls."""

    def __init__(self) -> None:
        self.tok = SimTokenizer()
        self.calls = 0

    async def tokenize(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls += 1
        if "messages" in body:
            ids = self.tok.chat_ids(body["messages"])
        else:
            ids = self.tok.encode(body["prompt"])
        return {"count": len(ids), "tokens": ids}

    def prompt_ids(self, text: str) -> list[int]:
        return self.tok.chat_ids([{"role": "user", "content": text}])


async def _calibrated() -> tuple[AlignedText, FakeTarget]:
    target = FakeTarget()
    aligned = await calibrate(target.tokenize, "m", BS, salt=5)
    return aligned, target


async def test_calibration_finds_one_token_words_and_the_template() -> None:
    aligned, target = await _calibrated()
    # the sim's template: <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n
    assert (aligned.head, aligned.overhead) == (3, 8)
    assert len(aligned.words) >= 64
    assert all(target.tok.count(" " + w) == 1 for w in aligned.words)
    assert target.calls < 40


@pytest.mark.parametrize("n", [9, 10, 16, 17, 40, 63, 64, 65, 200, 1000])
async def test_exact_counts_through_the_template(n: int) -> None:
    aligned, target = await _calibrated()
    hash_ids = list(range(100, 100 + -(-n // BS)))
    text = aligned.prompt(hash_ids, n, clone=0, tail_key=7)
    assert text is not None
    assert len(target.prompt_ids(text)) == n


async def test_too_short_for_the_template_is_none() -> None:
    aligned, _ = await _calibrated()
    assert aligned.prompt([1], 8, clone=0, tail_key=1) is None


async def test_server_blocks_shared_exactly_as_hash_ids() -> None:
    """A parent and its child share 6 hash ids, then differ: the server's token blocks
    (through the template) are equal for exactly the first 6 and differ after; another
    clone shares none."""
    aligned, target = await _calibrated()
    parent = aligned.prompt([1, 2, 3, 4, 5, 6, 7], 7 * BS, clone=0, tail_key=1)
    child = aligned.prompt([1, 2, 3, 4, 5, 6, 8, 9, 10], 9 * BS - 3, clone=0, tail_key=2)
    other = aligned.prompt([1, 2, 3, 4, 5, 6, 7], 7 * BS, clone=1, tail_key=1)
    assert parent and child and other

    def blocks(text: str) -> list[tuple[int, ...]]:
        ids = target.prompt_ids(text)
        return [tuple(ids[i : i + BS]) for i in range(0, len(ids) - BS + 1, BS)]

    p, c, o = blocks(parent), blocks(child), blocks(other)
    shared = next(i for i, (x, y) in enumerate(zip(p, c, strict=False)) if x != y)
    assert shared == 6
    assert p[0] != o[0]


async def test_words_that_are_not_independent_fail_calibration() -> None:
    async def tokenize(body: Mapping[str, Any]) -> Mapping[str, Any]:
        text = body["messages"][0]["content"] if "messages" in body else body["prompt"]
        n = len(text.split()) + (len(text) // 50)  # long texts merge: not additive
        return {"count": n + (5 if "messages" in body else 0), "tokens": list(range(n))}

    with pytest.raises(CalibrationError):
        await calibrate(tokenize, "m", BS, salt=0)


async def test_a_target_without_tokenize_fails_with_a_hint(tmp_path: Path) -> None:
    from aiohttp import web

    from agent_replay.engines.sim import SimServer
    from agent_replay.errors import AgentReplayError
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    class NoTokenize(SimServer):
        async def handle_tokenize(self, request: web.Request) -> web.Response:
            return web.Response(status=404, text="Not Found")

    trace = Path(__file__).resolve().parents[2] / "traces" / "samples"
    sample = sorted(trace.glob("*.parquet"))[0]
    async with NoTokenize("fast") as sim:
        with pytest.raises(AgentReplayError) as exc:
            await arun(
                RunConfig(
                    trace=str(sample),
                    target=sim.url,
                    output=str(tmp_path / "r"),
                    progress=False,
                    scrape_interval_s=0,
                    api="chat",
                    max_sessions=1,
                ),
                progress=None,
            )
    assert "HTTP 404" in str(exc.value) and "--api completions" in str(exc.value)


async def test_a_target_without_tokenize_replays_with_an_offline_tokenizer(tmp_path: Path) -> None:
    """--tokenizer: one-token words from a local tokenizer (here a word-level one that
    agrees with the sim's tokenizer on short words), the template's size from two real
    requests' usage; prompts are then exact."""
    import pyarrow.parquet as pq
    from aiohttp import web
    from tokenizers import Tokenizer, models, pre_tokenizers

    from agent_replay.engines.prompts import candidate_words
    from agent_replay.engines.sim import SimServer
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(candidate_words(400, 0))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))

    class NoTokenize(SimServer):
        async def handle_tokenize(self, request: web.Request) -> web.Response:
            return web.Response(status=404, text="Not Found")

    sample = Path(__file__).resolve().parents[2] / "traces" / "samples" / "agent-small.parquet"
    async with NoTokenize("fast") as sim:
        summary = await arun(
            RunConfig(
                trace=str(sample),
                target=sim.url,
                output=str(tmp_path / "r"),
                progress=False,
                scrape_interval_s=0,
                api="chat",
                max_sessions=2,
                speedup=50,
                tokenizer=str(path),
                salt=0,
            ),
            progress=None,
        )
    rows = pq.read_table(tmp_path / "r" / "requests").to_pylist()
    assert summary.failed == 0 and rows
    assert all(r["prompt_tokens"] == r["expected_input_tokens"] for r in rows)


async def test_text_from_a_cached_prefix_equals_text_built_whole() -> None:
    warm, _ = await _calibrated()
    cold = AlignedText(
        warm.words.tolist(), head=warm.head, overhead=warm.overhead, block_size=BS, salt=5
    )
    ids = list(range(500, 560))
    warm.prompt(ids[:40], 40 * BS, clone=0, tail_key=1)  # the parent's prefix is cached
    assert warm.prompt(ids, 60 * BS - 5, 0, 2) == cold.prompt(ids, 60 * BS - 5, 0, 2)
    assert warm.prompt(ids[:40], 40 * BS, 1, 1) == cold.prompt(ids[:40], 40 * BS, 1, 1)
