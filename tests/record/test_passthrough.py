"""The client sees what the upstream sent: bytes, status, end-to-end headers."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from tests.record.upstream import Upstream

CASES = [
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        {},
    ),
    (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {},
    ),
    (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": False},
        },
        {},
    ),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {}),
    (
        "/v1/completions",
        {"model": "m", "prompt": [1, 2, 3], "stream": True, "return_token_ids": True},
        {},
    ),
    ("/v1/completions", {"model": "m", "prompt": "abc"}, {"X-Fail": "gzip"}),
    (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 9,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        {},
    ),
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}, {}),
    ("/v1/chat/completions", {"model": "m", "messages": []}, {"X-Fail": "500"}),
]


async def _get(url: str, path: str, body: dict, headers: dict) -> tuple[int, dict, bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(
            url + path,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", "Accept-Encoding": "gzip", **headers},
        ) as r,
    ):
        return r.status, dict(r.headers), await r.read()


@pytest.mark.parametrize(("path", "body", "headers"), CASES)
async def test_bytes_identical(
    upstream: Upstream, recorder: Recorder, path: str, body: dict, headers: dict
) -> None:
    direct = await _get(upstream.url, path, body, headers)
    proxied = await _get(recorder.url, path, body, headers)
    assert proxied[0] == direct[0]
    assert proxied[2] == direct[2]
    for h in ("Content-Type", "Content-Encoding", "Cache-Control", "Transfer-Encoding"):
        assert proxied[1].get(h) == direct[1].get(h), h
    # the upstream got include_usage whenever the client streamed chat/completions
    sent = orjson.loads(upstream.seen[-1][2])
    if sent.get("stream") and "completions" in path:
        assert sent["stream_options"]["include_usage"] is True
    await recorder.flush()
    table, meta = read_trace(recorder.config.out_dir)
    assert table.num_rows == 1
    assert meta.source == "recorded"
    row = table.to_pylist()[0]
    assert row["output_tokens"] == (0 if headers.get("X-Fail") == "500" else 5)
    assert row["input_tokens"] >= (0 if headers.get("X-Fail") == "500" else 1)
    assert (row["error"] is not None) == (headers.get("X-Fail") == "500")


async def test_get_passthrough_and_hop_by_hop(upstream: Upstream, recorder: Recorder) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.get(
            recorder.url + "/v1/models?x=1",
            headers={
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "secret-hop",
                "X-Keep": "k",
                "Authorization": "Bearer sk-x",
            },
        ) as r,
    ):
        assert r.status == 200
        assert r.headers["X-Upstream"] == "yes"
        assert (await r.json())["data"][0]["id"] == "m"
    path, headers, _ = upstream.seen[-1]
    assert path == "/v1/models"
    assert "X-Hop" not in headers
    assert headers["X-Keep"] == "k"
    assert headers["Authorization"] == "Bearer sk-x"  # forwarded, never recorded
    assert headers["Host"] == f"127.0.0.1:{upstream.port}"
    assert recorder.stats.requests == 0
