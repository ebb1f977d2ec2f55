"""``agent-replay engines sim``: run the simulated vLLM-dialect engine."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add ``sim`` to the ``engines`` group."""
    from agent_replay.engines.sim.cli import add_arguments

    p = sub.add_parser(
        "sim",
        help="run the simulated engine (vLLM's OpenAI-compatible dialect, modelled timing)",
        description="Run the simulated engine: a real HTTP server speaking vLLM's dialect whose "
        "timing follows a documented performance model (docs/sim-engine.md). It is a model, "
        "never a measurement of real hardware. Stop it with Ctrl-C or SIGTERM.",
    )
    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from agent_replay.engines.sim.cli import run

    return run(args)
