"""Rows with inexact tokens per chunk (error_kind "inexact": the server sent neither token ids
nor continuous usage): they count in TTFT, E2E, chunk gap and throughput, never in ITL, TPOT,
TPS or tokens per chunk. Pinned on hand-computed rows, in the report, the live stats, the
dashboard and compare."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from agent_replay.analysis.compare import compare_dirs, render_compare
from agent_replay.analysis.compare import to_json as compare_json
from agent_replay.analysis.dashboard import progress_line, render_dashboard
from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.fold import fold_chunks
from agent_replay.analysis.hist import Hist
from agent_replay.analysis.live import LiveStats
from agent_replay.analysis.metrics import exact_rows, lists
from agent_replay.analysis.render import to_csv, to_json, to_markdown, to_text
from agent_replay.analysis.report import build_report
from agent_replay.analysis.runstats import Accumulator, Slo

# X1 (exact): s=0, chunks 100/130/190 with 1/1/2 tokens, e=200. TTFT 100, E2E 200,
#    decode 90, N - k_1 = 3, TPOT 30; ITL 30 x1, 60/2=30 x2; chunk gaps 30, 60.
X1: dict[str, Any] = dict(
    session_id="x",
    request_index=0,
    intended_ns=0,
    sent_ns=0,
    first_token_ns=100,
    end_ns=200,
    chunk_ns=[100, 130, 190],
    chunk_tokens=[1, 1, 2],
    expected_input_tokens=10,
    expected_output_tokens=4,
    prompt_tokens=10,
    completion_tokens=4,
)
# X2 (exact): s=1000, chunks 1050/1070 with 1/1, e=1080. TTFT 50, E2E 80, TPOT 20, ITL 20 x1.
X2: dict[str, Any] = dict(
    session_id="m",
    request_index=0,
    intended_ns=1000,
    sent_ns=1000,
    first_token_ns=1050,
    end_ns=1080,
    chunk_ns=[1050, 1070],
    chunk_tokens=[1, 1],
    expected_input_tokens=10,
    expected_output_tokens=2,
    prompt_tokens=10,
    completion_tokens=2,
)
# I1 (inexact, usage 9): s=2010, three content events at 2110/2150/2250, e=2300. TTFT 100,
#    E2E 290, chunk gaps 40, 100. Counted as exact it would add TPOT 140/2 = 70 and ITLs.
I1: dict[str, Any] = dict(
    session_id="m",
    request_index=1,
    parent_index=0,
    intended_ns=2000,
    sent_ns=2010,
    first_token_ns=2110,
    end_ns=2300,
    chunk_ns=[2110, 2150, 2250],
    chunk_tokens=[1, 1, 1],
    expected_input_tokens=10,
    expected_output_tokens=9,
    prompt_tokens=10,
    completion_tokens=9,
    error_kind="inexact",
    error="tokens per chunk not exact",
)
# I2 (inexact, no usage at all): s=3000, events at 3020/3030, e=3040. TTFT 20, E2E 40,
#    chunk gap 10; output length unknown (2 events: a lower bound), trace says 5.
I2: dict[str, Any] = dict(
    session_id="y",
    request_index=0,
    intended_ns=3000,
    sent_ns=3000,
    first_token_ns=3020,
    end_ns=3040,
    chunk_ns=[3020, 3030],
    chunk_tokens=[1, 1],
    expected_input_tokens=10,
    expected_output_tokens=5,
    error_kind="inexact",
    error="tokens per chunk not exact",
)
MIXED = [X1, X2, I1, I2]


def _stats(rows: list[dict[str, Any]], **kw: Any):  # type: ignore[no-untyped-def]
    acc = Accumulator()
    acc.add(rows_to_table(rows))
    return acc.finish(**kw)


def test_exact_rows() -> None:
    assert exact_rows(rows_to_table(MIXED)).tolist() == [True, True, False, False]


def test_mixed_rows_per_token_metrics_from_exact_rows_only() -> None:
    st = _stats(MIXED, slo=Slo(tpot_ns=25))
    assert st.requests["ok"] == 4 and st.requests["failed"] == 0
    assert st.inexact == {"requests": 2, "without_usage": 1}
    # times: every ok row
    assert st.latency["ttft"].count == 4 and st.latency["ttft"].max == 100
    assert st.latency["ttft"].values[50.0] == 50  # sorted 20, 50, 100, 100: rank 2
    assert st.latency["e2e"].count == 4 and st.latency["e2e"].max == 290
    assert st.latency["chunk_gap"].count == 6 and st.latency["chunk_gap"].max == 100
    # per token: X1 and X2 only
    assert st.latency["tpot"].count == 2 and st.latency["tpot"].values[50.0] == 20
    assert st.latency["tpot"].max == 30
    assert st.latency["itl"].count == 4 and st.latency["itl"].max == 30
    assert st.latency["itl"].values[50.0] == 30
    assert st.tps.count == 2 and st.tps.values[90.0] == pytest.approx(1e9 / 30)
    assert st.tokens_per_chunk == {1: 4, 2: 1}
    # throughput from the usage (I1: 9), I2's two events as a lower bound
    assert st.tokens["output"] == 4 + 2 + 9 + 2
    f = st.fidelity
    assert (f["output_tokens_served"], f["output_tokens_trace"], f["output_mismatches"]) == (
        15,
        15,
        0,
    )
    # session m = X2 + I1: session TPS from X2 alone (1 token in 20 ns); y has none
    s = {r["session_id"]: r for r in st.sessions.to_pylist()}
    assert s["m"]["session_tps"] == pytest.approx(1e9 / 20) and s["m"]["requests_ok"] == 2
    assert s["x"]["session_tps"] == pytest.approx(3e9 / 90)
    assert s["y"]["session_tps"] is None or np.isnan(s["y"]["session_tps"])
    # goodput with a TPOT objective: X1 misses (30 > 25), X2 meets, I1/I2 unknown
    g = st.goodput
    assert g is not None and (g["good_requests"], g["tpot_unknown"]) == (1, 2)
    # without a TPOT objective the inexact rows are judged on what is exact
    g = _stats(MIXED, slo=Slo(ttft_ns=100)).goodput
    assert g is not None and (g["good_requests"], g["tpot_unknown"]) == (4, 0)


def test_same_rows_all_exact_differ() -> None:
    """The exclusion matters: counted as exact, I1 would move TPOT, ITL and tokens per chunk."""
    exact = [dict(r, error_kind=None, error=None) for r in MIXED]
    st = _stats(exact)
    assert st.inexact["requests"] == 0
    assert st.latency["tpot"].count == 4 and st.latency["tpot"].max == 70


def test_fold_chunks_exact_mask() -> None:
    t = rows_to_table(MIXED)
    c, k = lists(t, "chunk_ns"), lists(t, "chunk_tokens")
    itl, gap = Hist(), Hist()
    tpc = fold_chunks(c, k, None, itl, gap, exact=exact_rows(t))
    assert gap.count == 6 and itl.count == 4 and tpc.tolist() == [0, 4, 1]
    # rows and exact together: X1 not selected, I1 selected but inexact
    itl, gap = Hist(), Hist()
    tpc = fold_chunks(c, k, np.array([False, True, True, False]), itl, gap, exact=exact_rows(t))
    assert gap.count == 3 and itl.count == 1 and tpc.tolist() == [0, 2]
    # a block size that splits the rows gives the same
    itl2, gap2 = Hist(), Hist()
    tpc2 = fold_chunks(c, k, None, itl2, gap2, block=2, exact=exact_rows(t))
    assert (gap2.count, itl2.count, tpc2.tolist()) == (6, 4, [0, 4, 1])


def test_report_all_inexact_shows_times_and_says_why(tmp_path: Path) -> None:
    rows = [dict(I1, session_id=f"s{i}", request_index=0, parent_index=-1) for i in range(3)]
    d = write_results(tmp_path / "r", rows_to_table(rows))
    r = build_report(d)
    st = r.stats
    assert st.latency["ttft"].count == 3 and st.latency["e2e"].count == 3
    assert st.latency["chunk_gap"].count == 6
    assert st.latency["tpot"].count == 0 and st.latency["itl"].count == 0 and st.tps.count == 0
    assert st.tokens_per_chunk == {}
    assert (
        r.headline["p90_tps"] is None
        and "3 requests had inexact token counts" in r.headline["text"]
    )
    warn = [w for w in r.warnings if "inexact" in w]
    assert len(warn) == 1 and "3 of 3 successful requests" in warn[0]
    assert "ITL, TPOT, request TPS" in warn[0] and "TTFT, E2E, chunk gap" in warn[0]
    j = json.loads(to_json(r))
    assert j["inexact_token_counts"]["requests"] == 3
    assert "TPOT" in j["inexact_token_counts"]["left_out_of"]
    assert j["latency_ms"]["tpot"]["count"] == 0 and j["latency_ms"]["ttft"]["count"] == 3
    assert j["latency_ms"]["ttft"]["max"] == pytest.approx(100 / 1e6)
    for text in (to_text(r), to_markdown(r)):
        assert "inexact token counts" in text and "left out of" in text
    assert "inexact_token_counts,inexact_token_counts,requests,3" in to_csv(r)


def test_report_mixed_headline_names_what_it_leaves_out(tmp_path: Path) -> None:
    r = build_report(write_results(tmp_path / "r", rows_to_table(MIXED)))
    assert r.headline["p90_tps"] == pytest.approx(1e9 / 30)
    assert "leaves out 2 requests with inexact token counts" in r.headline["text"]
    assert any(
        "2 of 4 successful requests" in w and "1 of them sent no usage" in w for w in r.warnings
    )


def test_exact_run_has_no_inexact_lines(tmp_path: Path) -> None:
    r = build_report(write_results(tmp_path / "r", rows_to_table([X1, X2])))
    assert not any("inexact" in w for w in r.warnings) and "leaves out" not in r.headline["text"]
    assert "inexact token counts" not in to_text(r)


def test_compare_with_a_side_without_per_token_metrics(tmp_path: Path) -> None:
    a = write_results(tmp_path / "a", rows_to_table([X1, X2]))
    rows = [dict(I1, session_id=f"s{i}", request_index=0, parent_index=-1) for i in range(3)]
    b = write_results(tmp_path / "b", rows_to_table(rows))
    for dirs in ([a, b], [b, a], [b, b]):
        c = compare_dirs(dirs, seed=1)
        ds = {d.key: d for d in c.deltas[0]}
        assert ds["p90_tps"].change is None and ds["median_tps"].change is None
        assert ds["ttft_p50"].change is not None
        assert any("inexact" in w for w in c.warnings)
        Console(file=io.StringIO(), width=120).print(render_compare(c))
        json.loads(compare_json(c))


def test_live_stats_and_dashboard() -> None:
    st = LiveStats()
    for row in rows_to_table(MIXED).to_pylist():
        st.observe_request(row)
    st.flush()
    assert (st.ok, st.failed, st.inexact) == (4, 0, 2)
    assert st.hists["ttft"].count == 4 and st.hists["e2e"].count == 4
    assert st.hists["chunk_gap"].count == 6 and st.hists["chunk_gap"].max == 100
    assert st.hists["tpot"].count == 2 and st.hists["tpot"].max == 30
    assert st.hists["itl"].count == 4
    assert st.tokens_per_chunk == {1: 4, 2: 1}
    assert st.output_tokens == 4 + 2 + 9 + 2  # I1 from its usage
    back = LiveStats.decode(st.encode())
    assert back.inexact == 2
    back.merge(LiveStats.decode(st.encode()))
    assert back.inexact == 4 and back.hists["tpot"].count == 4
    buf = io.StringIO()
    Console(file=buf, width=100).print(render_dashboard(st, 100, 30, total_requests=4))
    assert "inexact token counts: 2 ok requests" in buf.getvalue()
    assert "2 inexact token counts" in progress_line(st, 4)
    exact = LiveStats()
    exact.observe_request(rows_to_table([X1]).to_pylist()[0])
    buf = io.StringIO()
    Console(file=buf, width=100).print(render_dashboard(exact, 100, 30, total_requests=1))
    assert "inexact" not in buf.getvalue() and "inexact" not in progress_line(exact, 1)
