"""``agent-replay engines ...``: the simulated engine and vLLM deployment profiles.

The group is shared: ``cmd_sim`` registers ``engines sim``; ``cmd_vllm`` registers
``engines vllm-cmd``, ``engines launch`` and ``engines tiny-model``.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    from agent_replay.replay.cli import cmd_sim, cmd_vllm

    p = sub.add_parser("engines", help="run the simulated engine; print or launch vLLM profiles")
    group = p.add_subparsers(dest="engines_command", metavar="ENGINES_COMMAND")
    p.set_defaults(func=lambda args: _help(p))
    cmd_sim.register(group)
    cmd_sim.register_fit(group)
    cmd_vllm.register(group)


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2
