"""The streaming client against a loopback vLLM-dialect server: error classification, headers,
tokens per chunk; and the CLI's bad-input paths (nothing sent, nothing overwritten)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from agent_replay.engines.dialects import build_request, encode_body
from agent_replay.replay.cli import main
from agent_replay.replay.client import Prepared, Sender, make_session
from agent_replay.replay.outcome import RequestRecord
from tests.replay.fakeserver import FakeVllm, start
from tests.replay.helpers import chain_rows, write_rows


def rec(n_in: int = 40, n_out: int = 9) -> RequestRecord:
    return RequestRecord(
        session_id="s",
        request_index=0,
        parent_index=-1,
        clone=0,
        worker=0,
        request_id="rid-1",
        api="completions",
        expected_input_tokens=n_in,
        expected_output_tokens=n_out,
        implied_cached_tokens=0,
    )


def prep(n_in: int = 40, n_out: int = 9, api: str = "completions") -> Prepared:
    prompt = np.arange(1000, 1000 + n_in) if api == "completions" else "a b c"
    body = build_request(api, model="fake-model", prompt=prompt, max_tokens=n_out)
    path = {
        "completions": "/v1/completions",
        "chat": "/v1/chat/completions",
        "messages": "/v1/messages",
    }[api]
    return Prepared(
        path,
        encode_body(body),
        {"Content-Type": "application/json", "X-Session-ID": "s", "X-Request-Id": "rid-1"},
        api,
    )


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeVllm, str]]:
    fake = FakeVllm()
    runner, url = await start(fake)
    yield fake, url
    await runner.cleanup()


async def send(url: str, p: Prepared, r: RequestRecord, timeout_s: float = 10.0) -> RequestRecord:
    session = make_session(timeout_s)
    try:
        await Sender(session, url).send(p, r)
    finally:
        await session.close()
    return r


async def test_ok_stream_with_multi_token_chunks(server) -> None:
    fake, url = server
    fake.tokens_per_chunk = 4
    r = await send(url, prep(40, 9), rec(40, 9))
    assert r.status == "ok" and r.error_kind is None, r.error
    assert list(r.chunk_tokens) == [4, 4, 1]
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (40, 9, 0)
    assert r.sent_ns <= r.headers_ns <= r.first_token_ns == r.chunk_ns[0] <= r.end_ns
    seen = fake.seen[0]
    assert seen.headers["x-session-id"] == "s" and seen.headers["x-request-id"] == "rid-1"
    assert seen.body["ignore_eos"] is True and seen.body["min_tokens"] == 9


@pytest.mark.parametrize("tpc", [1, 3])
async def test_reads_that_end_inside_events(server, tpc: int) -> None:
    fake, url = server
    fake.split_writes = True
    fake.tokens_per_chunk = tpc
    r = await send(url, prep(40, 12), rec(40, 12))
    assert r.status == "ok" and r.error_kind is None, r.error
    assert sum(r.chunk_tokens) == 12 and len(r.chunk_tokens) == -(-12 // tpc)


async def test_usage_differencing_when_token_ids_are_not_returned(server) -> None:
    fake, url = server
    fake.token_ids = False
    fake.tokens_per_chunk = 3
    r = await send(url, prep(40, 7), rec(40, 7))
    assert r.status == "ok" and list(r.chunk_tokens) == [3, 3, 1]


async def test_mismatch_is_recorded_not_failed(server) -> None:
    _, url = server
    r = await send(url, prep(40, 9), rec(41, 10))
    assert r.status == "ok" and r.error_kind == "mismatch"
    assert "9 output tokens, trace has 10" in (r.error or "")
    assert "40 prompt tokens, trace has 41" in (r.error or "")


async def test_http_error(server) -> None:
    fake, url = server
    fake.fail_status = 500
    r = await send(url, prep(), rec())
    assert (r.status, r.error_kind, r.http_status) == ("error", "http", 500)
    assert "nope" in (r.error or "")


async def test_truncated_stream(server) -> None:
    fake, url = server
    fake.truncate = True
    r = await send(url, prep(40, 10), rec(40, 10))
    assert (r.status, r.error_kind) == ("error", "stream")


async def test_timeout(server) -> None:
    fake, url = server
    fake.ttft_s = 2.0
    r = await send(url, prep(), rec(), timeout_s=0.3)
    assert (r.status, r.error_kind) == ("error", "timeout")


async def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nobody listens
    r = await send(f"http://127.0.0.1:{port}", prep(), rec())
    assert (r.status, r.error_kind) == ("error", "connect")


async def test_cancel_records_request(server) -> None:
    fake, url = server
    fake.step_s = 0.05
    session = make_session(10)
    r = rec(40, 50)
    task = asyncio.ensure_future(Sender(session, url).send(prep(40, 50), r))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await session.close()
    assert (r.status, r.error_kind) == ("error", "cancelled")
    assert 0 < len(r.chunk_tokens) < 50


# -- CLI bad input -----------------------------------------------------------------------


def test_invalid_trace_is_rejected_before_sending(tmp_path: Path, capsys) -> None:
    rows = chain_rows(1, 2)
    rows[1]["output_tokens"] = -5
    trace = write_rows(tmp_path / "bad.parquet", rows)
    # an address nobody listens on: if anything were sent we would get exit 3, not 2
    code = main(["run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "output_tokens" in err and "bad.parquet" in err
    assert not (tmp_path / "r").exists()


def test_unreachable_target_fails_fast(tmp_path: Path, capsys) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(1, 1))
    code = main(["run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1 and "cannot reach http://127.0.0.1:9" in err[0]


def test_existing_results_are_not_overwritten(tmp_path: Path, capsys) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(1, 1))
    out = tmp_path / "r"
    out.mkdir()
    (out / "run.json").write_text("{}")
    code = main(["run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(out)])
    assert code in (2, 3)  # the target is probed first: either way nothing was touched
    assert (out / "run.json").read_text() == "{}"


@pytest.mark.slow
def test_run_cli_end_to_end_and_force(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(3, 2, output_tokens=4))
    out = tmp_path / "r"
    script = (
        "import asyncio, subprocess, sys\n"
        "from tests.replay.fakeserver import FakeVllm, start\n"
        "async def go():\n"
        "    runner, url = await start(FakeVllm())\n"
        f"    args = ['-m', 'agent_replay', 'run', {str(trace)!r}, '--target', url, '-o', {str(out)!r}, '--no-progress', '--speedup', '5']\n"
        "    codes = []\n"
        "    for extra in ([], [], ['--force']):\n"
        "        p = await asyncio.create_subprocess_exec(sys.executable, *args, *extra, stdout=-1, stderr=-1)\n"
        "        o, e = await p.communicate()\n"
        "        codes.append(p.returncode)\n"
        "        print(o.decode(), e.decode())\n"
        "    print('CODES', codes)\n"
        "    await runner.cleanup()\n"
        "asyncio.run(go())\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "CODES [0, 2, 0]" in res.stdout, res.stdout + res.stderr
    assert "already exists (use --force to overwrite)" in res.stdout
    assert "6 ok, 0 failed" in res.stdout
