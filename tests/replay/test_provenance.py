"""code_version: the commit a result came from, or the installed version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_replay import __version__
from agent_replay.replay.provenance import CHECKOUT, code_version


@pytest.mark.skipif(
    shutil.which("git") is None or not (CHECKOUT / ".git").exists(),
    reason="not running from a git checkout",
)
def test_a_checkout_reports_git_describe():
    code_version.cache_clear()  # an earlier test of this process may have cached another tree state
    want = subprocess.run(
        ["git", "-C", str(CHECKOUT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert code_version() == want and want


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_dirty_checkout_says_so(tmp_path: Path):
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "f").write_text("a")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = git("rev-parse", "--short", "HEAD")
    assert code_version(tmp_path) == head
    (tmp_path / "f").write_text("b")
    code_version.cache_clear()
    assert code_version(tmp_path) == f"{head}-dirty"


def test_outside_a_checkout_the_installed_version(tmp_path: Path):
    assert code_version(tmp_path) == __version__  # the version pyproject gives the install
