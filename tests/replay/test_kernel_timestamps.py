"""``--timestamps kernel``: a chunk's time is when its packet reached the kernel, not when the
(busy) event loop got round to reading it.

A server thread writes a stream event by event, stamping ``monotonic_ns`` right before and
right after each write. While one event is in flight the client's event loop is blocked for
80 ms (``time.sleep``): with loop timestamps that event is stamped after the block, with
kernel timestamps between the server's two stamps around its write (on loopback the kernel
receives the bytes inside the sender's ``send``)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import pytest

from agent_replay.engines.kstamp import realtime_offset_ns
from agent_replay.replay.fastclient import FastSender
from agent_replay.replay.outcome import RequestRecord
from tests.replay.rawserver import LAST_CHUNK, SSE_HEAD, RawServer, chunk, chunked_response, events
from tests.replay.test_client_errors import prep, rec

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS receive timestamps are Linux's"
)

MS = 1_000_000
BLOCK_S = 0.2  # long enough that a loaded machine still writes inside it


class ThreadServer:
    """One connection, one request: answers with 3 events; the second is written while the
    client's loop is blocked (``blocked`` is set by the client just before it blocks)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.blocked = threading.Event()
        self.writes: list[tuple[int, int]] = []  # (before, after) each event's send
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(SSE_HEAD)
            for i, ev in enumerate(events(3, n_in=40) + [b"data: [DONE]\n\n"]):
                if i == 1:
                    self.blocked.wait(10)
                    time.sleep(0.01)  # well inside the client's block
                t0 = time.monotonic_ns()
                conn.sendall(chunk(ev))
                self.writes.append((t0, time.monotonic_ns()))
                if i == 1:
                    time.sleep(BLOCK_S + 0.05)  # the next event after the block has ended
            conn.sendall(LAST_CHUNK)

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


@pytest.mark.timing
@pytest.mark.parametrize("kernel", [True, False])
async def test_a_chunk_read_late_keeps_its_arrival_time(kernel: bool) -> None:
    srv = ThreadServer()
    sender = FastSender(f"http://127.0.0.1:{srv.port}", 10, kernel_timestamps=kernel)
    r = rec(40, 3)
    task = asyncio.create_task(sender.send(prep(40, 3), r))
    for _ in range(2000):  # until the first event has been read
        if len(r.chunk_ns):
            break
        await asyncio.sleep(0.005)
    srv.blocked.set()
    time.sleep(BLOCK_S)  # the loop is blocked: nothing is read until this returns
    unblocked = time.monotonic_ns()
    await task
    await sender.close()
    srv.close()
    assert (r.status, r.error_kind, list(r.chunk_tokens)) == ("ok", None, [1, 1, 1])
    before, after = srv.writes[1]
    assert before < unblocked - 40 * MS  # written well before the loop could read it
    t = r.chunk_ns[1]
    if kernel:
        assert before - MS <= t <= after + MS, (t - before, after - before)
    else:
        assert t >= unblocked
    assert list(r.chunk_ns) == sorted(r.chunk_ns)
    assert r.end_ns is not None and r.end_ns >= r.chunk_ns[-1]


@pytest.mark.timing
def test_the_realtime_offset_matches_the_clocks() -> None:
    off = realtime_offset_ns()
    drift = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns() - off
    assert abs(drift) < 20 * MS  # a preemption between the two reads adds to it


# -- the kernel-stamped transport carries the fast client's other cases too -----------------


async def _kernel_send(
    url: str, n_out: int = 5, timeout_s: float = 10.0
) -> tuple[RequestRecord, FastSender]:
    sender = FastSender(url, timeout_s, kernel_timestamps=True)
    r = rec(40, n_out)
    try:
        await sender.send(prep(40, n_out), r)
    finally:
        await sender.close()
    return r, sender


