"""Sweeps: many runs of one workload over targets and load points, interleaved and repeated,
into one results tree with an index table; the frontier and capacity are built from it.

Library API: ``load_experiment`` (an experiment file), ``run_sweep`` (run or resume it),
``run_capacity`` (bisect the load axis at an SLO), ``RunHook`` (something to run beside
each run, e.g. a telemetry sampler)."""

from __future__ import annotations

from agent_replay.replay.sweep.experiment import Experiment, Target, Warmup, load_experiment
from agent_replay.replay.sweep.runner import RunHook, SweepResult, run_sweep, schedule
from agent_replay.replay.sweep.session import run_capacity

__all__ = [
    "Experiment",
    "RunHook",
    "SweepResult",
    "Target",
    "Warmup",
    "load_experiment",
    "run_capacity",
    "run_sweep",
    "schedule",
]
