"""The recorder on the wire: encoded request bodies reach the upstream as sent and are
hashed decoded; a client that closes after the end of its stream did not disconnect;
failed requests show in ``traces inspect`` and stay out of replay."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pyarrow as pa
import pytest
from aiohttp import web

from agent_replay.replay.cli.cmd_traces import failed_line
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.encodings import decode_body, decoders
from agent_replay.traces.failed import drop_failed
from agent_replay.traces.io import read_trace

BODY = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "messages": [
        {"role": "system", "content": "be brief " * 40},
        {"role": "user", "content": "hello there " * 60},
    ],
}
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":" a"}}],"usage":{"prompt_tokens":300,"completion_tokens":1,"total_tokens":301}}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" b"}}],"usage":{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302}}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302}}\n\n',
    b"data: [DONE]\n\n",
]


class RawUpstream:
    """Records request bytes exactly as they arrive (no decompression) and streams
    ``EVENTS``, then waits ``linger_s`` before ending the body."""

    def __init__(self, linger_s: float = 0.0) -> None:
        self.linger_s = linger_s
        self.seen: list[tuple[dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((dict(request.headers), await request.read()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in EVENTS:
            await resp.write(ev)
        await asyncio.sleep(self.linger_s)
        await resp.write_eof()
        return resp

    async def __aenter__(self) -> RawUpstream:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    async with RawUpstream() as up:
        yield up


async def _record(up_url: str, out: Path, sends: list[tuple[bytes, dict[str, str]]]) -> list[dict]:
    async with (
        Recorder(
            up_url, "127.0.0.1:0", out, flush_interval_s=60, hash_seed=7, block_size=16
        ) as rec,
        aiohttp.ClientSession(auto_decompress=False) as s,
    ):
        for data, headers in sends:
            async with s.post(
                rec.url + "/v1/chat/completions",
                data=data,
                headers={"Content-Type": "application/json", **headers},
            ) as r:
                assert r.status == 200
                await r.read()
    return read_trace(out)[0].to_pylist()


def _encoders() -> dict[str, object]:
    enc: dict[str, object] = {"gzip": lambda b: gzip.compress(b, mtime=0), "deflate": zlib.compress}
    if "br" in decoders():
        import brotli  # type: ignore[import-not-found]

        enc["br"] = brotli.compress
    if "zstd" in decoders():
        import zstandard  # type: ignore[import-not-found]

        enc["zstd"] = zstandard.ZstdCompressor().compress
    return enc


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
async def test_encoded_bodies_go_as_sent_and_hash_decoded(
    raw_upstream: RawUpstream, tmp_path: Path, coding: str
) -> None:
    enc = _encoders()
    if coding not in enc:
        pytest.skip(f"no {coding} decoder installed (optional: brotli, zstandard)")
    plain = orjson.dumps(BODY)
    packed = enc[coding](plain)  # type: ignore[operator]
    rows = await _record(
        raw_upstream.url, tmp_path / "t", [(plain, {}), (packed, {"Content-Encoding": coding})]
    )
    (h0, b0), (h1, b1) = raw_upstream.seen
    assert b0 == plain and b1 == packed  # byte for byte, still encoded
    assert h1["Content-Encoding"] == coding and "Content-Encoding" not in h0
    assert rows[0]["hash_ids"] and rows[1]["hash_ids"] == rows[0]["hash_ids"]
    assert rows[1]["model"] == "m" and rows[1]["undecoded_body"] is None
    assert rows[1]["input_tokens"] == 300 and rows[1]["error"] is None


async def test_a_body_no_decoder_knows_is_forwarded_and_flagged(
    raw_upstream: RawUpstream, tmp_path: Path
) -> None:
    packed = b"\x28\xb5\x2f\xfdnot-really-zstd"
    rows = await _record(
        raw_upstream.url, tmp_path / "t", [(packed, {"Content-Encoding": "x-unknown"})]
    )
    headers, body = raw_upstream.seen[0]
    assert body == packed and headers["Content-Encoding"] == "x-unknown"
    assert "no decoder installed" in rows[0]["undecoded_body"]
    assert rows[0]["hash_ids"] is None and rows[0]["error"] is None
    assert rows[0]["input_tokens"] == 300 and rows[0]["output_tokens"] == 2


def test_decode_body_layers_and_errors() -> None:
    data = b'{"a": 1}'
    twice = zlib.compress(gzip.compress(data, mtime=0))
    assert decode_body(twice, "gzip, deflate") == (data, None)
    assert decode_body(data, None) == (data, None)
    out, why = decode_body(b"garbage", "gzip")
    assert out is None and why is not None and why.startswith("request content-encoding 'gzip'")


async def test_closing_after_the_end_event_is_not_a_disconnect(tmp_path: Path) -> None:
    """The OpenAI SDK stops reading at [DONE] and closes; the upstream's body ends later."""
    async with (
        RawUpstream(linger_s=0.5) as up,
        Recorder(up.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60) as rec,
    ):
        async with aiohttp.ClientSession() as s:
            resp = await s.post(rec.url + "/v1/chat/completions", data=orjson.dumps(BODY))
            got = b""
            while b"[DONE]" not in got:
                got += await resp.content.readany()
            resp.close()
        for _ in range(200):
            if rec.stats.requests:
                break
            await asyncio.sleep(0.01)
        await rec.flush()
        row = read_trace(tmp_path / "t")[0].to_pylist()[0]
    assert row["error"] is None
    assert row["output_tokens"] == 2 and row["chunk_tokens"] == [1, 1]


