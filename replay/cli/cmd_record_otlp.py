"""``agent-replay record-otlp``: an OTLP/HTTP receiver that records a trace from the
telemetry agents export (GenAI / OpenInference spans, Claude Code and Codex events)."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from agent_replay.engines import aio


def register(sub: Any) -> None:
    p = sub.add_parser(
        "record-otlp",
        help="record a trace from OpenTelemetry exports (no proxy)",
        description="Receive OTLP/HTTP exports (JSON; protobuf with the otlp extra) at "
        "/v1/traces and /v1/logs and write the trace they describe to "
        "TRACE_DIR/part-00001.parquet, every export also to TRACE_DIR/otlp-exports.jsonl. "
        "Point OTEL_EXPORTER_OTLP_ENDPOINT at it. Ctrl-C (or SIGTERM) writes and exits 0.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:4318",
        metavar="HOST:PORT",
        help="where exporters connect (default 127.0.0.1:4318; port 0 picks one)",
    )
    p.add_argument("-o", "--output", required=True, metavar="TRACE_DIR")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier recording in TRACE_DIR instead of refusing",
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per hash block (default 16)")
    p.add_argument(
        "--flush-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="rewrite the trace this often when exports came (default 2)",
    )
    p.add_argument(
        "--max-body",
        type=float,
        default=32.0,
        metavar="MIB",
        help="largest export body taken, in MiB; larger ones get 413 (default 32)",
    )
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --listen address"
    )
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.set_defaults(func=cmd_record_otlp)


def cmd_record_otlp(args: Any) -> int:
    from agent_replay.replay.record.otlp_receiver import OtlpReceiver

    rec = OtlpReceiver(
        args.listen,
        args.output,
        block_size=args.block_size,
        flush_interval_s=args.flush_interval,
        max_body=int(args.max_body * (1 << 20)),
        allow_remote=args.allow_remote,
        force=args.force,
    )
    aio.run(_serve(rec, quiet=args.quiet))
    if rec.stats.write_error:
        print(
            f"agent-replay record-otlp: ERROR: the trace could not be written "
            f"({rec.stats.write_error}); every export is in {rec.out_dir}/otlp-exports.jsonl "
            "(traces import reads it)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


async def _serve(rec: Any, *, quiet: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await rec.start()
    print(
        f"agent-replay record-otlp: OTLP/HTTP at {rec.url} (export with "
        f"OTEL_EXPORTER_OTLP_ENDPOINT={rec.url}), writing {rec.out_dir}/; Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    last = ""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=10.0)
        except asyncio.TimeoutError:
            pass
        line = rec.status_line()
        if not quiet and line != last:
            print(f"agent-replay record-otlp: {line}", file=sys.stderr, flush=True)
        last = line
    await rec.stop()
    print(f"agent-replay record-otlp: stopped; {rec.status_line()}", file=sys.stderr, flush=True)
