"""``agent-replay run`` and ``agent-replay demo``: parse into a RunConfig, call the library,
render the summary."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.config import DEMO_SPEEDUP, RunConfig
from agent_replay.replay.options import add_options, namespace_values, nested_values
from agent_replay.replay.presets import AgentXSettings, resolve


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="replay a trace against an endpoint with its original timing",
        description="Replay TRACE against --target, streaming every response, and "
        "write a results folder (run.json + requests/*.parquet).",
    )
    p.add_argument("trace", help="trace file or folder of part files")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--target", help="base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000"
    )
    where.add_argument(
        "--launch",
        metavar='"PROFILE --model M ..."',
        help="start a local vLLM for this run (the arguments of 'engines "
        "launch' in one string), replay against it, then stop it",
    )
    where.add_argument(
        "--engine",
        metavar="sim:PROFILE",
        help="with --virtual: predict the run on the simulated engine with this "
        "profile (shipped name or a JSON of 'engines sim-fit'), in virtual time",
    )
    p.add_argument(
        "--virtual",
        action="store_true",
        help="with --engine: no sockets, no sleeping; run.json marks the folder a prediction",
    )
    where.add_argument(
        "--targets",
        metavar="A,B",
        help="replay the plan against each of these base URLs at once, one lane "
        "each, into OUTPUT/lane-N, then compare them request by request "
        "(replay/lanes.py: each target sees the load of a run of its own; the "
        "host's noise falls on every lane alike)",
    )
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    d = sub.add_parser(
        "demo", help="replay the bundled sample trace on the built-in simulated engine"
    )
    d.add_argument(
        "--output", "-o", default=None, help="results folder (default ./demo-results/<time>)"
    )
    d.add_argument(
        "--profile", default=None, help="simulated engine profile (default: the engine's default)"
    )
    d.add_argument(
        "--speedup",
        type=float,
        default=None,
        help=f"divide all times by this (default {DEMO_SPEEDUP:g})",
    )
    d.add_argument("--trace", default=None, help="a trace to use instead of the bundled sample")
    d.set_defaults(func=cmd_demo)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Every run option of ``RunConfig`` (``replay.options``: one field each)."""
    add_options(p, RunConfig)


def check_trace(path: str) -> None:
    """A JSON, JSONL or CSV file is a trace to import first (``traces import``), not one to
    replay: say so instead of "not a readable Parquet file"."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        return
    with p.open("rb") as f:
        head = f.read(64).lstrip()
    if p.suffix.lower() in (".json", ".jsonl", ".csv") or head[:1] in (b"{", b"["):
        raise InputError(
            f"{path}: not a Parquet trace (it looks like {p.suffix.lstrip('.') or 'JSON'}): "
            f"import it first: agent-replay traces import {path} -o "
            f"{p.with_suffix('.parquet').name} (agent-replay traces import --help "
            "lists the formats), then run that"
        )


def check_target(url: str) -> str:
    """``--target`` as given, after saying what a ``/v1`` ending means; an endpoint path
    (``.../v1/chat/completions``) is refused: the replay adds each request's path itself."""
    from urllib.parse import urlsplit

    from agent_replay.redact import redact_url

    shown = redact_url(url)  # user-info (a password) is never printed
    parts = urlsplit(shown)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        root = shown.rstrip("/")[:-3]
        print(
            f"note: --target {shown}: the server's root {root} is used (each request's path "
            "starts with /v1 already)",
            file=sys.stderr,
        )
    elif "/v1/" in path:
        root = f"{parts.scheme}://{parts.netloc}{path[: path.index('/v1/')]}"
        raise InputError(
            f"--target {shown}: give the server's base URL ({root}), not an "
            "endpoint: the replay adds each request's path itself"
        )
    return url


def config_from_args(args: argparse.Namespace, target: str) -> RunConfig:
    values = namespace_values(args, RunConfig)
    given = nested_values(args, AgentXSettings, "agentx.")
    preset = given.pop("preset", None)
    agentx, values["duration_s"] = resolve(preset, given, values["duration_s"])
    if preset is not None:
        values["timing"] = "agentx"
    return RunConfig(
        trace=args.trace,
        target=target,
        launch=getattr(args, "launch", None),
        agentx=agentx,
        **values,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from agent_replay.replay.run import run

    check_trace(args.trace)
    if getattr(args, "engine", None) or getattr(args, "virtual", False):
        if not (args.engine and args.virtual):
            raise InputError("--engine and --virtual go together (a virtual-time prediction)")
        from agent_replay.replay.virtual import run_virtual

        summary = run_virtual(config_from_args(args, "http://virtual.invalid"), args.engine)
        _render(summary)
        return summary.exit_code
    if getattr(args, "targets", None):
        return _lanes(args)
    summary = run(config_from_args(args, check_target(args.target) if args.target else args.target))
    _render(summary)
    return summary.exit_code  # 5 rows unwritten, 130 interrupted, 1 failed/aborted/partial, else 0


def _lanes(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agent_replay.analysis.compare import compare_dirs, render_compare
    from agent_replay.replay.lanes import lanes_line, run_lanes

    urls = [check_target(u.strip()) for u in args.targets.split(",") if u.strip()]
    folders, code = run_lanes(config_from_args(args, urls[0] if urls else ""), urls)
    done = [f for f in folders if os.path.isfile(os.path.join(f, "run.json"))]
    if len(done) == len(folders) and code == 0:
        Console().print(render_compare(compare_dirs(done)))
    print(lanes_line(folders))
    return code


def _render(summary: Any) -> None:
    """The summary, after writing report.html beside run.json (or saying how to get it)."""
    from agent_replay.analysis.html import write_run_report
    from agent_replay.replay.summary import load_report, render_summary

    if summary.interrupted:  # a second Ctrl-C is not needed: the report is on its way
        print(
            f"interrupted: writing the report of the {summary.ok + summary.failed:,} finished "
            "requests (report.html); Ctrl-C again to skip it",
            file=sys.stderr,
            flush=True,
        )
    report = load_report(summary.output)
    _, line = write_run_report(summary.output, report) if report is not None else (None, None)
    render_summary(summary, sys.stdout, report=report, html_line=line)


def cmd_demo(args: argparse.Namespace) -> int:
    from agent_replay.replay.demo import demo

    summary = demo(output=args.output, profile=args.profile, speedup=args.speedup, trace=args.trace)
    _render(summary)
    return summary.exit_code if summary.unwritten else (130 if summary.interrupted else 0)
