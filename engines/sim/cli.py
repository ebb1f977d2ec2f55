"""Command line of the simulated engine, shared by ``python -m engines.sim`` and
``agent-replay engines sim``. Several workers share one port with SO_REUSEPORT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agent_replay.engines import aio

READY_PREFIX = "READY "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; default 8000)")
    p.add_argument(
        "--profile",
        default="default",
        help="shipped profile (default, fast, mtp) or a JSON profile file",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing the port with SO_REUSEPORT (default 1)",
    )
    p.add_argument(
        "--ground-truth",
        metavar="FILE",
        default=None,
        help="write per-chunk write times as Parquet on shutdown (one file per worker: "
        "FILE, or FILE with .wN before the suffix when --workers > 1)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing ground-truth file")
    p.add_argument(
        "--kernel-arrival",
        action="store_true",
        help="with --ground-truth (Linux): each request's arrival from the kernel's "
        "receive stamp of its first packet, so the engine's own ingress queue "
        "shows in the ground truth; the engine then reads and writes through a "
        "Python transport (engines.kstamp) instead of uvloop's",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="demand this key (Authorization: Bearer KEY or x-api-key: KEY) on "
        "every request but /health, else 401: a protected endpoint, for tests",
    )
    p.add_argument(
        "--tool-call",
        metavar="NAME=JSON",
        action="append",
        default=None,
        help="answer a request that offers tool NAME, on a user's turn, with a call "
        'of it with these arguments (e.g. \'Bash={"command": "ls"}\'), '
        "so that an agent runs a tool; repeat for several tools (the first "
        "offered applies)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine-index", type=int, default=0, help=argparse.SUPPRESS)


def worker_path(path: str, k: int) -> str:
    pth = Path(path)
    return str(pth.with_name(f"{pth.stem}.w{k}{pth.suffix}"))


def run(args: argparse.Namespace) -> int:
    from agent_replay.engines.sim.profile import SimProfile
    from agent_replay.errors import InputError

    if args.workers < 1:
        raise InputError("--workers must be >= 1")
    SimProfile.load(args.profile)  # bad profile: one line, exit 2, before anything starts
    if args.tool_call is not None:
        from agent_replay.engines.sim.requests import ToolCallSpec

        for spec in args.tool_call:
            try:
                ToolCallSpec.parse(spec)
            except ValueError as exc:
                raise InputError(f"--tool-call: {exc}") from None
    if args.workers == 1:
        return _run_single(args)
    return _run_workers(args)


def _run_single(args: argparse.Namespace) -> int:
    from agent_replay.engines.sim.server import SimServer
    from agent_replay.engines.sim.stats import schedule_warning

    async def main() -> None:
        server = SimServer(
            args.profile,
            host=args.host,
            port=args.port,
            seed=args.seed,
            ground_truth=args.ground_truth,
            force=args.force,
            reuse_port=args.reuse_port,
            engine_index=args.engine_index,
            kernel_arrival=args.kernel_arrival,
            api_key=args.api_key,
            tool_call=args.tool_call,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await server.start()
        # Everything made so far (token tables, profile, app) lives as long as the process:
        # keep it out of the collector's generations, so collections during the run are
        # short (a collection blocks the loop, and with it a step's writes).
        gc.freeze()
        print(
            f"{READY_PREFIX}{server.url} profile={server.profile.name} "
            f"model={server.profile.model_name} pid={os.getpid()}",
            flush=True,
        )
        await stop.wait()
        await server.stop()
        warning = schedule_warning(server.core.stats)
        if warning:
            print(f"engines.sim: warning: {warning}", file=sys.stderr, flush=True)

    aio.run(main())
    return 0


def _run_workers(args: argparse.Namespace) -> int:
    from agent_replay.errors import InputError, LaunchError

    reserve = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserve.bind((args.host, args.port))
    except OSError as exc:
        reserve.close()
        raise InputError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    port = reserve.getsockname()[1]
    procs: list[subprocess.Popen[str]] = []
    try:
        for k in range(args.workers):
            cmd = [
                sys.executable,
                "-m",
                "agent_replay.engines.sim",
                "--host",
                args.host,
                "--port",
                str(port),
                "--profile",
                args.profile,
                "--seed",
                str(args.seed + k),
                "--reuse-port",
                "--engine-index",
                str(k),
            ]
            if args.ground_truth:
                cmd += ["--ground-truth", worker_path(args.ground_truth, k)]
            if args.force:
                cmd.append("--force")
            if args.kernel_arrival:
                cmd.append("--kernel-arrival")
            if args.api_key:
                cmd += ["--api-key", args.api_key]
            for spec in args.tool_call or ():
                cmd += ["--tool-call", spec]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        for k, pr in enumerate(procs):
            assert pr.stdout is not None
            line = pr.stdout.readline()
            if not line.startswith(READY_PREFIX):
                raise LaunchError(f"sim worker {k} did not start (exit code {pr.poll()})")
        print(
            f"{READY_PREFIX}http://{args.host}:{port} workers={args.workers} pid={os.getpid()}",
            flush=True,
        )
        stopped = False

        def _stop(signum: int, frame: object) -> None:
            nonlocal stopped
            stopped = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        while not stopped and all(pr.poll() is None for pr in procs):
            time.sleep(0.2)
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
        for pr in procs:
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()
        reserve.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    from agent_replay.errors import AgentReplayError

    parser = argparse.ArgumentParser(
        prog="python -m engines.sim", description="The simulated vLLM-dialect engine."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except AgentReplayError as exc:
        print(f"engines.sim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
