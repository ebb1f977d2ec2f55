"""The OTLP/HTTP receiver: exports posted over real HTTP become the trace the importer makes
of the same exports; bad bodies get a clear 4xx; Ctrl-C loses nothing received."""

from __future__ import annotations

import asyncio
import gzip
import signal
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_replay.errors import InputError
from agent_replay.replay.record.otlp_receiver import EXPORTS_FILE, OtlpReceiver
from agent_replay.traces.importers import import_paths
from agent_replay.traces.io import read_trace
from tests.traces.test_otel import GENAI, claude_event, logs

KEYS = (
    "session_id",
    "request_index",
    "parent_index",
    "arrival_ns",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "end_ns",
    "agent_id",
    "depends_on",
    "think_ns",
)


def _view(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return sorted(tuple(r[k] for k in KEYS) for r in rows)


async def _post(
    s: aiohttp.ClientSession, url: str, body: bytes, ctype: str = "application/json", **headers: str
) -> tuple[int, bytes]:
    async with s.post(url, data=body, headers={"Content-Type": ctype, **headers}) as r:
        return r.status, await r.read()


async def test_exports_become_the_imported_trace(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    rec = OtlpReceiver("127.0.0.1:0", out, flush_interval_s=60, max_body=64 << 10)
    await rec.start()
    try:
        async with aiohttp.ClientSession() as s:
            for e in GENAI:
                assert await _post(s, rec.url + "/v1/traces", orjson.dumps(e)) == (200, b"{}")
                await rec.flush()  # a trace written after each: later ones build on it
                assert read_trace(out / "part-00001.parquet")[0].num_rows == (
                    2 if e is GENAI[0] else 5
                )
            # a gzipped body, as the Collector sends by default
            ev = logs(
                claude_event(
                    2.0,
                    session__id="s-1",
                    model="c",
                    input_tokens="10",
                    output_tokens="5",
                    cache_read_tokens="0",
                    cache_creation_tokens="0",
                    duration_ms="1000",
                )
            )
            st, _ = await _post(
                s,
                rec.url + "/v1/logs",
                gzip.compress(orjson.dumps(ev)),
                **{"Content-Encoding": "gzip"},
            )
            assert st == 200
            assert (await _post(s, rec.url + "/v1/metrics", b'{"resourceMetrics": []}'))[0] == 200
            # malformed exports: a clear 400 each, nothing recorded from them
            st, body = await _post(s, rec.url + "/v1/traces", b'{"resourceSpans": [')
            assert st == 400 and orjson.loads(body)["message"].startswith("not valid JSON")
            st, body = await _post(s, rec.url + "/v1/traces", b'{"resourceLogs": []}')
            assert (
                st == 400 and 'expected {"resourceSpans": [...]}' in orjson.loads(body)["message"]
            )
            st, body = await _post(s, rec.url + "/v1/traces", b"[1, 2]")
            assert st == 400 and "not an object" in orjson.loads(body)["message"]
            st, _ = await _post(s, rec.url + "/v1/traces", b" " * (128 << 10))
            assert st == 413
            # the limit holds for the decoded body: a small gzip of a large one gets 413
            bomb = gzip.compress(b" " * (8 << 20))
            assert len(bomb) < 64 << 10
            st, _ = await _post(s, rec.url + "/v1/traces", bomb, **{"Content-Encoding": "gzip"})
            assert st == 413
            st, body = await _post(s, rec.url + "/v1/traces", b"\x0a\x00", "application/x-protobuf")
            try:
                import opentelemetry.proto  # noqa: F401
            except ImportError:
                assert st == 415 and b"otlp extra" in body
            else:
                assert st == 200
                st, body = await _post(
                    s, rec.url + "/v1/traces", b"\xff\xff", "application/x-protobuf"
                )
                assert st == 400 and b"not a protobuf ExportTraceServiceRequest" in body
    finally:
        await rec.stop()
    assert rec.stats.exports >= 4 and rec.stats.rejected >= 4
    table, meta = read_trace(out / "part-00001.parquet")
    assert meta.source == "imported:otel" and meta.extra["receiver"]["listen"] == rec.url
    assert table.num_rows == 6
    # the exports kept beside the trace import to the same requests
    again = import_paths([out / EXPORTS_FILE])
    assert _view(again.table.to_pylist()) == _view(table.to_pylist())
    spans_only = tmp_path / "spans.jsonl"
    spans_only.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in GENAI))
    direct = _view(import_paths([spans_only]).table.to_pylist())
    assert [r for r in _view(table.to_pylist()) if r[0] == "conv-1"] == direct


def test_loopback_unless_told(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a loopback address"):
        OtlpReceiver("0.0.0.0:0", tmp_path / "t")
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / EXPORTS_FILE).write_text("{}\n")
    with pytest.raises(InputError, match="exists"):
        OtlpReceiver("127.0.0.1:0", tmp_path / "u")


async def test_ctrl_c_writes_everything_received(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "record-otlp",
        "--listen",
        "127.0.0.1:0",
        "-o",
        str(out),
        "--flush-interval",
        "600",
        "--quiet",
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    url = line.split(" at ")[1].split()[0]
    async with aiohttp.ClientSession() as s:
        for e in GENAI:
            assert (await _post(s, url + "/v1/traces", orjson.dumps(e)))[0] == 200
    assert not (out / "part-00001.parquet").exists()  # the flush interval has not come
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    assert b"stopped; 2 exports, 5 requests written" in err
    assert read_trace(out)[0].num_rows == 5
