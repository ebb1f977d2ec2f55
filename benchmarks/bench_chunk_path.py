"""The fast client's per-chunk path on a fixed workload, in one process, without a server.

One real response of the simulated engine (completions, 128 prompt / 256 output tokens, with
token ids and continuous usage, as the benchmark's runs ask for it) is captured once, cut
into the reads an SSE server produces at one event per write (the head, then one chunked
frame per read), and fed R times through the client's per-read path:

* ``--mode protocol``: ``H1Connection.received`` with a read time (the chunked split, the
  SSE split, the token count, the record's appends), then ``EventStream.finish``;
* ``--mode socket``: the same reads written into a socketpair and taken by the kernel-stamped
  transport (``StampedTransport._on_readable``: ``recvmsg``, the stamp), so the system calls
  of both ends are in it;
* ``--mode loop``: ``--streams`` connections on a running event loop (uvloop when installed),
  each a socketpair with its stamped transport; every read of the response is written to
  ``--ready`` streams at a time and the loop runs until it has served them, so each loop
  wake-up finds that many sockets ready: the loop's dispatch (epoll, the reader callbacks)
  is in it.

It prints ns per chunk (wall clock: noisy on a shared host) and, with ``--callgrind``,
instructions per chunk: the difference in instructions between R=``--small`` and
R=``--requests`` runs under ``valgrind --tool=callgrind``, divided by the difference in
chunks, so start-up and the capture cancel out. Instruction counts do not move with the
load of other processes, so they compare two versions of the code on a busy machine.

    PYTHONPATH=$PWD python benchmarks/bench_chunk_path.py --requests 400
    PYTHONPATH=$PWD python benchmarks/bench_chunk_path.py --callgrind --mode protocol
    PYTHONPATH=$PWD python benchmarks/bench_chunk_path.py --mode loop --streams 256 --ready 16 \
        --requests 2 --repeat 3
    PYTHONPATH=$PWD python benchmarks/bench_chunk_path.py --profile   # cProfile, top functions
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT, OUTPUT = 128, 256


async def _capture() -> bytes:
    from agent_replay.engines.apis.base import encode_body
    from agent_replay.engines.dialects import build_request
    from agent_replay.engines.sim.server import SimServer

    body = encode_body(
        build_request(
            "completions",
            model="sim-fast",
            prompt=list(range(1000, 1000 + PROMPT)),
            max_tokens=OUTPUT,
        )
    )
    async with SimServer("fast") as sim:
        host, port = sim.url.split("//", 1)[1].split("/")[0].rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port))
        w.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        raw = await r.read()
        w.close()
    return raw


def capture_reads() -> list[bytes]:
    """The head (with ``Connection: close`` turned to keep-alive), then one chunked frame per read."""
    raw = asyncio.run(_capture())
    i = raw.index(b"\r\n\r\n") + 4
    head = raw[:i].replace(b"connection: close\r\n", b"").replace(b"Connection: close\r\n", b"")
    reads = [head]
    pos = i
    while pos < len(raw):
        j = raw.index(b"\r\n", pos)
        end = j + 2 + int(raw[pos:j], 16) + 2
        if end == j + 4:  # last chunk: "0\r\n\r\n"
            end = j + 4
        reads.append(raw[pos:end])
        pos = end
    if not reads[1].startswith(b"0\r\n") and b'"token_ids":[' not in raw:
        raise SystemExit("the captured stream has no token ids")
    return reads


class _NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def run(
    reads: list[bytes], requests: int, mode: str, streams: int = 1, ready: int = 1
) -> tuple[int, float]:
    """Feed the reads ``requests`` times; (chunks recorded, seconds in the loop)."""
    if mode == "loop":
        return run_loop(reads, requests, streams, ready)
    from agent_replay.engines import kstamp
    from agent_replay.replay.client import EventStream
    from agent_replay.replay.fastclient import H1Connection
    from agent_replay.replay.outcome import RequestRecord

    loop = asyncio.new_event_loop()
    conn = H1Connection()
    a = b = tr = None
    if mode == "socket":
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        tr = kstamp.StampedTransport(loop, b, conn)
        send = a.send
        on_readable = tr._on_readable
    else:
        conn.connection_made(_NullTransport())
    received = conn.received
    chunks = 0
    t = 0
    start = time.perf_counter()
    for i in range(requests):
        rec = RequestRecord(
            session_id="s",
            request_index=i,
            parent_index=-1,
            clone=0,
            worker=0,
            request_id=f"r{i}",
            api="completions",
            expected_input_tokens=PROMPT,
            expected_output_tokens=OUTPUT,
            implied_cached_tokens=0,
        )
        stream = EventStream(rec, "completions")
        waiter: asyncio.Future[int] = loop.create_future()
        conn.begin(rec, stream, waiter)
        if mode == "socket":
            for data in reads:
                send(data)
                on_readable()
        else:
            for data in reads:
                t += 5_000_000
                received(data, t)
        if not waiter.done():
            raise SystemExit("the response did not end")
        stream.finish(waiter.result())
        if rec.status != "ok" or rec.error_kind is not None or sum(rec.chunk_tokens) != OUTPUT:
            raise SystemExit(
                f"wrong record: {rec.status} {rec.error_kind} {rec.error} "
                f"{sum(rec.chunk_tokens)} tokens"
            )
        chunks += len(rec.chunk_ns)
    elapsed = time.perf_counter() - start
    if tr is not None:
        tr.abort()
        loop.run_until_complete(asyncio.sleep(0))
    if a is not None:
        a.close()
    loop.close()
    return chunks, elapsed


def run_loop(reads: list[bytes], requests: int, streams: int, ready: int) -> tuple[int, float]:
    """``--mode loop``: (chunks recorded, CPU seconds of this process in the loop)."""
    from agent_replay.engines import aio, kstamp
    from agent_replay.replay.client import EventStream
    from agent_replay.replay.fastclient import H1Connection
    from agent_replay.replay.outcome import RequestRecord

    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        pairs = [socket.socketpair() for _ in range(streams)]
        conns = [H1Connection() for _ in range(streams)]
        transports = []
        for (a, b), conn in zip(pairs, conns, strict=True):
            a.setblocking(False)
            b.setblocking(False)
            transports.append(kstamp.StampedTransport(loop, b, conn))
        sends = [a.send for a, _b in pairs]
        chunks = 0
        start = time.process_time()
        for i in range(requests):
            recs, waiters = [], []
            for j, conn in enumerate(conns):
                rec = RequestRecord(
                    session_id="s",
                    request_index=i,
                    parent_index=-1,
                    clone=0,
                    worker=0,
                    request_id=f"r{i}-{j}",
                    api="completions",
                    expected_input_tokens=PROMPT,
                    expected_output_tokens=OUTPUT,
                    implied_cached_tokens=0,
                )
                waiter: asyncio.Future[int] = loop.create_future()
                conn.begin(rec, EventStream(rec, "completions"), waiter)
                recs.append(rec)
                waiters.append(waiter)
            for data in reads:
                for g in range(0, streams, ready):
                    group = conns[g : g + ready]
                    marks = [c.last_t for c in group]
                    for send in sends[g : g + ready]:
                        send(data)
                    while any(c.last_t == m for c, m in zip(group, marks, strict=True)):
                        await asyncio.sleep(0)
            for rec, waiter in zip(recs, waiters, strict=True):
                if not waiter.done() or len(rec.chunk_ns) != OUTPUT:
                    raise SystemExit("a response did not end with every chunk")
                chunks += len(rec.chunk_ns)
        elapsed = time.process_time() - start
        for t in transports:
            t.abort()
        await asyncio.sleep(0)
        for a, _b in pairs:
            a.close()
        return chunks, elapsed

    return aio.run(main(), "uvloop")


def callgrind(
    reads_file: str, small: int, large: int, mode: str, streams: int, ready: int
) -> dict[str, float]:
    counts = {}
    for r in (small, large):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={d}/cg.out",
                    sys.executable,
                    __file__,
                    "--reads",
                    reads_file,
                    "--requests",
                    str(r),
                    "--mode",
                    mode,
                    "--streams",
                    str(streams),
                    "--ready",
                    str(ready),
                    "--json",
                ],
                capture_output=True,
                text=True,
                env=dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1"),
            )
            m = re.search(r"Collected : (\d+)", out.stderr)
            if out.returncode or m is None:
                raise SystemExit(f"callgrind failed: {out.stderr[-2000:]}")
            counts[r] = (int(m.group(1)), json.loads(out.stdout.strip().splitlines()[-1])["chunks"])
    (i0, c0), (i1, c1) = counts[small], counts[large]
    return {"instructions_per_chunk": (i1 - i0) / (c1 - c0), "chunks": c1 - c0}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--small", type=int, default=20, help="the smaller R of --callgrind")
    ap.add_argument("--mode", choices=("protocol", "socket", "loop"), default="protocol")
    ap.add_argument("--streams", type=int, default=64, help="--mode loop: connections")
    ap.add_argument(
        "--ready",
        type=int,
        default=8,
        help="--mode loop: streams written to before the loop serves them",
    )
    ap.add_argument("--repeat", type=int, default=5, help="timed repeats (the best is printed)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per chunk (valgrind)")
    ap.add_argument("--profile", action="store_true", help="cProfile of one pass")
    ap.add_argument("--reads", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reads:
        reads = json.loads(Path(args.reads).read_text(encoding="latin-1"))
        reads = [r.encode("latin-1") for r in reads]
    else:
        reads = capture_reads()
    if args.json:  # one pass, for callgrind
        chunks, _ = run(reads, args.requests, args.mode, args.streams, args.ready)
        print(json.dumps({"chunks": chunks}))
        return
    if args.callgrind:
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", delete=False, encoding="latin-1"
        ) as f:
            json.dump([r.decode("latin-1") for r in reads], f)
        try:
            res = callgrind(f.name, args.small, args.requests, args.mode, args.streams, args.ready)
        finally:
            os.unlink(f.name)
        print(
            f"{args.mode}: {res['instructions_per_chunk']:.0f} instructions per chunk "
            f"({res['chunks']} chunks, R={args.small} vs {args.requests})"
        )
        return
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run(reads, args.requests, args.mode, args.streams, args.ready)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    best = min(
        elapsed / chunks
        for chunks, elapsed in (
            run(reads, args.requests, args.mode, args.streams, args.ready)
            for _ in range(args.repeat)
        )
    )
    print(
        f"{args.mode}: {best * 1e9:.0f} ns per chunk (best of {args.repeat}; {len(reads)} reads "
        f"per response, {args.requests} responses)"
    )


if __name__ == "__main__":
    main()
