"""A stream the server resets is noticed by every client, transport and loop within
milliseconds (kind ``stream``), never left to the request timeout (kind ``timeout``).

uvloop's ``add_reader`` is libuv's ``uv_poll``, which stops watching a descriptor that
reports ``POLLERR`` (what a received RST is) without calling the reader: the kernel-stamped
transport has to notice that itself (``engines.kstamp``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from agent_replay.replay.client import Sender
from agent_replay.replay.fastclient import FastSender
from agent_replay.replay.outcome import RequestRecord
from tests.faults.resetserver import ResetServer
from tests.replay.test_client_errors import prep, rec

TIMEOUT_S = 20.0


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop

        loops.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    except ImportError:  # pragma: no cover
        pass
    return loops


async def _streams(url: str, client: str, n: int, concurrency: int) -> list[RequestRecord]:
    session: aiohttp.ClientSession | None = None
    if client == "aiohttp":
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        sender: Any = Sender(session, url)
    else:
        sender = FastSender(url, TIMEOUT_S, kernel_timestamps=client == "fast-kernel")
    records: list[RequestRecord] = []
    todo = iter(range(n))

    async def lane() -> None:
        for _ in todo:
            r = rec(40, 8)
            records.append(r)
            await sender.send(prep(40, 8), r)

    try:
        await asyncio.gather(*(lane() for _ in range(concurrency)))
    finally:
        await sender.close() if hasattr(sender, "close") else None
        if session is not None:
            await session.close()
    return records


def run_resets(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    client: str,
    n: int,
    concurrency: int = 32,
) -> tuple[dict[str, int], list[int]]:
    """``n`` reset streams: the count of each outcome kind, and each stream's time from its
    last event to the end of the request (the server resets ``RESET_AFTER_S`` after that
    event: the rest is the client's detection delay)."""
    with ResetServer() as srv, asyncio.Runner(loop_factory=loop_factory) as runner:
        records = runner.run(_streams(srv.url, client, n, concurrency))
    kinds: dict[str, int] = {}
    for r in records:
        k = r.error_kind or r.status
        kinds[k] = kinds.get(k, 0) + 1
    delays = [(r.end_ns or 0) - r.chunk_ns[-1] for r in records if len(r.chunk_ns)]
    return kinds, delays


CLIENTS = ["fast-kernel", "fast-loop", "aiohttp"]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("loop_factory", _loops())
def test_resets_are_noticed(loop_factory: Any, client: str) -> None:
    t0 = time.monotonic()
    kinds, delays = run_resets(loop_factory, client, 400)
    assert kinds == {"stream": 400}, kinds
    assert time.monotonic() - t0 < TIMEOUT_S  # no request waited for its timeout
    assert len(delays) == 400 and max(delays) < 2 * 10**9  # ms here; seconds on a loaded host


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("loop_factory", _loops()[-1:])
def test_ten_thousand_resets(loop_factory: Any, client: str) -> None:
    """At scale on the loop runs use (uvloop where installed, the one whose ``uv_poll``
    drops a reset descriptor); both loops are covered by the 400-stream test above."""
    kinds, delays = run_resets(loop_factory, client, 10_000, concurrency=64)
    assert kinds == {"stream": 10_000}, kinds
    assert len(delays) == 10_000 and max(delays) < int(TIMEOUT_S * 1e9)
