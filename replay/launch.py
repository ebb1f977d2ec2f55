"""Start a local vLLM for a run: the arguments of ``agent-replay engines launch`` as a
library call, and the ``--launch "PROFILE --model M ..."`` spec that ``run`` takes."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import Iterator
from typing import Any

from agent_replay.errors import InputError


def deployment_args(p: argparse.ArgumentParser, gpus_default: int | None = None) -> None:
    """The arguments that pick a profile and size it (``vllm-cmd`` and ``launch``)."""
    from agent_replay.engines.vllm.profiles import PROFILES

    p.add_argument("profile", choices=list(PROFILES), metavar="PROFILE", help=", ".join(PROFILES))
    p.add_argument("--model", required=True, help="model path or hub name")
    p.add_argument(
        "--gpus",
        type=int,
        default=gpus_default,
        required=gpus_default is None,
        help="GPUs in total",
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes (GPUs split evenly)")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a profile knob or a vLLM flag (repeatable); 'prefill.'/'decode.' "
        "scopes a flag to one instance",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        help="python of the venv that has vLLM (for checks and launch)",
    )
    p.add_argument(
        "--vllm-version",
        default=None,
        help="adapt the commands to this vLLM version (default: the installed one)",
    )


def add_launch_args(p: argparse.ArgumentParser) -> None:
    deployment_args(p, gpus_default=1)
    p.add_argument("--port", type=int, default=None, help="API port (default: a free one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="how to start it: cpu = api_server module, gpu = vllm CLI serve",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the server (repeatable)",
    )
    p.add_argument(
        "--allow-unapplied",
        action="store_true",
        help="keep a server that runs other settings than requested (they are "
        "recorded in 'settings'); default: stop it and fail",
    )


def server_from_args(args: argparse.Namespace) -> Any:
    """A ``VllmServer`` (not started) from ``engines launch`` arguments."""
    from agent_replay.engines.vllm.launcher import VllmServer
    from agent_replay.engines.vllm.profiles import build, parse_sets

    dep = build(
        args.profile,
        model=args.model,
        gpus=args.gpus,
        nodes=args.nodes,
        sets=parse_sets(args.sets),
        version=args.vllm_version,
    )
    env = dict(parse_sets(args.env))
    return VllmServer(
        dep,
        python=args.vllm_python,
        port=args.port,
        timeout_s=args.timeout,
        log_path=args.log,
        device=args.device,
        env=env,
        check_settings=not args.allow_unapplied,
    )


def parse_spec(spec: str) -> argparse.Namespace:
    """Parse a ``--launch`` spec; a bad one is an InputError that shows the expected form."""
    parser = argparse.ArgumentParser(prog="--launch", exit_on_error=False, add_help=False)
    add_launch_args(parser)
    try:
        return parser.parse_args(shlex.split(spec))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise InputError(
            f"--launch {spec!r}: {exc} (expected: PROFILE --model M [--gpus N] "
            "[--set K=V ...] [--vllm-python PATH] [--env K=V ...])"
        ) from None


@contextlib.contextmanager
def launched(spec: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Start the server ``spec`` describes; yield its base URL and its metadata (exact
    command, vLLM version, hardware) for run.json; stop it on the way out, however left."""
    args = parse_spec(spec)
    server = server_from_args(args)
    with server:
        from agent_replay.engines.vllm.resolved import SettingCheck, summary

        checks = [SettingCheck(**c) for c in server.info.get("settings", [])]
        print(
            f"agent-replay: launched vLLM {server.info.get('vllm_version')} "
            f"({args.profile}) at {server.url} in {server.info.get('start_s')} s; "
            f"settings {summary(checks)}; log {server.log_path}",
            file=sys.stderr,
        )
        yield server.url, dict(server.info)
