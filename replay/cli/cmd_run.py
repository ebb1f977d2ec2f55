"""``agent-replay run`` and ``agent-replay demo``: parse into a RunConfig, call the library,
render the summary."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import add_options, namespace_values, nested_values
from agent_replay.replay.presets import AgentXSettings, resolve


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="replay a trace against an endpoint with its original timing",
                       description="Replay TRACE against --target, streaming every response, and "
                       "write a results folder (run.json + requests/*.parquet).")
    p.add_argument("trace", help="trace file or folder of part files")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="base URL of the OpenAI-compatible server, "
                       "e.g. http://127.0.0.1:8000")
    where.add_argument("--launch", metavar='"PROFILE --model M ..."',
                       help="start a local vLLM for this run (the arguments of 'engines "
                       "launch' in one string), replay against it, then stop it")
    where.add_argument("--engine", metavar="sim:PROFILE",
                       help="with --virtual: predict the run on the simulated engine with this "
                       "profile (shipped name or a JSON of 'engines sim-fit'), in virtual time")
    p.add_argument("--virtual", action="store_true",
                   help="with --engine: no sockets, no sleeping; run.json marks the folder a prediction")
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="replay the bundled sample trace on the built-in simulated engine")
    d.add_argument("--output", "-o", default=None, help="results folder (default ./demo-results/<time>)")
    d.add_argument("--profile", default=None, help="simulated engine profile (default: the engine's default)")
    d.add_argument("--speedup", type=float, default=None, help="time compression (default 10)")
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
        raise InputError(f"{path}: not a Parquet trace (it looks like {p.suffix.lstrip('.') or 'JSON'}): "
                         f"import it first: agent-replay traces import {path} -o "
                         f"{p.with_suffix('.parquet').name} (agent-replay traces import --help "
                         "lists the formats), then run that")


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
        print(f"note: --target {shown}: the server's root {root} is used (each request's path "
              "starts with /v1 already)", file=sys.stderr)
    elif "/v1/" in path:
        root = f"{parts.scheme}://{parts.netloc}{path[:path.index('/v1/')]}"
        raise InputError(f"--target {shown}: give the server's base URL ({root}), not an "
                         "endpoint: the replay adds each request's path itself")
    return url


def config_from_args(args: argparse.Namespace, target: str) -> RunConfig:
    values = namespace_values(args, RunConfig)
    given = nested_values(args, AgentXSettings, "agentx.")
    preset = given.pop("preset", None)
    agentx, values["duration_s"] = resolve(preset, given, values["duration_s"])
    if preset is not None:
        values["timing"] = "agentx"
    return RunConfig(trace=args.trace, target=target, launch=getattr(args, "launch", None),
                     agentx=agentx, **values)


def cmd_run(args: argparse.Namespace) -> int:
    from agent_replay.replay.run import run

    check_trace(args.trace)
    if args.engine or args.virtual:
        if not (args.engine and args.virtual):
            raise InputError("--engine and --virtual go together (a virtual-time prediction)")
        from agent_replay.replay.virtual import run_virtual

        summary = run_virtual(config_from_args(args, "http://virtual.invalid"), args.engine)
        _render(summary)
        return summary.exit_code
    summary = run(config_from_args(args, check_target(args.target) if args.target else args.target))
    _render(summary)
    return summary.exit_code  # 5 rows unwritten, 130 interrupted, 1 failed/aborted/partial, else 0


def _render(summary: Any) -> None:
    """The summary, after writing report.html beside run.json (or saying how to get it)."""
    from agent_replay.analysis.html import write_run_report
    from agent_replay.replay.summary import load_report, render_summary

    report = load_report(summary.output)
    _, line = write_run_report(summary.output, report) if report is not None else (None, None)
    render_summary(summary, sys.stdout, report=report, html_line=line)


def cmd_demo(args: argparse.Namespace) -> int:
    from agent_replay.replay.demo import demo

    summary = demo(output=args.output, profile=args.profile, speedup=args.speedup, trace=args.trace)
    _render(summary)
    return summary.exit_code if summary.unwritten else (130 if summary.interrupted else 0)
