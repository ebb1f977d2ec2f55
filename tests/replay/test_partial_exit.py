"""A run that lost workers (dead Ray actors) is partial: exit code 1 and one line that says
how many sessions were lost and where the partial results are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agent_replay.replay.run as run_mod
from agent_replay.replay.cli import main
from agent_replay.replay.runrecord import RunSummary
from tests.replay.helpers import chain_rows, write_rows


def test_exit_codes_of_summaries() -> None:
    assert RunSummary(output="o").exit_code == 0
    assert RunSummary(output="o").partial_line() is None
    assert RunSummary(output="o", partial=True).exit_code == 1
    assert RunSummary(output="o", partial=True, interrupted=True).exit_code == 130
    line = RunSummary(
        output="res/x", partial=True, lost_sessions=3, lost_requests=17
    ).partial_line()
    assert line is not None
    assert "3 sessions (17 requests)" in line and "res/x" in line and "ray.lost" in line


def test_rows_without_a_part_file_exit_5_whatever_the_status() -> None:
    s = RunSummary(output="res/x", ok=10, unwritten=4, write_error="No space left on device")
    assert (s.status, s.exit_code) == ("incomplete", 5)
    assert s.unwritten_line() == (
        "4 recorded requests have no row in res/x/requests: their "
        "part files could not be written (No space left on device)"
    )
    stopped = RunSummary(output="o", interrupted=True, unwritten=1)
    assert (stopped.status, stopped.exit_code) == ("interrupted", 5)
    assert RunSummary(output="o").unwritten_line() is None


def test_cli_exits_1_on_a_partial_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_rows(
        tmp_path / "t.parquet",
        chain_rows(2, 2, gap_ns=1, think_ns=1, input_tokens=8, output_tokens=2),
    )
    out = tmp_path / "r"
    seen: dict[str, Any] = {}

    def fake_run(config: Any, **kw: Any) -> RunSummary:
        seen["config"] = config
        return RunSummary(
            output=str(out),
            total=4,
            sent=2,
            ok=2,
            errors={"actor_lost": 2},
            partial=True,
            lost_sessions=1,
            lost_requests=2,
        )

    monkeypatch.setattr(run_mod, "run", fake_run)
    code = main(
        ["run", str(trace), "--target", "http://127.0.0.1:9", "-o", str(out), "--no-progress"]
    )
    assert code == 1
    assert seen["config"].output == str(out)
