"""``agent-replay run`` and ``agent-replay demo``: parse into a RunConfig, call the library,
render the summary."""

from __future__ import annotations

import argparse
import sys
from typing import Any

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
    from agent_replay.replay.summary import render_summary

    summary = run(config_from_args(args, args.target))
    render_summary(summary, sys.stdout)
    return summary.exit_code  # 130 interrupted, 1 failed/aborted/partial, else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from agent_replay.replay.demo import demo
    from agent_replay.replay.summary import render_summary

    summary = demo(output=args.output, profile=args.profile, speedup=args.speedup, trace=args.trace)
    render_summary(summary, sys.stdout)
    return 130 if summary.interrupted else 0
