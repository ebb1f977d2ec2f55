"""Two lanes of one plan side by side: ``agent-replay run TRACE --targets A,B``.

Each target gets the whole plan, as a run of its own would give it (the same sessions, the
same schedule, the same prompt salt), and the lanes run at the same time, each in its own
process, into OUTPUT/lane-1, OUTPUT/lane-2, ..., starting their plans together (each
waits for the others' imports). The load each target sees is the load of a
run against it alone; what the lanes share is this host: its CPU and its noise. That is the
point: a busy moment of the host falls on every lane at once, and since the lanes replay
one plan, ``compare`` pairs their requests by identity (``analysis.paired``) and the host's
noise falls on both sides of every pair. The price: the client does the work of every lane,
so a host that could drive one run may not drive two (each lane's self-check says so), and
targets that share hardware (two simulated engines on this host, two deployments on one
GPU) also compete with each other, which a run against one alone would not see.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig

if TYPE_CHECKING:
    from multiprocessing.synchronize import Barrier


def lane_configs(config: RunConfig, targets: Sequence[str]) -> list[RunConfig]:
    """One config per target: the same options and salt, a folder each under the output."""
    if len(targets) < 2:
        raise InputError("--targets: give two or more URLs, separated by commas")
    if len(set(targets)) < len(targets):
        raise InputError(f"--targets: a URL given twice ({','.join(targets)})")
    if config.output is None:
        raise InputError("--targets needs --output: the lanes' results go in its lane-N folders")
    salt = config.salt if config.salt is not None else secrets.randbits(63)
    root = Path(config.output)
    return [
        replace(config, target=t, output=str(root / f"lane-{i + 1}"), salt=salt)
        for i, t in enumerate(targets)
    ]


START_TIMEOUT_S = 120.0
"""Longest a lane waits for the others to be ready before it starts alone."""


def _lane(config: RunConfig, ready: Barrier) -> None:
    from agent_replay.replay.run import run

    # Every lane starts its plan once all have imported what they need: the lanes' clocks
    # start together, not one process start apart (seconds on a loaded host), so the same
    # moment of the host falls on the same point of both plans.
    try:
        ready.wait(START_TIMEOUT_S)
    except threading.BrokenBarrierError:  # a lane died or hung before its start: go alone
        pass
    # the lane's summary is written into its folder; its exit status says how it ended
    sys.exit(run(config).exit_code)


def _start(
    configs: Sequence[RunConfig], ready: Barrier
) -> Sequence[multiprocessing.process.BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_lane, args=(c, ready), name=f"lane-{i + 1}")
        for i, c in enumerate(configs)
    ]
    for p in procs:
        p.start()
    return procs


def _exit_code(procs: Sequence[multiprocessing.process.BaseProcess]) -> int:
    """The worst exit code of the lanes: 130 when any was interrupted, at least 1 when one
    was killed by a signal."""
    codes = [p.exitcode if p.exitcode is not None else 1 for p in procs]
    code = 130 if 130 in codes else max((c for c in codes if c >= 0), default=1)
    return max(code, 1) if any(c < 0 for c in codes) else code


def run_lanes(config: RunConfig, targets: Sequence[str]) -> tuple[list[str], int]:
    """Run every lane at once (a process each); the lanes' folders and the worst exit code
    (130 when any was interrupted)."""
    configs = lane_configs(config, targets)
    folders = [c.output or "" for c in configs]
    # the barrier lives here until the lanes end: a child rebuilds it from its name
    ready = multiprocessing.get_context("spawn").Barrier(len(configs))
    procs = _start(configs, ready)
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # the lanes got the terminal's SIGINT too: let them finish writing
        for p in procs:
            p.join()
        return folders, 130
    return folders, _exit_code(procs)


def lanes_line(folders: Sequence[str]) -> str:
    """What to run next."""
    return (
        "lanes written: "
        + ", ".join(folders)
        + "; compare them: agent-replay compare "
        + " ".join(os.path.relpath(f) for f in folders)
    )
