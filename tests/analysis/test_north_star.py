"""InferenceX AgentX's North Star, 1 / P90 of E2E / N, pinned on hand-computed rows: its E2E
counts from the send with a new connection's connect time inside (as AIPerf's does), it
leads an AgentX run's headline in the report and the HTML page with AgentX interactivity
and our P90 TPS beside it, and it is a frontier axis; every output reads the one
definition (``analysis.definitions``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_replay.analysis import html as html_mod
from agent_replay.analysis.definitions import FIGURES_BY_KEY, speeds
from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.frontier import X_AXES
from agent_replay.analysis.render import to_json, to_text
from agent_replay.analysis.report import build_report

# (sent s0, connect, first token, end, chunk times, chunk tokens)
#   A: s = 20, N = 10: E2E from s0 420 -> 42/token; TTFT 100, (400 - 100) / 9 = 33.33; TPOT 300/9
#   B: kept-alive (no connect), N = 5: 300 / 5 = 60; (300 - 100) / 4 = 50; TPOT 200/4 = 50
#   C: s = 2100, N = 4: E2E from s0 600 -> 150; (500 - 200) / 3 = 100; TPOT 300/2 = 150
#   D: kept-alive, N = 3: 90 / 3 = 30; (90 - 60) / 2 = 15; TPOT 30/2 = 15
ROWS = [
    (0, 20, 120, 420, [120, 270, 420], [1, 4, 5]),
    (1000, None, 1100, 1300, [1100, 1300], [1, 4]),
    (2000, 100, 2300, 2600, [2300, 2600], [2, 2]),
    (3000, None, 3060, 3090, [3060, 3090], [1, 2]),
]
# North Star: per token 30, 42, 60, 150; linear P90: k = 3 x 0.9 = 2.7 -> 60 + 0.7 x 90 = 123
NORTH_STAR = 1e9 / 123
# with the connect time left out it would be 30, 40, 60, 125 -> 60 + 0.7 x 65 = 105.5
WITHOUT_CONNECT = 1e9 / 105.5
# AgentX interactivity: 15, 33.33, 50, 100 -> 50 + 0.7 x 50 = 85
INTERACTIVITY = 1e9 / 85
# our P90 TPS: TPOT 15, 33.33, 50, 150, nearest rank (ceil(0.9 x 4) = 4th) -> 150
P90_TPS = 1e9 / 150


def _rows() -> list[dict[str, Any]]:
    return [
        dict(
            session_id=f"s{i}",
            request_index=0,
            intended_ns=s0,
            sent_ns=s0,
            connect_ns=c,
            first_token_ns=f,
            end_ns=e,
            chunk_ns=cn,
            chunk_tokens=ck,
            expected_output_tokens=sum(ck),
            completion_tokens=sum(ck),
        )
        for i, (s0, c, f, e, cn, ck) in enumerate(ROWS)
    ]


@pytest.fixture
def agentx_run(tmp_path: Path) -> Path:
    return write_results(
        tmp_path / "run", rows_to_table(_rows()), {"options": {"timing": "agentx"}, "status": "ok"}
    )


def test_the_north_star_counts_from_the_send_with_connect_inside(agentx_run: Path) -> None:
    rep = build_report(agentx_run)
    sp = speeds(rep.stats.latency)
    assert sp["north_star"] == pytest.approx(NORTH_STAR) != pytest.approx(WITHOUT_CONNECT)
    assert sp["agentx_interactivity"] == pytest.approx(INTERACTIVITY)
    assert sp["p90_tps"] == pytest.approx(P90_TPS)
    h = rep.headline
    assert (h["lead"], h["north_star"], h["agentx_interactivity"], h["p90_tps"]) == (
        "north_star",
        sp["north_star"],
        sp["agentx_interactivity"],
        sp["p90_tps"],
    )
    few = "[only 4 requests: too few for P90]"
    assert h["text"] == (
        f"AgentX North Star {NORTH_STAR:,.1f} tok/s/user {few} (1 / P90 of E2E per output "
        f"token); AgentX interactivity {INTERACTIVITY:,.1f} tok/s/user {few}; our P90 TPS "
        f"{P90_TPS:,.1f} tok/s/user {few}"
    )


def test_every_output_shows_the_one_north_star(agentx_run: Path, tmp_path: Path) -> None:
    rep = build_report(agentx_run)
    text = to_text(rep, width=400)
    assert f"AgentX North Star {NORTH_STAR:,.1f} tok/s/user" in text
    assert "North Star: InferenceX AgentX North Star: 1 / P90 of E2E per output token" in text
    d = json.loads(to_json(rep))
    assert d["speeds_tok_s"]["north_star"] == pytest.approx(NORTH_STAR)
    assert d["headline"]["north_star"] == pytest.approx(NORTH_STAR)
    if html_mod.available():  # the html extra (Bokeh)
        page = html_mod.report_html(rep)
        assert f'<p class="headline">AgentX North Star {NORTH_STAR:,.1f} tok/s/user' in page
    # a frontier axis and a compared figure, beside AgentX interactivity and our P90 TPS
    assert {"north_star", "agentx_interactivity", "p90_tps"} <= set(X_AXES)
    assert FIGURES_BY_KEY["north_star"].compare and FIGURES_BY_KEY["north_star"].tested


def test_a_run_of_other_timing_keeps_the_p90_tps_headline(tmp_path: Path) -> None:
    rep = build_report(
        write_results(tmp_path / "r", rows_to_table(_rows()), {"options": {"timing": "session"}})
    )
    assert rep.headline["text"].startswith("per-user decode speed, P90: ")
    assert "lead" not in rep.headline
