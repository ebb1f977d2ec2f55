"""The OTLP/HTTP receiver's bad bodies: each gets its status and one line, in OTLP's error
shape (a ``google.rpc.Status``, protobuf for a protobuf export), and nothing is recorded
from it; a compression bomb and the largest body allowed keep memory bounded."""

from __future__ import annotations

import asyncio
import gzip
import io
import signal
import sys
import zlib
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_replay.replay.record.otlp_receiver import OtlpReceiver, status_protobuf
from tests.traces.test_otel import GENAI

LIMIT = 64 << 10
BOMB = gzip.compress(b" " * (8 << 20), 9)
"""8 MiB of spaces in about 8 KiB: far over LIMIT once inflated."""
DEEP = b'{"resourceSpans": ' + b"[" * 2000 + b"]" * 2000 + b"}"

BAD = [
    # (what, body, headers, status, the one line)
    (
        "declared over the limit",
        b"{}" * (LIMIT // 2 + 1),
        {},
        413,
        "export over the 65,536-byte limit (--max-body)",
    ),
    (
        "a gzip bomb",
        BOMB,
        {"Content-Encoding": "gzip"},
        413,
        "export over the 65,536-byte limit (--max-body)",
    ),
    (
        "corrupt gzip",
        b"\x1f\x8b\x08\x00garbage-not-deflate" * 4,
        {"Content-Encoding": "gzip"},
        400,
        "body not decodable as Content-Encoding gzip: ",
    ),
    (
        "truncated gzip",
        gzip.compress(orjson.dumps(GENAI[0]))[:-30],
        {"Content-Encoding": "gzip"},
        400,
        "body not decodable as Content-Encoding gzip: it ends early (",
    ),
    (
        "corrupt deflate",
        zlib.compress(orjson.dumps(GENAI[0]))[:40],
        {"Content-Encoding": "deflate"},
        400,
        "body not decodable as Content-Encoding deflate: ",
    ),
    (
        "an unknown content coding",
        orjson.dumps(GENAI[0]),
        {"Content-Encoding": "br"},
        415,
        "unsupported Content-Encoding 'br': send gzip or none",
    ),
    (
        "an unknown content type",
        orjson.dumps(GENAI[0]),
        {"Content-Type": "application/xml"},
        415,
        "unsupported Content-Type 'application/xml': send application/json or "
        "application/x-protobuf",
    ),
    ("nesting past the parser's limit", DEEP, {}, 400, "not valid JSON: "),
]


async def _post(
    s: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    h = {"Content-Type": "application/json", **headers}
    async with s.post(url, data=io.BytesIO(body), headers=h, compress=None) as r:
        return r.status, r.content_type, await r.read()


@pytest.mark.parametrize("what, body, headers, status, line", BAD, ids=[b[0] for b in BAD])
async def test_bad_body_gets_its_status_and_one_line(
    tmp_path: Path, what: str, body: bytes, headers: dict[str, str], status: int, line: str
) -> None:
    rec = OtlpReceiver("127.0.0.1:0", tmp_path / "t", flush_interval_s=60, max_body=LIMIT)
    await rec.start()
    try:
        async with aiohttp.ClientSession() as s:
            st, ctype, reply = await _post(s, rec.url + "/v1/traces", body, headers)
            assert (st, ctype) == (status, "application/json"), reply
            message = orjson.loads(reply)["message"]
            assert message.startswith(line) and "\n" not in message, message
            assert orjson.loads(reply)["code"] == (8 if status == 413 else 3)
            # the receiver goes on: a good export after it is recorded
            good = await _post(s, rec.url + "/v1/traces", orjson.dumps(GENAI[0]), {})
            assert good[0] == 200
    finally:
        await rec.stop()
    assert rec.stats.rejected == 1 and rec.stats.last_error == message
    assert rec.stats.exports == 1 and rec.stats.rows == 2


async def test_protobuf_errors_come_back_in_protobuf(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.proto")
    rec = OtlpReceiver("127.0.0.1:0", tmp_path / "t", flush_interval_s=60, max_body=LIMIT)
    await rec.start()
    try:
        async with aiohttp.ClientSession() as s:
            st, ctype, reply = await _post(
                s, rec.url + "/v1/traces", b"\xff\xff", {"Content-Type": "application/x-protobuf"}
            )
    finally:
        await rec.stop()
    assert (st, ctype) == (400, "application/x-protobuf")
    assert rec.stats.last_error is not None
    assert reply == status_protobuf(3, rec.stats.last_error)
    assert rec.stats.last_error.startswith("not a protobuf ExportTraceServiceRequest: ")
    assert status_protobuf(300, "é") == b"\x08\xac\x02\x12\x02\xc3\xa9"  # varint, UTF-8


def _spans_body(n: int) -> bytes:
    """One export of ``n`` small chat spans."""
    sp = (
        '{{"traceId":"{t:032x}","spanId":"{s:016x}","name":"chat","startTimeUnixNano":"1",'
        '"endTimeUnixNano":"2","attributes":[{{"key":"gen_ai.operation.name","value":'
        '{{"stringValue":"chat"}}}},{{"key":"gen_ai.usage.input_tokens","value":'
        '{{"intValue":"10"}}}},{{"key":"gen_ai.usage.output_tokens","value":'
        '{{"intValue":"1"}}}}]}}'
    )
    return (
        '{"resourceSpans":[{"resource":{},"scopeSpans":[{"spans":['
        + ",".join(sp.format(t=i // 50, s=i + 1) for i in range(n))
        + "]}]}]}"
    ).encode()


N_SPANS = 24_000


@pytest.mark.slow
async def test_peak_memory_with_a_bomb_and_the_largest_body(tmp_path: Path) -> None:
    """The receiver as a program, sent a gzip bomb (1 GiB inflated, 1 MiB sent) and then a
    body just under its limit (7.7 MiB of spans): its peak RSS stays bounded by the limit,
    not by what the bomb inflates to."""
    out = tmp_path / "trace"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PEAK, str(out), stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    try:
        url = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode().split()[-1]
        bomb = gzip.compress(b"\0" * (1 << 30), 6)
        body = _spans_body(N_SPANS)
        assert len(bomb) < 2 << 20 and len(body) < 8 << 20
        async with aiohttp.ClientSession() as s:
            st, _, reply = await _post(s, url + "/v1/traces", bomb, {"Content-Encoding": "gzip"})
            assert st == 413, reply
            st, _, reply = await _post(s, url + "/v1/traces", body, {})
            assert st == 200, reply
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    base_kb, peak_kb, rows = map(int, err.decode().split()[-3:])
    assert rows == N_SPANS
    print(
        f"receiver RSS: {base_kb / 1024:.0f} MiB started, {peak_kb / 1024:.0f} MiB peak "
        f"after a {len(bomb) >> 10} KiB gzip bomb (1 GiB inflated) and a "
        f"{len(body) / (1 << 20):.1f} MiB export of {N_SPANS:,} spans"
    )
    assert peak_kb - base_kb < 400 << 10, (base_kb, peak_kb)


_PEAK = """
import asyncio, resource, signal, sys
from agent_replay.replay.record.otlp_receiver import OtlpReceiver

async def main():
    rec = OtlpReceiver("127.0.0.1:0", sys.argv[1], flush_interval_s=600, max_body=8 << 20)
    await rec.start()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("listening", rec.url, file=sys.stderr, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await rec.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(base, peak, rec.stats.rows, file=sys.stderr, flush=True)

asyncio.run(main())
"""
