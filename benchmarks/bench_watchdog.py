"""CPU of one check of the kernel-stamped transports' watchdog (``engines.kstamp.Watchdog``)
with 256 loopback TCP connections on uvloop, half of them with a byte waiting (as under
load): when every stream was read since the check before (streaming), and when none was
(idle connections).

    PYTHONPATH=$PWD python benchmarks/bench_watchdog.py
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from agent_replay.engines import aio
from agent_replay.engines.kstamp import StampedTransport, Watchdog

STREAMS = 256
CHECKS = 2000


class _Quiet:
    def connection_made(self, transport: Any) -> None:
        pass

    def received(self, data: bytes, t: int) -> None:
        pass

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass


async def main() -> None:
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(STREAMS * 2)
    pairs = []
    for i in range(STREAMS):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        pairs.append((server, client))
        if i % 2:
            server.send(b"x")
    transports = []
    for _server, client in pairs:
        client.setblocking(False)
        transports.append(StampedTransport(loop, client, _Quiet()))
    wd = Watchdog.of(loop)
    if not wd.active:
        raise SystemExit("the watchdog runs on uvloop only: install uvloop")
    for label, busy in (
        ("every stream read since the last check", True),
        ("no stream read (idle)", False),
    ):
        spent = 0.0
        for _ in range(CHECKS):
            if busy:
                for t in transports:
                    t.reads += 1
            if wd._timer is not None:
                wd._timer.cancel()
                wd._timer = None
            t0 = time.process_time()
            wd._check()
            spent += time.process_time() - t0
        print(f"{label}: {spent / CHECKS * 1e6:.1f} us per check ({STREAMS} connections)")
    for t in transports:
        t.abort()
    await asyncio.sleep(0)
    for server, _client in pairs:
        server.close()
    listener.close()


if __name__ == "__main__":
    aio.run(main(), "uvloop")
