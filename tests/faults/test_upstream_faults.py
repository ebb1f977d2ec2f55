"""An upstream that breaks the protocol: broken chunked coding mid-stream ends the
client's response at once and is recorded as the upstream's error (not a client
disconnect after the client's own timeout); a malformed SSE event is recorded as such,
with every token of the other events kept."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
import pytest

from agent_replay.replay.record import Recorder
from tests.replay.rawserver import SSE_HEAD, RawServer, chunk

EV = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}


async def _through(
    tmp_path: Path, steps: list[bytes | float | str]
) -> tuple[float, str, dict[str, object]]:
    srv = RawServer(lambda i, got: steps)
    url = await srv.start()
    rec = Recorder(url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60)
    await rec.start()
    t0 = time.monotonic()
    outcome = "ok"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
            s.post(rec.url + "/v1/chat/completions", json=BODY) as r,
        ):
            await r.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome = type(exc).__name__
    took = time.monotonic() - t0
    await rec.stop()
    await srv.stop()
    rows = pq.read_table(tmp_path / "trace").to_pylist()
    assert len(rows) == 1
    return took, outcome, rows[0]


async def test_broken_chunked_coding_ends_at_once(tmp_path: Path) -> None:
    took, outcome, row = await _through(
        tmp_path, [SSE_HEAD + chunk(EV) + chunk(EV), 0.3, b"ZZZ\r\nxx\r\n", "hold"]
    )
    print(f"broken chunked coding: client's response ended after {took:.2f} s")
    assert outcome == "ClientPayloadError"  # the client's response is cut, as the upstream's was
    assert took < 3  # 0.3 s of upstream pause; it used to wait for the client's timeout
    assert str(row["error"]).startswith("upstream response broken: ")
    assert "chunk size" in str(row["error"])
    assert row["http_status"] == 200 and row["output_tokens"] == 2


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b'data: {"choices": 5}\n\n'])
async def test_malformed_event_is_flagged_and_tokens_kept(tmp_path: Path, bad: bytes) -> None:
    events = [EV, EV, bad, EV, EV, EV, b"data: [DONE]\n\n"]
    _, outcome, row = await _through(
        tmp_path, [SSE_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n"]
    )
    assert outcome == "ok"  # the client got every byte as sent
    assert row["output_tokens"] == 5  # every well-formed event counted
    assert str(row["error"]).startswith("malformed event from the upstream (1 in all")
    assert row["exact_chunk_tokens"] in (False, None)
