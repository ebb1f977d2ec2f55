"""Failed or cancelled: the report, the live dashboard and its progress line split the same
rows into the same two numbers (``analysis.outcomes``)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from agent_replay.analysis import outcomes
from agent_replay.analysis.dashboard import progress_line, render_dashboard
from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.live import LiveStats
from agent_replay.analysis.render import to_text
from agent_replay.analysis.report import build_report

MS = 1_000_000


def _rows() -> list[dict[str, object]]:
    ok = [
        {
            "session_id": f"s{i}",
            "intended_ns": i * 100 * MS,
            "sent_ns": i * 100 * MS,
            "first_token_ns": i * 100 * MS + 20 * MS,
            "end_ns": i * 100 * MS + 60 * MS,
            "chunk_ns": [i * 100 * MS + 20 * MS, i * 100 * MS + 60 * MS],
            "chunk_tokens": [1, 4],
            "completion_tokens": 5,
            "expected_output_tokens": 5,
            "status": "ok",
        }
        for i in range(7)
    ]
    bad = [
        {"session_id": "x", "status": "error", "error_kind": "http", "intended_ns": 0},
        {"session_id": "y", "status": "error", "error_kind": "cancelled", "intended_ns": 0},
        {"session_id": "z", "status": "error", "error_kind": "cancelled", "intended_ns": 0},
    ]
    return ok + bad


def test_split() -> None:
    assert outcomes.split({"http": 3, "cancelled": 59, "timeout": 1}) == (4, 59)
    assert outcomes.text({"cancelled": 59}) == "0 failed, 59 cancelled by the stop"
    assert outcomes.text({"http": 2}) == "2 failed"


def test_report_and_dashboard_say_the_same_numbers(tmp_path: Path) -> None:
    root = write_results(tmp_path / "run", rows_to_table(_rows()))
    rep = build_report(root)
    assert (rep.stats.requests["failed"], rep.stats.requests["cancelled"]) == (1, 2)
    # the error-rate warning counts the one failure, not the stop's cancellations
    assert any("1 of 8 requests failed" in w for w in rep.warnings)
    text = to_text(rep)
    assert "7 / 1 / 0" in text and "cancelled by the run's stop (not failed)" in text

    live = LiveStats()
    for row in _rows():
        live.observe_request(row)
    line = progress_line(live, 10)
    assert "1 failed, 2 cancelled by the stop" in line
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(render_dashboard(live, 100, 30))
    assert "failed 1  cancelled 2" not in buf.getvalue()  # words, not a second format
    assert "1 failed  2 cancelled by the stop" in buf.getvalue()
