"""One big request does not stall everyone: while a 30 MB body goes through the proxy,
the other streams' chunks keep their 5 ms rhythm (no gap of 100 ms), also when its row
is written; a body over ``--max-body`` gets 413.

The proxy keeps the body in the pieces it arrived in and parses it in a helper process
(``replay.record.bigbody``); what it takes back is the body's digest, not the body. The
client here posts its big bodies in slices, as a bytes body would be copied whole on this
test's own event loop and stall the streams it measures."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest

from tests.faults.bombs import stream

ROOT = Path(__file__).resolve().parents[2]


async def _slices(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1 << 18):
        yield data[i : i + (1 << 18)]


async def _post_big(s: aiohttp.ClientSession, url: str, data: bytes) -> aiohttp.ClientResponse:
    """POST ``data`` in slices: a bytes or BytesIO body would make aiohttp copy it whole
    on this test's event loop, stalling the streams it measures."""
    return await s.post(
        url + "/v1/chat/completions", data=_slices(data), headers={"Content-Length": str(len(data))}
    )


async def _proc(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return proc, ""


@pytest.mark.slow
@pytest.mark.timing
async def test_big_body_leaves_other_streams_alone(tmp_path: Path) -> None:
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.faults.streamserver", cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert up.stdout is not None
    up_url = (await asyncio.wait_for(up.stdout.readline(), 30)).decode().strip()
    rec = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "record",
        "--upstream",
        up_url,
        "--listen",
        "127.0.0.1:0",
        "-o",
        str(tmp_path / "trace"),
        "--quiet",
        "--max-body",
        "40",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    assert rec.stderr is not None
    url = (await asyncio.wait_for(rec.stderr.readline(), 30)).decode().split()[2]
    try:
        big = orjson.dumps(
            {
                "model": "m",
                "stream": True,
                "messages": [{"role": "user", "content": "x " * 500_000} for _ in range(30)],
            }
        )
        assert len(big) > 30_000_000
        huge = b'{"model": "m", "pad": "' + b"y" * (41 << 20) + b'"}'
        quiet: list[float] = []
        gaps: list[float] = []
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(stream(s, url, quiet, time.monotonic() + 1.5) for _ in range(4)))
            until = time.monotonic() + 6
            streams = [asyncio.create_task(stream(s, url, gaps, until)) for _ in range(4)]
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            async with await _post_big(s, url, big) as r:
                assert r.status == 200
                await r.read()
            big_s = time.monotonic() - t0
            async with await _post_big(s, url, huge) as r:
                assert r.status == 413
            await asyncio.gather(*streams)
        print(
            f"30 MB body through the proxy in {big_s:.1f} s: other streams' largest chunk "
            f"gap {max(gaps) * 1e3:.0f} ms (quiet: {max(quiet) * 1e3:.0f} ms)"
        )
        assert len(gaps) > 1000
        # Parsing the body on the proxy's loop stalled the other streams for 88-215 ms, and
        # so did converting its 117,000 hash ids to Arrow under the GIL at the next flush
        # (83-202 ms). Without either: 18-40 ms, with or without a core held busy by other
        # work (benchmarks/journal/2026-12-02-suite-streak.md), hence 100 ms.
        assert max(gaps) < 0.100, (max(gaps), max(quiet), big_s)
    finally:
        rec.send_signal(signal.SIGTERM)
        await asyncio.wait_for(rec.wait(), 60)
        up.kill()
        await up.wait()
    # the big request is recorded like a small one: its own session, every block hashed
    from agent_replay.traces.io import read_trace

    table, meta = read_trace(tmp_path / "trace")
    rows = [r for r in table.to_pylist() if r["input_tokens"] > 1_000_000]
    assert len(rows) == 1 and rows[0]["error"] is None
    assert len(rows[0]["hash_ids"]) == -(-rows[0]["input_tokens"] // meta.block_size)


@pytest.mark.parametrize("content", ["hashed", "full", "none"])
async def test_big_body_digest_matches_the_small_path(content: str) -> None:
    """What the helper sends back is what the recorder computes from a small body: the
    bytes sent upstream, the block hashes for any reported prompt length, the session
    digests and parent, the stored content and the secrets."""
    from agent_replay.redact import secret_values, strip_secrets
    from agent_replay.replay.record.bigbody import BigBodies, DigestSpec
    from agent_replay.replay.record.content import PromptHasher, conversation
    from agent_replay.replay.record.sessions import SessionTracker, chain_digests
    from agent_replay.replay.record.sink import rows_to_table
    from agent_replay.replay.record.wire import inspect_request

    msgs = [
        {"role": "user", "content": "a " * 300_000},
        {"role": "assistant", "content": "sure", "tool_calls": None},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "b " * 400_000, "cache_control": {"type": "ephemeral"}}
            ],
        },
    ]
    bodies = [
        {"model": "m", "stream": True, "messages": msgs, "api_key": "sk-planted"},
        {"model": "m", "stream": True, "stream_options": {"x": 1}, "messages": msgs},
        {"model": "m", "messages": msgs, "user": "u1"},
    ]
    hasher, twin = PromptHasher(16, seed=5), PromptHasher(16, seed=5)  # fed alike
    big = BigBodies(DigestSpec(16, 5, None, content))
    try:
        for body in bodies:
            raw = b"  " + orjson.dumps(body)
            parts = [raw[i : i + 70_001] for i in range(0, len(raw), 70_001)]
            got = await big.digest("chat", parts)
            assert got is not None
            info, send, digest = got
            want_info, want_out = inspect_request("chat", raw)  # type: ignore[misc]
            assert b"".join(send) == want_out
            assert info.body == {}
            assert (info.model, info.stream, info.injected_usage, info.session_hint) == (
                want_info.model,
                want_info.stream,
                want_info.injected_usage,
                want_info.session_hint,
            )
            est = hasher.hash_ids("chat", body, None)[1]
            for n in (None, 1, 17, est, est + 100):
                ids, e = digest.hash_ids(twin, n)
                assert e == est
                if content != "none" or n is None:
                    want = hasher.hash_ids("chat", body, n)[0]
                    got_ids = np.asarray(ids).tolist()
                    assert got_ids == want if content != "none" else len(ids) == len(want)
                    # a part file holds the same column from the array as from the list
                    row = {"session_id": "s", "request_index": 0, "parent_index": -1}
                    rows = [row, row | {"hash_ids": [7, 8]}, row | {"hash_ids": []}]
                    assert rows_to_table([*rows, row | {"hash_ids": ids}]).equals(
                        rows_to_table([*rows, row | {"hash_ids": got_ids}])
                    )
            items = conversation("chat", body)
            assert digest.chains == chain_digests(items)
            assert digest.content == (
                orjson.dumps(strip_secrets(body)) if content == "full" else None
            )
            assert digest.secrets == secret_values(body)
            # session inference: the same parent from the digest as from the body
            full, light = SessionTracker(), SessionTracker()
            for tracker, its, chains in ((full, items, None), (light, digest.items, digest.chains)):
                first = conversation("chat", {"messages": msgs[:1]})
                _, turn = tracker.assign(0, first)
                tracker.complete(turn, 10, None, failed=False)
                a, _ = tracker.assign(20, its, chains=chains)
                assert (a.session_id, a.parent_index, a.how) == ("auto-00001", 0, "prefix")
        assert await big.digest("chat", [b"[1, 2]", b" " * (2 << 20)]) == "not_object"
    finally:
        await big.close()


def test_helper_ends_when_the_recorder_died_before_it_started() -> None:
    """The parse helper watches the recorder's pid, not whichever parent it finds: a
    recorder killed while the helper was still starting (it was reparented already) must
    not leave it waiting for work forever, holding the recorder's stderr open."""
    code = (
        "import sys, time\n"
        "from agent_replay.replay.record.bigbody import _background\n"
        "_background(int(sys.argv[1]))\n"
        "time.sleep(30)\n"
        "sys.exit(3)\n"
    )
    gone = 2**22 + 1  # above pid_max's default: never this process's parent
    proc = subprocess.run([sys.executable, "-c", code, str(gone)], timeout=20)
    assert proc.returncode == 0
