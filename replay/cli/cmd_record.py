"""``agent-replay record``: run the recording proxy until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from agent_replay.engines import aio
from agent_replay.errors import InputError
from agent_replay.traces.schema import CONTENT_MODES


def register(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="record agent traffic through a proxy into a trace",
        description="Run a reverse proxy in front of an OpenAI- or Anthropic-compatible "
        "endpoint; point agents' base URL at it. Every LLM request becomes one trace row in "
        "TRACE_DIR/part-NNNNN.parquet. Ctrl-C (or SIGTERM) flushes and exits 0.",
    )
    p.add_argument(
        "--upstream",
        required=True,
        help="base URL of the real endpoint, "
        "e.g. http://127.0.0.1:8000 or https://api.anthropic.com",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="where agents connect (default 127.0.0.1:8080; port 0 picks one)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="TRACE_DIR",
        help="trace folder to write part files into",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="delete part files already in TRACE_DIR instead of refusing",
    )
    p.add_argument(
        "--content",
        choices=CONTENT_MODES,
        default="hashed",
        help="hashed: prefix-block hashes only (default); full: also the request "
        "bodies (credential fields removed); none: neither",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="TOKENIZER_JSON",
        help="tokenizer.json (tokenizers library) to cut hash blocks on tokens; "
        "without it blocks are cut on bytes (4 bytes per token)",
    )
    p.add_argument("--block-size", type=int, default=64, help="tokens per hash block (default 64)")
    p.add_argument(
        "--hash-seed",
        type=int,
        default=None,
        help="fixed hash seed to compare ids across recordings (default: random)",
    )
    p.add_argument(
        "--session-header",
        default="X-Session-ID",
        help="request header naming the session (default X-Session-ID)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="write buffered rows this often (default 2; at most this much is lost "
        "if the recorder is killed)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up on an upstream silent this long (default 600; 0: never)",
    )
    p.add_argument(
        "--max-body",
        type=float,
        default=32.0,
        metavar="MIB",
        help="largest request body taken, in MiB; larger ones get 413 (default 32, "
        "what LLM APIs accept)",
    )
    p.add_argument(
        "--max-decoded",
        type=float,
        default=32.0,
        metavar="MIB",
        help="largest size a compressed request body (Content-Encoding) may "
        "decode to, in MiB; larger ones get 413 and a row that says why (default 32)",
    )
    p.add_argument(
        "--max-ratio",
        type=float,
        default=200.0,
        metavar="X",
        help="most times its compressed size a request body may decode to, past "
        "its first MiB; more gets 413 and a row that says why (default 200; a "
        "compression bomb decodes to 1,000 times its size or more)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, requests in flight get this long to finish "
        "(new ones are refused); then they are cut and recorded as cut, and the "
        "rows are flushed (default 10; a second Ctrl-C cuts at once)",
    )
    p.add_argument(
        "--write-retry",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="at stop, how long a failing final write (a full disk) is retried "
        "before the rows it holds are given up and the exit is 1 (default 10)",
    )
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --listen address"
    )
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.set_defaults(func=cmd_record)


def cmd_record(args: Any) -> int:
    from agent_replay.replay.record import Recorder

    if args.flush_interval <= 0:
        raise InputError("--flush-interval must be > 0")
    rec = Recorder(
        args.upstream,
        args.listen,
        args.output,
        content=args.content,
        force=args.force,
        tokenizer=args.tokenizer,
        block_size=args.block_size,
        hash_seed=args.hash_seed,
        session_header=args.session_header,
        flush_interval_s=args.flush_interval,
        read_timeout_s=args.read_timeout or None,
        allow_remote=args.allow_remote,
        drain_timeout_s=args.drain_timeout,
        max_body=int(args.max_body * (1 << 20)),
        max_decoded=int(args.max_decoded * (1 << 20)),
        max_ratio=args.max_ratio,
        write_retry_s=args.write_retry,
    )
    aio.run(_serve(rec, quiet=args.quiet))
    if rec.stats.unwritten:
        print(
            f"agent-replay record: ERROR: {rec.stats.unwritten} recorded rows could not be "
            f"written ({rec.stats.write_error})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


async def _serve(rec: Any, *, quiet: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            rec.force_stop()  # the second one: cut the drain short
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    await rec.start()
    print(
        f"agent-replay record: {rec.url} -> {rec.config.upstream}, writing "
        f"{rec.config.out_dir}/ (content {rec.config.content}); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    why = await upstream_problem(rec.config.upstream)
    if why is not None:
        print(
            f"agent-replay record: WARNING: the upstream {rec.config.upstream} does not answer "
            f"({why}): every request through the proxy will fail until it does (its client "
            "gets a 502 that says why); recording goes on",
            file=sys.stderr,
            flush=True,
        )
    tty = sys.stderr.isatty()
    last = ""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0 if tty else 10.0)
        except asyncio.TimeoutError:
            pass
        if not quiet:
            line = rec.status_line()
            if tty:
                print("\r\x1b[2K" + line, end="", file=sys.stderr, flush=True)
            elif line != last:
                print(line, file=sys.stderr, flush=True)
            last = line
    if tty and not quiet:
        print(file=sys.stderr)
    print(
        f"agent-replay record: stopping: {rec.in_flight} requests in flight get up to "
        f"{rec.config.drain_timeout_s:g} s (Ctrl-C again: cut them now)",
        file=sys.stderr,
        flush=True,
    )
    await rec.stop()
    print("agent-replay record: stopped; " + rec.status_line(), file=sys.stderr, flush=True)


async def upstream_problem(upstream: str, timeout_s: float = 5.0) -> str | None:
    """Why ``upstream`` cannot be reached (one HTTP request to its root, any answer, even an
    error status, counts as reachable), or None."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
            s.get(upstream.rstrip("/") + "/", allow_redirects=False) as r,
        ):
            await r.read()
    except asyncio.TimeoutError:
        return f"no answer in {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    return None
