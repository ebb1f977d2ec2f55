"""The simulated engine: a vLLM-dialect HTTP server with a documented performance model.

Public API: ``SimProfile`` (``SimProfile.load("fast")``), ``SimServer`` (in this event loop,
``async with SimServer(profile) as s: s.url``), ``SimProcess`` (a child process,
``with SimProcess("fast") as sim: sim.url``). Equations and wire details: docs/sim-engine.md.
"""

from __future__ import annotations

from agent_replay.engines.sim.core import EngineCore, SimRequest
from agent_replay.engines.sim.ground_truth import GROUND_TRUTH_SCHEMA
from agent_replay.engines.sim.process import SimProcess
from agent_replay.engines.sim.profile import PROFILE_NAMES, SimProfile
from agent_replay.engines.sim.server import SimServer
from agent_replay.engines.sim.tokenizer import SimTokenizer, synthesize_text

__all__ = ["GROUND_TRUTH_SCHEMA", "PROFILE_NAMES", "EngineCore", "SimProcess", "SimProfile",
           "SimRequest", "SimServer", "SimTokenizer", "synthesize_text"]
