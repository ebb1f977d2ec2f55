"""Where a run's numbers came from, for run.json: the project's commit (or version), the
full command line, dependency versions, host, GPUs, and the server's own version and flags
where it exposes them. Every probe is best-effort and bounded: a missing git, nvidia-smi or
/version endpoint leaves its field null, never fails a run."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import urllib.request
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from agent_replay.redact import redact, redact_argv

DEPENDENCIES = (
    "aiohttp",
    "numpy",
    "pyarrow",
    "rich",
    "hdrhistogram",
    "orjson",
    "psutil",
    "uvloop",
    "openai",
    "anthropic",
    "matplotlib",
    "ray",
    "vllm",
)
"""Packages whose installed versions are recorded (absent ones as null)."""

CHECKOUT = Path(__file__).resolve().parents[1]
"""The repository root when the code runs from a checkout."""


def _cmd(args: list[str], cwd: Path | None = None, timeout: float = 5.0) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@lru_cache(maxsize=4)
def code_version(root: Path = CHECKOUT) -> str:
    """Which code produced a result, the one answer every results file records (run.json,
    benchmark summaries): ``git describe --always --dirty`` when the code runs from a git
    checkout (a commit id, ``-dirty`` when files differ from it); else the installed
    distribution's version."""
    if (root / ".git").exists():  # a directory, or a file in a git worktree
        described = _cmd(["git", "-C", str(root), "describe", "--always", "--dirty"], timeout=10.0)
        if described:
            return described
    try:
        return metadata.version("agent-replay")
    except metadata.PackageNotFoundError:
        from agent_replay import __version__

        return __version__


@lru_cache(maxsize=1)
def source() -> dict[str, Any]:
    """The project's code version (``code_version``), its git commit and whether the tree
    had uncommitted changes (null outside a checkout), and its installed version."""
    from agent_replay import __version__

    commit = _cmd(["git", "rev-parse", "HEAD"], cwd=CHECKOUT)
    dirty = None
    if commit is not None:
        status = _cmd(["git", "status", "--porcelain", "--untracked-files=no"], cwd=CHECKOUT)
        dirty = bool(status) if status is not None else None
    return {
        "code_version": code_version(),
        "version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
    }


@lru_cache(maxsize=1)
def dependencies() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in DEPENDENCIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@lru_cache(maxsize=1)
def gpus() -> list[dict[str, str]]:
    """The host's NVIDIA GPUs (name, driver, memory) from nvidia-smi; [] without one."""
    raw = _cmd(
        [
            "nvidia-smi",
            "--query-gpu=index,name,driver_version,memory.total",
            "--format=csv,noheader",
        ]
    )
    if not raw:
        return []
    rows = []
    for line in raw.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append(dict(zip(("index", "name", "driver", "memory"), parts, strict=True)))
    return rows


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def server_version(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The server's ``/version`` answer (vLLM and the simulated engine expose one); None
    when it has none."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/version", timeout=timeout) as r:
            if r.status != 200:
                return None
            body = r.read(65536)
    except (OSError, ValueError):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else {"version": data}


def provenance(
    target_url: str | None = None,
    launch_info: dict[str, Any] | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """The ``provenance`` block of run.json. ``launch_info``: what the launcher knows about
    the server it started (exact command, version, flags)."""
    server: dict[str, Any] = {}
    if target_url:
        server["version_endpoint"] = server_version(target_url)
    if launch_info:
        for key in ("vllm_version", "command", "argv", "flags", "profile", "env"):
            if key in launch_info:
                server[key] = launch_info[key]
    return redact(
        {
            "source": source(),
            "command_line": redact_argv(sys.argv if argv is None else argv),
            "executable": sys.executable,
            "dependencies": dependencies(),
            "host": host(),
            "gpus": gpus(),
            "server": server,
        }
    )