def _trace(errors: list[str | None], parents: list[int]) -> pa.Table:
    n = len(errors)
    return pa.table(
        {
            "session_id": ["s"] * n,
            "request_index": list(range(n)),
            "parent_index": parents,
            "error": errors,
            "depends_on": [[p] if p >= 0 else [] for p in parents],
            "arrival_ns": [0, 100, 200, 300],
            "end_ns": [50, 20, 50, 50],
            "think_ns": [None, 50, 50, 180],
        }
    )


def test_failed_rows_are_dropped_and_their_children_relinked() -> None:
    # 0 ok; 1 failed (child of 0); 2 retry of 1 (sibling, parent 0); 3 child of 1 (rule 2)
    t = _trace([None, "http 500: server_error", None, None], [0 - 1, 0, 0, 1])
    kept, n = drop_failed(t)
    assert n == 1
    assert kept.column("request_index").to_pylist() == [0, 2, 3]
    assert kept.column("parent_index").to_pylist() == [-1, 0, 0]
    assert kept.column("depends_on").to_pylist() == [[], [0], [0]]
    # 2 waited for 0 all along; 3 waited for 1 (ended 120) and now for 0 (ended 50)
    assert kept.column("think_ns").to_pylist() == [None, 50, 250]
    assert failed_line(t) == (
        "failed requests: 1 of 4 (25.0%): http 500 (1); left out of replay unless --include-failed"
    )
    assert failed_line(kept) == "failed requests: none"


async def test_failed_recorded_requests_show_in_inspect_and_stay_out_of_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three turns of one conversation, the second refused by the engine (500) and retried,
    and a second session: inspect counts the failure; replay sends 4 requests (with one
    worker or two), or 5 with --include-failed."""
    import pyarrow.parquet as pq

    from agent_replay.engines.sim import SimProcess, SimServer
    from agent_replay.replay.cli import main
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    trace = tmp_path / "t"
    msgs: list[dict] = [{"role": "user", "content": "start"}]
    async with (
        SimServer("fast") as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
        aiohttp.ClientSession() as s,
    ):
        for fault in ("", "error=1,status=500", "", ""):
            body = {"model": "sim-fast", "messages": msgs, "max_tokens": 4}
            async with s.post(
                rec.url + "/v1/chat/completions",
                json=body,
                headers={"X-Sim-Fault": fault} if fault else {},
            ) as r:
                data = await r.json()
            if r.status == 200:
                msgs = [*msgs, data["choices"][0]["message"], {"role": "user", "content": "more"}]
        other = {
            "model": "sim-fast",
            "messages": [{"role": "user", "content": "other"}],
            "max_tokens": 4,
        }  # a second session, so that two workers get one each
        async with s.post(rec.url + "/v1/chat/completions", json=other) as r:
            assert r.status == 200
    rows = [r for r in read_trace(trace)[0].to_pylist() if r["session_id"] == "auto-00001"]
    assert [r["error"] is not None for r in sorted(rows, key=lambda r: r["request_index"])] == [
        False,
        True,
        False,
        False,
    ]
    assert main(["traces", "inspect", str(trace)]) == 0
    assert "failed requests: 1 of 5 (20.0%): http 500 (1)" in capsys.readouterr().out.replace(
        "\n", " "
    )
    sent = {}
    with SimProcess("fast") as target:
        for include, workers in ((False, 1), (True, 1), (False, 2)):
            out = tmp_path / f"r{include}{workers}"
            await arun(
                RunConfig(
                    trace=str(trace),
                    target=target.url,
                    output=str(out),
                    progress=False,
                    scrape_interval_s=0,
                    include_failed=include,
                    workers=workers,
                ),
                progress=None,
            )
            sent[(include, workers)] = pq.read_table(out / "requests").num_rows
    assert sent == {(False, 1): 4, (True, 1): 5, (False, 2): 4}
