"""A bad option value is one line on stderr that names the option and points to --help.

Before: ``agent-replay run t.parquet --speedup fast`` printed the 35 lines of usage above
"error: argument --speedup: invalid float value: 'fast'". After: that line alone, ending
"(see agent-replay run --help)". ``demo --help`` states the demo's default speedup (5,
not 10) and ``demo --speedup 0`` is refused instead of being run at 5."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent_replay.replay.cli import main
from agent_replay.replay.config import DEMO_SPEEDUP


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["run", "t.parquet", "--target", "http://h:1", "--speedup", "fast"],
            "agent-replay run: error: argument --speedup: invalid float value: 'fast' "
            "(see agent-replay run --help)",
        ),
        (
            ["run", "t.parquet", "--target", "http://h:1", "--duration", "10s"],
            "agent-replay run: error: argument --duration-s/--duration: invalid float value: '10s' "
            "(see agent-replay run --help)",
        ),
        (
            ["sweep"],
            "agent-replay sweep: error: the following arguments are required: experiment "
            "(see agent-replay sweep --help)",
        ),
    ],
)
def test_a_bad_value_is_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_demo_help_says_its_default_and_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert f"divide all times by this (default {DEMO_SPEEDUP:g})" in capsys.readouterr().out
    assert DEMO_SPEEDUP == 5.0
    got = subprocess.run(
        [sys.executable, "-m", "agent_replay", "demo", "--speedup", "0", "-o", "never-written"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        got.returncode == 2
        and got.stderr == "agent-replay: error: --speedup must be > 0, got 0.0\n"
    )
