"""Which code produced a result: ``code_version()`` is the one answer every results file
records (run.json, benchmark summaries), so any figure can be traced to its commit."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

from replay import __version__

CHECKOUT = Path(__file__).resolve().parent.parent


@functools.cache
def code_version(root: Path = CHECKOUT) -> str:
    """``git describe --always --dirty`` when the code runs from a git checkout (a commit
    id, ``-dirty`` when files differ from it); else the installed distribution's version."""
    if (root / ".git").exists():  # a directory, or a file in a git worktree
        try:
            out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                 capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            pass
        else:
            if out.stdout.strip():
                return out.stdout.strip()
    try:
        return metadata.version("agent-replay")
    except metadata.PackageNotFoundError:
        return __version__
