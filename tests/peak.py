"""Peak memory of an ``agent-replay`` command in a child process, as the child's own
high-water mark (``VmHWM`` of its address space, read at its exit). ``wait4``'s
``ru_maxrss`` is no good from a test: a child starts from its parent's peak when forked
(exec keeps it), and a test process that built a large trace first would be counted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_WRAP = """
import atexit, os, runpy, sys

def _peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                with open(os.environ["AGENT_REPLAY_PEAK_FILE"], "w") as out:
                    out.write(line.split()[1])

atexit.register(_peak)
sys.argv = ["agent-replay", *sys.argv[1:]]
runpy.run_module("agent_replay", run_name="__main__", alter_sys=True)
"""


def run_peak(
    tmp: Path, *args: str, timeout: float = 280
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``agent-replay ARGS`` in a child: its result and its peak resident memory in MiB."""
    peak = tmp / "peak.txt"
    r = subprocess.run(
        [sys.executable, "-c", _WRAP, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "AGENT_REPLAY_PEAK_FILE": str(peak)},
    )
    return r, int(peak.read_text()) / 1024
