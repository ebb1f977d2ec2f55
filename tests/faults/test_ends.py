"""Runs and recordings end honestly: a final status and the exit code that goes with it,
one line and no traceback, no process left behind.

- SIGTERM to ``run --workers 2``: every process gone, run.json ``interrupted`` with a
  summary that counts the rows on disk, in-flight requests ``cancelled`` (not failures).
- every request refused (401): status ``failed``, exit 1; ``--abort-after-failures``
  stops early with ``aborted``; a key-protected engine works with ``--api-key`` (probe
  included) and a base URL ending in ``/v1``.
- the server killed mid-run: a final status, exit 1, no traceback.
- a port in use (``engines sim``, ``record``): one line, exit 2.
- the recorder's drain after SIGTERM: new requests on a kept-alive connection are refused,
  and a stalled upstream cannot hold the stop past ``--drain-timeout``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim.process import SimProcess
from tests.faults.runprobe import descendants
from tests.replay.helpers import MS, chain_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]
KEY = "sim-key-123456"


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


NO_SCRAPE = ("--no-progress", "--scrape-interval", "0")
"""For runs whose end is not about /metrics: without the scraper's process (its start is
about a second of CPU per run)."""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_ends_run_and_workers(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(40, 4, gap_ns=150 * MS, output_tokens=6))
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(out),
                "--workers",
                "2",
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list((out / "requests").glob("part-*.parquet")):
            time.sleep(0.1)
        time.sleep(0.5)
        children = descendants(run.pid)
        assert len(children) >= 3  # two workers and the scraper at least
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=90)
        time.sleep(1.0)
        left = [p for p in children if _alive(p)]
    print(f"SIGTERM: {len(children)} child processes, {len(left)} left")
    assert left == []
    assert run.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted"
    rows = pq.read_table(out / "requests").to_pydict()
    n = len(rows["status"])
    ok = sum(1 for s in rows["status"] if s == "ok")
    assert 0 < ok < 160
    summary = meta["summary"]
    assert summary["ok"] == ok and summary["total"] == 160 and summary["failed"] == 0
    assert summary["cancelled"] == n - ok
    assert set(rows["error_kind"]) <= {None, "cancelled"}


@pytest.mark.slow
def test_refused_requests_fail_the_run_and_abort(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(6, 3, gap_ns=20 * MS, output_tokens=4))
    with SimProcess("fast", extra_args=["--api-key", KEY]) as sim:
        # no key: the probe says so, one line, exit 3
        r = _run("run", str(trace), "--target", sim.url, "-o", str(tmp_path / "a"), *NO_SCRAPE)
        assert r.returncode == 3 and "wants a key" in r.stderr and "Traceback" not in r.stderr
        # the key by option, and a base URL ending in /v1: every request served
        r = _run(
            "run",
            str(trace),
            "--target",
            sim.url + "/v1",
            "-o",
            str(tmp_path / "b"),
            *NO_SCRAPE,
            "--api-key",
            KEY,
            "--speedup",
            "5",
        )
        assert r.returncode == 0, r.stderr
        meta = json.loads((tmp_path / "b" / "run.json").read_text())
        assert meta["status"] == "ok" and meta["summary"]["ok"] == 18
        assert meta["options"]["api_key"] == "<redacted>"
        assert KEY not in (tmp_path / "b" / "run.json").read_text()
        # the key by environment
        env_run = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(tmp_path / "c"),
                *NO_SCRAPE,
                "--speedup",
                "5",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "OPENAI_API_KEY": KEY},
        )
        assert env_run.returncode == 0, env_run.stderr
        # a wrong key in a header (the probe passes with the right one in x-api-key...):
        # every request refused -> failed, exit 1
        r = _run(
            "run",
            str(trace),
            "--target",
            sim.url,
            "-o",
            str(tmp_path / "d"),
            *NO_SCRAPE,
            "--header",
            "Authorization=Bearer wrong",
            "--header",
            f"x-api-key={KEY}",
            "--speedup",
            "5",
        )
        assert r.returncode == 0, r.stderr  # x-api-key suffices for the engine
        r = _run(
            "run",
            str(trace),
            "--target",
            sim.url,
            "-o",
            str(tmp_path / "e"),
            *NO_SCRAPE,
            "--api-key",
            "wrong-key",
            "--speedup",
            "5",
        )
        assert r.returncode == 3  # the probe is refused first
    # every request refused past the probe: a server that lists models but refuses work
    with SimProcess("fast") as ok_sim:
        srv = _RefusingProxy(ok_sim.url)
        try:
            r = _run(
                "run",
                str(trace),
                "--target",
                srv.url,
                "-o",
                str(tmp_path / "f"),
                *NO_SCRAPE,
                "--speedup",
                "5",
            )
            assert r.returncode == 1, r.stdout + r.stderr
            # the first requests all refused alike: the run stops, the server's word first
            assert r.stdout.splitlines()[0] == (
                "error: the first 8 requests all failed with HTTP 401: refused"
            )
            assert "ABORTED" in r.stdout and "Traceback" not in r.stderr
            meta = json.loads((tmp_path / "f" / "run.json").read_text())
            assert meta["status"] == "aborted" and 8 <= meta["summary"]["failed"] < 18
            r = _run(
                "run",
                str(trace),
                "--target",
                srv.url,
                "-o",
                str(tmp_path / "g"),
                *NO_SCRAPE,
                "--speedup",
                "5",
                "--abort-after-failures",
                "3",
            )
            assert r.returncode == 1, r.stdout + r.stderr
            meta = json.loads((tmp_path / "g" / "run.json").read_text())
            assert meta["status"] == "aborted"
            assert 3 <= meta["summary"]["failed"] < 18
            report = _run("report", str(tmp_path / "g"))
            assert "this run ended with status aborted" in report.stdout + report.stderr
        finally:
            srv.close()


class _RefusingProxy:
    """/v1/models from the real engine, 401 for everything else (a thread server)."""

    def __init__(self, upstream: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.request import urlopen

        models = urlopen(upstream + "/v1/models", timeout=10).read()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200 if self.path == "/v1/models" else 404, models)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(401, b'{"error": {"message": "refused"}}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("api", ["completions", "chat", "messages", "responses"])
def test_server_killed_mid_run(tmp_path: Path, api: str) -> None:
    # 5 s long: the sim dies (at the first part file, about 1 s in) with most of it unsent
    trace = write_rows(tmp_path / "t.parquet", chain_rows(20, 8, gap_ns=150 * MS, output_tokens=6))
    out = tmp_path / "res"
    sim = SimProcess("fast").start()
    try:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(out),
                "--no-progress",
                "--api",
                api,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((out / "requests").glob("part-*.parquet")):
            time.sleep(0.05)
        assert sim.proc is not None
        sim.proc.kill()
        stdout, stderr = run.communicate(timeout=120)
    finally:
        sim.stop()
    assert "Traceback" not in stderr, stderr
    assert run.returncode in (1, 3), stdout + stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed"
    rows = pq.read_table(out / "requests").to_pydict()  # every completed request readable
    assert any(s == "ok" for s in rows["status"])


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    s, port = _busy_port()
    try:
        for args in (
            ["engines", "sim", "--port", str(port)],
            [
                "record",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                f"127.0.0.1:{port}",
                "-o",
                str(tmp_path / "rec"),
            ],
        ):
            r = _run(*args, timeout=60)
            assert r.returncode == 2, r.stderr
            assert "Traceback" not in r.stderr
            lines = [x for x in r.stderr.splitlines() if x.strip()]
            assert len(lines) == 1 and "in use" in lines[0], r.stderr
    finally:
        s.close()


async def test_recorder_force_stop_cuts_the_drain(tmp_path: Path) -> None:
    """A second Ctrl-C (``force_stop``) ends a long drain at once, after flushing what is
    complete."""

    from agent_replay.replay.record import Recorder

    stall = asyncio.Event()

    runner, port = await _stalling_upstream(stall)
    rec = Recorder(
        f"http://127.0.0.1:{port}",
        "127.0.0.1:0",
        tmp_path / "trace",
        drain_timeout_s=60.0,
        flush_interval_s=60,
    )
    await rec.start()

    async with aiohttp.ClientSession() as s:
        async with s.post(rec.url + "/v1/chat/completions", data=_chat_body("done")) as r:
            await r.read()
        stalled = asyncio.create_task(
            s.post(rec.url + "/v1/chat/completions", data=_chat_body("stall"))
        )
        await asyncio.sleep(0.2)
        stopping = asyncio.create_task(rec.stop())
        await asyncio.sleep(0.3)
        assert not stopping.done()  # draining: the stalled stream may still finish
        t0 = time.monotonic()
        rec.force_stop()
        await stopping
        took = time.monotonic() - t0
        resp = await stalled
        with pytest.raises(aiohttp.ClientError):
            await resp.read()
    stall.set()
    await runner.cleanup()
    assert took < 3
    rows = pq.read_table(tmp_path / "trace").to_pylist()
    assert sorted(str(r["error"]) for r in rows) == ["None", "cut by the recorder's stop"]


async def test_recorder_drain_refuses_new_requests_and_is_bounded(tmp_path: Path) -> None:
    """A stalled upstream: the stop returns after --drain-timeout (not aiohttp's 60 s), and
    a request on a kept-alive connection after the signal is refused."""

    from agent_replay.replay.record import Recorder

    stall = asyncio.Event()

    runner, port = await _stalling_upstream(stall)
    rec = Recorder(
        f"http://127.0.0.1:{port}",
        "127.0.0.1:0",
        tmp_path / "trace",
        drain_timeout_s=1.0,
        flush_interval_s=60,
    )
    await rec.start()

    async with aiohttp.ClientSession() as s, aiohttp.ClientSession() as other:
        async with s.post(rec.url + "/v1/chat/completions", data=_chat_body("quick")) as r:
            await r.read()  # the connection stays open (keep-alive)
        stalled = asyncio.create_task(
            other.post(rec.url + "/v1/chat/completions", data=_chat_body("stall"))
        )
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        stopping = asyncio.create_task(rec.stop())
        await asyncio.sleep(0.1)
        async with s.post(rec.url + "/v1/chat/completions", data=_chat_body("late")) as r:
            late = r.status
            await r.read()
        await stopping
        took = time.monotonic() - t0
        resp = await stalled
        with pytest.raises(aiohttp.ClientError):
            await resp.read()
    stall.set()
    await runner.cleanup()
    print(f"drain with a stalled upstream: stop took {took:.2f} s (--drain-timeout 1)")
    assert late == 503
    assert took < 5  # drain 1 s + the cut, not aiohttp's 60 s
    rows = pq.read_table(tmp_path / "trace").to_pylist()
    errors = sorted(str(r["error"]) for r in rows)
    assert len(rows) == 2 and errors == ["None", "cut by the recorder's stop"]


@pytest.mark.slow
def test_kill_9_of_run_leaves_no_worker(tmp_path: Path) -> None:
    """The parent killed outright: its workers and scraper notice and end (they watch it)."""
    trace = write_rows(tmp_path / "t.parquet", chain_rows(40, 4, gap_ns=150 * MS, output_tokens=6))
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(out),
                "--workers",
                "2",
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list((out / "requests").glob("part-*.parquet")):
            time.sleep(0.1)
        children = descendants(run.pid)
        assert len(children) >= 3
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        left = [p for p in children if _alive(p)]
    assert left == []
    pq.read_table(out / "requests")  # what the workers wrote is readable


async def _stalling_upstream(stall: asyncio.Event) -> tuple[Any, int]:
    """A chat upstream on loopback that sends one chunk, then, for the prompt "stall",
    waits for ``stall`` before it ends the stream; its runner and port."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        if body["messages"][0]["content"] == "stall":
            await stall.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _chat_body(text: str) -> bytes:
    return orjson.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
    )
