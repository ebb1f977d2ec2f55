"""The floor of a Python streaming client: what reading each chunk as it arrives costs with
nothing else done.

It sends the benchmark's workload (N completions requests of 128 prompt / 256 output tokens,
C at a time, each lane on its own keep-alive connection, the next request as soon as the
last one ended) and, per read, does only what any client that times every chunk must do:

* ``--stamps kernel``: one ``recvmsg`` with the kernel's receive time (``SO_TIMESTAMPNS``),
  its conversion to the monotonic clock and one append, from a reader callback of the event
  loop (uvloop), as ``engines.kstamp.StampedTransport`` reads;
* ``--stamps loop``: an ``asyncio.Protocol`` whose ``data_received`` reads the clock and
  appends, as a client timed by its event loop does.

No HTTP parsing, no SSE split, no token count, no JSON: a response ends when a read ends
with the last chunk of the chunked coding. Its CPU per chunk, measured by the same harness
as the real clients, is a lower bound for any client built this way on this host and
kernel: the system call, its ACK, the loop's dispatch and one Python callback.

    python benchmarks/peers/floor.py URL --concurrency 64 --requests 640 --stamps kernel
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from array import array
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_replay.engines.dialects import build_request, encode_body  # noqa: E402
from agent_replay.engines.kstamp import READ_SIZE, SO_TIMESTAMPNS, realtime_offset_ns  # noqa: E402
from benchmarks.peers.harness import MODEL  # noqa: E402

_END = b"0\r\n\r\n"
_TS_SPACE = socket.CMSG_SPACE(16)


def request_bytes(host: str, i: int, prompt: int, output: int) -> bytes:
    ids = [(i * 7919 + k) % 4000 + 10 for k in range(prompt)]
    body = encode_body(build_request("completions", model=MODEL, prompt=ids, max_tokens=output))
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body)
    )


class Lane:
    """One connection carrying one request after another."""

    def __init__(self, run: Run, sock: socket.socket | None) -> None:
        self.run = run
        self.sock = sock
        self.stamps = array("q")
        self.fresh = True
        """The next read starts a response."""
        self.transport: asyncio.Transport | None = None

    def send_next(self) -> None:
        data = self.run.next_request()
        if data is None:
            self.run.lane_done()
            return
        if self.sock is not None:
            self.sock.send(data)
        else:
            assert self.transport is not None
            self.transport.write(data)

    def chunk(self, data: bytes, t: int) -> None:
        if not self.stamps or self.fresh:
            self.fresh = False
            if not data.startswith(b"HTTP/1.1 200 "):
                self.run.fail(data[:300])
                return
        self.stamps.append(t)
        if data.endswith(_END):
            self.fresh = True
            self.send_next()

    # the kernel-stamped read, as a reader callback
    def on_readable(self) -> None:
        assert self.sock is not None
        try:
            data, anc, _f, _a = self.sock.recvmsg(READ_SIZE, _TS_SPACE)
        except BlockingIOError:
            return
        if not data:
            self.run.loop.remove_reader(self.sock.fileno())
            return
        t = time.monotonic_ns()
        if anc:
            sec, nsec = (
                int.from_bytes(anc[0][2][:8], "little"),
                int.from_bytes(anc[0][2][8:16], "little"),
            )
            t = min(t, sec * 1_000_000_000 + nsec - self.run.offset)
        self.chunk(data, t)


class LoopLane(asyncio.Protocol):
    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.lane.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.lane.chunk(data, time.monotonic_ns())


class Run:
    def __init__(self, url: str, requests: int, prompt: int, output: int) -> None:
        u = urlsplit(url)
        assert u.hostname and u.port
        self.host, self.port = u.hostname, u.port
        self.requests = [
            request_bytes(f"{u.hostname}:{u.port}", i, prompt, output) for i in range(requests)
        ]
        self.sent = 0
        self.live = 0
        self.done = asyncio.get_running_loop().create_future()
        self.loop = asyncio.get_running_loop()
        self.offset = realtime_offset_ns()

    def next_request(self) -> bytes | None:
        if self.sent == len(self.requests):
            return None
        self.sent += 1
        return self.requests[self.sent - 1]

    def fail(self, head: bytes) -> None:
        if not self.done.done():
            self.done.set_exception(SystemExit(f"floor: the server answered {head!r}"))

    def lane_done(self) -> None:
        self.live -= 1
        if self.live == 0 and not self.done.done():
            self.done.set_result(None)


async def main(args: argparse.Namespace) -> dict[str, int]:
    run = Run(args.url, args.requests, args.prompt, args.output)
    loop = run.loop
    lanes = []
    for _ in range(args.concurrency):
        if args.stamps == "kernel":
            sock = socket.create_connection((run.host, run.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.setblocking(False)
            lane = Lane(run, sock)
            loop.add_reader(sock.fileno(), lane.on_readable)
        else:
            lane = Lane(run, None)
            await loop.create_connection(lambda lane=lane: LoopLane(lane), run.host, run.port)
        lanes.append(lane)
    run.live = len(lanes)
    try:
        for lane in lanes:
            lane.send_next()
        await run.done
    finally:
        for lane in lanes:
            if lane.sock is not None:
                loop.remove_reader(lane.sock.fileno())
                lane.sock.close()
            elif lane.transport is not None:
                lane.transport.close()
    return {"requests": run.sent, "reads": sum(len(lane.stamps) for lane in lanes)}


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--stamps", choices=("kernel", "loop"), default="kernel")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        import uvloop

        got = uvloop.run(main(args))
    except ImportError:
        got = asyncio.run(main(args))
    if args.out:
        args.out.write_text(json.dumps(got))
    print(json.dumps(got))


if __name__ == "__main__":
    cli()
