"""Upstream failures reach the client as they would directly, and are recorded with their
cause; a client that goes away makes the proxy drop the upstream request."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from tests.record.upstream import Upstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _post(
    url: str, headers: dict | None = None, body: dict | None = None
) -> tuple[str, object]:
    """What a client experiences: ("ok", (status, bytes)) or ("error", exception type)."""
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/v1/chat/completions", data=orjson.dumps(body or CHAT), headers=headers or {}
            ) as r,
        ):
            return "ok", (r.status, await r.read())
    except aiohttp.ClientError as exc:
        return "error", type(exc)


async def _rows(rec: Recorder) -> list[dict]:
    await rec.flush()
    return read_trace(rec.config.out_dir)[0].to_pylist()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def test_refused(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    direct = await _post(dead)
    async with Recorder(dead, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60) as rec:
        proxied = await _post(rec.url)
        rows = await _rows(rec)
    assert direct[0] == "error"  # a refused connection; through the proxy, a 502 says so
    assert proxied[0] == "ok" and proxied[1][0] == 502  # type: ignore[index]
    err = orjson.loads(proxied[1][1])["error"]  # type: ignore[index]
    assert err["type"] == "upstream_error" and err["message"].endswith(
        f"upstream {dead} unreachable: connection refused"
    )
    assert rows[0]["error"].startswith("upstream connect failed")
    assert rows[0]["http_status"] == 0 and rows[0]["output_tokens"] == 0


async def test_500_passes_through(upstream: Upstream, recorder: Recorder) -> None:
    direct = await _post(upstream.url, {"X-Fail": "500"})
    proxied = await _post(recorder.url, {"X-Fail": "500"})
    assert direct == proxied and proxied[1][0] == 500  # type: ignore[index]
    row = (await _rows(recorder))[0]
    assert row["error"] == "http 500: server_error" and row["http_status"] == 500


async def test_reset_mid_stream(upstream: Upstream, recorder: Recorder) -> None:
    direct = await _post(upstream.url, {"X-Fail": "reset"})
    proxied = await _post(recorder.url, {"X-Fail": "reset"})
    assert direct[0] == proxied[0] == "error"
    assert direct[1] == proxied[1] == aiohttp.ClientPayloadError
    row = (await _rows(recorder))[0]
    assert row["error"].startswith("upstream connection reset")
    assert row["output_tokens"] == 3  # three chunks arrived before the reset
    assert row["http_status"] == 200


@pytest.mark.parametrize("where", ["hang", "hang-mid"])
async def test_upstream_timeout(upstream: Upstream, tmp_path: Path, where: str) -> None:
    async with Recorder(
        upstream.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60, read_timeout_s=0.3
    ) as rec:
        proxied = await _post(rec.url, {"X-Fail": where})
        rows = await _rows(rec)
    if where == "hang":
        assert proxied[0] == "ok" and proxied[1][0] == 504  # type: ignore[index]
    else:
        assert proxied == ("error", aiohttp.ClientPayloadError)
    assert rows[0]["error"] == "upstream timeout"


async def test_client_disconnect_cancels_upstream(upstream: Upstream, recorder: Recorder) -> None:
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            recorder.url + "/v1/chat/completions",
            data=orjson.dumps(CHAT),
            headers={"X-Words": "200", "X-Delay-Ms": "10"},
        )
        await resp.content.readany()
        resp.close()  # the client goes away mid-stream
    for _ in range(100):
        if upstream.cancelled:
            break
        await asyncio.sleep(0.02)
    assert upstream.cancelled == 1 and upstream.finished == 0
    for _ in range(100):
        if recorder.stats.requests:
            break
        await asyncio.sleep(0.02)
    row = (await _rows(recorder))[0]
    assert row["error"] == "client disconnected"
    assert 1 <= row["output_tokens"] < 200
