"""A hostile or broken server against both replay clients: an error event that echoes
every header it got (credentials, custom headers, Basic auth) leaves no value of any of
them in the record, in any encoding; broken chunked coding ends the request at once on
the aiohttp client as on the fast one, not at the request timeout."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import orjson
import pyarrow.parquet as pq
import pytest

from agent_replay.replay.client import Prepared, Sender, make_session
from agent_replay.replay.fastclient import FastSender
from agent_replay.replay.outcome import RequestRecord
from tests.replay.helpers import chain_rows, write_rows
from tests.replay.rawserver import SSE_HEAD, RawServer, Received, Step, chunk, events
from tests.replay.test_client_errors import prep, rec

KEY = "sk-KEY-SECRET-1234"
XAUTH = "XAUTH-SECRET-5678"
TRACE = "TRACE-SECRET-9012"
COOKIE = "COOKIE-SECRET-3456"
PASSWORD = "PASS-SECRET-7890"
BASIC = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()


def _forms(value: str) -> list[str]:
    b64 = base64.b64encode(value.encode()).decode()
    return [value, b64, b64.rstrip("="), quote(value, safe="")]


SECRETS = [f for v in (KEY, XAUTH, TRACE, COOKIE, PASSWORD, f"user:{PASSWORD}") for f in _forms(v)]


@pytest.fixture
async def raw() -> AsyncIterator[list[RawServer]]:
    servers: list[RawServer] = []
    yield servers
    for s in servers:
        await s.stop()


def _echo(i: int, got: Received) -> list[Step]:
    """Two good events, then an error event with the request head, each header value
    base64- and percent-encoded too, as a careless server's debug output."""
    head = got.head.decode()
    values = [line.partition(":")[2].strip() for line in head.split("\r\n")[1:] if ":" in line]
    echo = {
        "message": "bad request",
        "request": head,
        "b64": [base64.b64encode(v.encode()).decode() for v in values],
        "pct": [quote(v, safe="") for v in values],
    }
    evs = events(2)[:2] + [b"data: " + orjson.dumps({"error": echo}) + b"\n\n"]
    return [SSE_HEAD + b"".join(chunk(e) for e in evs) + b"0\r\n\r\n"]


def _prep() -> Prepared:
    p = prep(40, 5)
    p.headers.update(
        {
            "Authorization": f"Bearer {KEY}",
            "x-api-key": KEY,
            "X-Auth": XAUTH,
            "X-Trace": TRACE,
            "Cookie": f"sid={COOKIE}",
        }
    )
    return p


async def _send(
    kind: str,
    url: str,
    p: Prepared,
    r: RequestRecord,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> RequestRecord:
    if kind == "fast":
        fast = FastSender(url, timeout_s)
        try:
            await fast.send(p, r)
        finally:
            await fast.close()
    else:
        session = make_session(timeout_s, headers=headers)
        try:
            await Sender(session, url).send(p, r)
        finally:
            await session.close()
    return r


@pytest.mark.parametrize("kind", ["fast", "aiohttp"])
async def test_echoed_headers_leave_no_secret_in_the_record(
    raw: list[RawServer], kind: str
) -> None:
    srv = RawServer(_echo)
    raw.append(srv)
    url = await srv.start()
    p = _prep()
    p.headers["Authorization"] = BASIC  # the target URL's user-info, as run sends it
    records = [await _send(kind, url, p, rec(40, 5)) for _ in range(3)]
    p2 = _prep()
    records.append(await _send(kind, url, p2, rec(40, 5)))
    assert len(srv.received) == 4
    assert all(PASSWORD.encode() not in r.head or b"Basic" in r.head for r in srv.received)
    assert XAUTH.encode() in srv.received[0].head  # sent, only not kept
    leaks = [(i, s) for i, r in enumerate(records) for s in SECRETS if s in (r.error or "")]
    assert leaks == []
    assert [r.error_kind for r in records] == ["stream"] * 4
    assert all(
        "error event" in (r.error or "") and "<redacted>" in (r.error or "") for r in records
    )
    assert all(len(r.chunk_tokens) == 2 for r in records)  # the events before it are kept


@pytest.mark.parametrize("kind", ["fast", "aiohttp"])
async def test_broken_chunked_coding_ends_the_request_at_once(
    raw: list[RawServer], kind: str
) -> None:
    steps: list[Step] = [SSE_HEAD + chunk(events(5)[0]), 0.2, b"ZZZ\r\nxx\r\n", "hold"]
    srv = RawServer(lambda i, got: steps)
    raw.append(srv)
    url = await srv.start()
    t0 = time.monotonic()
    r = await _send(kind, url, prep(40, 5), rec(40, 5), timeout_s=30.0)
    took = time.monotonic() - t0
    assert (r.status, r.error_kind, r.http_status) == ("error", "stream", 200), r.error
    assert len(r.chunk_tokens) == 1
    assert took < 5, f"{kind}: {took:.1f} s"  # 0.2 s of pause; the timeout is 30 s
    if kind == "aiohttp":
        assert "response broken" in (r.error or ""), r.error


def _models_or_echo(i: int, got: Received) -> list[Step]:
    if got.head.startswith(b"GET /v1/models"):
        body = orjson.dumps({"object": "list", "data": [{"id": "echo-model", "object": "model"}]})
        return [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        ]
    return _echo(i, got)


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
async def test_run_writes_no_echoed_secret(
    raw: list[RawServer], tmp_path: Path, client: str
) -> None:
    """``agent-replay run`` with --api-key, --header X-Auth/X-Trace and user-info in the
    target, against a server whose every stream ends in an error event echoing the request
    head: every row failed with the echo, and no value is in any file or output."""
    srv = RawServer(_models_or_echo)
    raw.append(srv)
    url = await srv.start()
    trace = write_rows(tmp_path / "t.parquet", chain_rows(3, 2))
    target = url.replace("http://", f"http://user:{PASSWORD}@")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "run",
        str(trace),
        "--target",
        target,
        "--api-key",
        KEY,
        "--header",
        f"X-Auth={XAUTH}",
        "--header",
        f"X-Trace={TRACE}",
        "-o",
        str(tmp_path / "res"),
        "--no-progress",
        "--http-client",
        client,
        "--max-failure-rate",
        "1",
        "--scrape-interval",
        "0",
        "--speedup",
        "50",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert b"Traceback" not in err, err.decode()[-2000:]
    sent = b"".join(r.head for r in srv.received)
    assert KEY.encode() in sent and XAUTH.encode() in sent  # sent, only not kept
    rows = pq.read_table(tmp_path / "res" / "requests").to_pylist()
    assert len(rows) == 6
    assert all(r["error_kind"] == "stream" and "<redacted>" in r["error"] for r in rows)
    files = [p for p in (tmp_path / "res").rglob("*") if p.is_file()]
    blobs = [p.read_bytes() for p in files] + [out, err]
    leaks = [s for s in SECRETS if any(s.encode() in b for b in blobs)]
    assert leaks == [] and len(files) >= 2
    meta = orjson.loads((tmp_path / "res" / "run.json").read_bytes())
    assert ["X-Auth", "<redacted>"] in meta["options"]["headers"]