async def test_kernel_transport_keep_alive_close_stall_and_refused(raw: list[RawServer]) -> None:
    full = chunked_response(events(5))
    ok = RawServer(lambda i, got: [full])
    raw.append(ok)
    url = await ok.start()
    sender = FastSender(url, 10, kernel_timestamps=True)
    rs = [rec(40, 5) for _ in range(3)]
    for r in rs:
        await sender.send(prep(40, 5), r)
    await sender.close()
    assert [(r.status, list(r.chunk_tokens)) for r in rs] == [("ok", [1] * 5)] * 3
    assert ok.connections == 1 and sender.pool.opened == 1  # kept alive and reused

    cut = RawServer(lambda i, got: [full[: len(full) // 2], "close"])
    raw.append(cut)
    r, _ = await _kernel_send(await cut.start())
    assert (r.status, r.error_kind) == ("error", "stream"), r.error

    stall = RawServer(lambda i, got: [full[:200], "hold"])
    raw.append(stall)
    r, _ = await _kernel_send(await stall.start(), timeout_s=0.3)
    assert (r.status, r.error_kind) == ("error", "timeout")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r, _ = await _kernel_send(f"http://127.0.0.1:{port}")
    assert (r.status, r.error_kind) == ("error", "connect")


def test_kernel_timestamps_need_the_fast_client() -> None:
    from agent_replay.errors import InputError
    from agent_replay.replay.config import RunConfig

    with pytest.raises(InputError, match="--timestamps kernel needs the fast client"):
        RunConfig(
            trace="t",
            target="http://127.0.0.1:1",
            output="o",
            timestamps="kernel",
            http_client="aiohttp",
        ).check()
    with pytest.raises(InputError, match="--timestamps must be one of"):
        RunConfig(trace="t", target="http://127.0.0.1:1", output="o", timestamps="nic").check()
    RunConfig(trace="t", target="http://127.0.0.1:1", output="o", timestamps="kernel").check()
    # auto: kernel stamps with the fast client, loop stamps where they cannot be had
    auto = RunConfig(trace="t", target="http://127.0.0.1:1", output="o")
    assert auto.timestamps == "auto" and auto.effective_timestamps() == "kernel"
    assert (
        RunConfig(
            trace="t", target="http://127.0.0.1:1", output="o", http_client="aiohttp"
        ).effective_timestamps()
        == "loop"
    )
    assert (
        RunConfig(trace="t", target="https://example.com", output="o").effective_timestamps()
        == "loop"
    )


class Collect:
    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.lost = False

    def connection_made(self, transport: object) -> None:
        pass

    def received(self, data: bytes, t: int) -> None:
        self.reads.append(data)

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def test_watchdog_reads_a_descriptor_whose_reader_was_lost() -> None:
    """On uvloop a reader whose registration was lost is re-registered and read; a paused
    one is left alone, and a closed one leaves the watchdog's poll set."""
    uvloop = pytest.importorskip("uvloop")
    from agent_replay.engines.kstamp import WATCHDOG_S, StampedTransport, Watchdog

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pairs = [socket.socketpair() for _ in range(2)]
        protos = [Collect(), Collect()]
        trs = []
        for (_a, b), p in zip(pairs, protos, strict=True):
            b.setblocking(False)
            trs.append(StampedTransport(loop, b, p))
        wd = Watchdog.of(loop)
        assert wd.active and set(wd.transports) == {b.fileno() for _a, b in pairs}
        loop.remove_reader(pairs[0][1].fileno())  # the lost registration
        trs[1].pause_reading()
        for a, _b in pairs:
            a.send(b"x")
        await asyncio.sleep(WATCHDOG_S * 10)
        assert protos[0].reads == [b"x"] and wd.rearmed == 1
        assert protos[1].reads == []  # paused: not the watchdog's to read
        trs[1].resume_reading()
        await asyncio.sleep(WATCHDOG_S * 2)
        assert protos[1].reads == [b"x"] and wd.rearmed == 1
        for t in trs:
            t.abort()
        await asyncio.sleep(0)
        assert all(p.lost for p in protos) and not wd.transports
        assert not wd._reads and not wd._suspect  # nothing left watched
        for a, _b in pairs:
            a.close()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
