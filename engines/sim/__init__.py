"""The simulated engine: a vLLM-dialect HTTP server with a documented performance model.

Public API: ``SimProfile`` (``SimProfile.load("fast")``), ``SimServer`` (in this event loop,
``async with SimServer(profile) as s: s.url``), ``SimProcess`` (a child process,
``with SimProcess("fast") as sim: sim.url``). Equations and wire details: docs/sim-engine.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_replay.engines.sim.core import EngineCore, SimRequest
    from agent_replay.engines.sim.ground_truth import GROUND_TRUTH_SCHEMA
    from agent_replay.engines.sim.process import SimProcess
    from agent_replay.engines.sim.profile import PROFILE_NAMES, SimProfile
    from agent_replay.engines.sim.server import SimServer
    from agent_replay.engines.sim.tokenizer import SimTokenizer, synthesize_text

# Each name is imported on first use: the command line imports this package for the
# ``engines sim`` arguments in every process, and the server (aiohttp's web side) is most of
# its import time.
_HOME = {
    "EngineCore": "core",
    "SimRequest": "core",
    "GROUND_TRUTH_SCHEMA": "ground_truth",
    "SimProcess": "process",
    "PROFILE_NAMES": "profile",
    "SimProfile": "profile",
    "SimServer": "server",
    "SimTokenizer": "tokenizer",
    "synthesize_text": "tokenizer",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "GROUND_TRUTH_SCHEMA",
    "PROFILE_NAMES",
    "EngineCore",
    "SimProcess",
    "SimProfile",
    "SimRequest",
    "SimServer",
    "SimTokenizer",
    "synthesize_text",
]
