"""agent-replay installs under one import root, ``agent_replay``: a venv that already has
PyPI's ``traces`` (an unrelated time-series library) keeps it after agent-replay is installed
there from a built wheel, and both import. The wheel carries the package data (trace samples,
engine profiles) and the ``agent-replay`` console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "replay",
    "traces",
    "engines",
    "analysis",
    "agent_replay",
)

pytestmark = pytest.mark.slow


def _copy_source(dst: Path) -> None:
    """The files a wheel is built from (not the checkout's build outputs or venvs)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, symlinks=True, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dst / name)


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip installing into the venv of ``py`` (no pip of its own to set up)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(py), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_agent_replay_installs_beside_pypi_traces(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    got = _pip(py, "install", "-q", "traces")
    if got.returncode != 0:
        pytest.skip(f"PyPI's traces could not be installed: {got.stderr.strip().splitlines()[-1:]}")
    src = tmp_path / "src"
    src.mkdir()
    _copy_source(src)
    # the project itself from a wheel; its dependencies from this interpreter's site-packages
    # (a plain path entry after the venv's own: the venv's traces stays first)
    got = _pip(py, "install", "-q", "--no-deps", str(src))
    assert got.returncode == 0, got.stderr[-3000:]
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = (
        "import traces, agent_replay, agent_replay.traces as at\n"
        "from agent_replay.engines.sim.profile import SimProfile\n"
        "ts = traces.TimeSeries(); ts[1] = 2\n"
        "assert ts[1] == 2\n"
        "assert at.TRACE_SCHEMA.field('session_id') is not None\n"
        "assert SimProfile.load('fast') is not None\n"
        "import importlib.resources as r\n"
        "assert any(p.name.endswith('.parquet') for p in (r.files('agent_replay.traces') / 'samples').iterdir())\n"
        "print('both import', traces.__file__, agent_replay.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    got = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert got.returncode == 0 and "both import" in got.stdout, got.stderr[-3000:]
    files = got.stdout.split()[-2:]
    assert all(f.startswith(site) for f in files), (files, site)  # both from the venv
    cli = subprocess.run(
        [str(env_dir / "bin" / "agent-replay"), "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert cli.returncode == 0 and cli.stdout.startswith("agent-replay "), cli.stderr[-2000:]
    # installing agent-replay left PyPI's traces whole
    record = next(Path(site).glob("traces-*.dist-info")) / "RECORD"
    missing = [
        line.split(",")[0]
        for line in record.read_text().splitlines()
        if line.startswith("traces/") and not (Path(site) / line.split(",")[0]).exists()
    ]
    assert missing == []
    assert not (Path(site) / "replay").exists() and not (Path(site) / "analysis").exists()
