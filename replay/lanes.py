"""Two lanes of one plan side by side: ``agent-replay run TRACE --targets A,B``.

Each target gets the whole plan, as a run of its own would give it (the same sessions, the
same schedule, the same prompt salt), and the lanes run at the same time, each in its own
process, into OUTPUT/lane-1, OUTPUT/lane-2, .... The load each target sees is the load of a
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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig


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
    return [replace(config, target=t, output=str(root / f"lane-{i + 1}"), salt=salt)
            for i, t in enumerate(targets)]


def _lane(config: RunConfig) -> None:
    from agent_replay.replay.run import run

    # the lane's summary is written into its folder; its exit status says how it ended
    sys.exit(run(config).exit_code)


def run_lanes(config: RunConfig, targets: Sequence[str]) -> tuple[list[str], int]:
    """Run every lane at once (a process each); the lanes' folders and the worst exit code
    (130 when any was interrupted)."""
    configs = lane_configs(config, targets)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_lane, args=(c,), name=f"lane-{i + 1}") for i, c in enumerate(configs)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # the lanes got the terminal's SIGINT too: let them finish writing
        for p in procs:
            p.join()
        return [c.output or "" for c in configs], 130
    codes = [p.exitcode if p.exitcode is not None else 1 for p in procs]
    code = 130 if 130 in codes else max((c for c in codes if c >= 0), default=1)
    if any(c < 0 for c in codes):  # killed by a signal
        code = max(code, 1)
    return [c.output or "" for c in configs], code


def lanes_line(folders: Sequence[str]) -> str:
    """What to run next."""
    return ("lanes written: " + ", ".join(folders) + "; compare them: agent-replay compare "
            + " ".join(os.path.relpath(f) for f in folders))
