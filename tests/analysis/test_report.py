from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent_replay.analysis.fixtures import rows_to_table, synthetic_batches, write_results
from agent_replay.analysis.render import to_csv, to_json, to_markdown, to_text
from agent_replay.analysis.report import build_report, parse_slo
from agent_replay.analysis.runstats import Accumulator, Prices, Slo, economics
from agent_replay.replay.cli import main
from tests.analysis.rows import ALL_ROWS


def _stats(**kw):  # type: ignore[no-untyped-def]
    acc = Accumulator()
    acc.add(rows_to_table(ALL_ROWS))
    return acc.finish(**kw)


def test_run_stats_on_hand_computed_rows() -> None:
    st = _stats(slo=Slo(ttft_ns=100, tpot_ns=20, e2e_ns=200))
    assert st.requests == {
        "total": 6,
        "counted": 5,
        "ok": 4,
        "failed": 1,
        "cancelled": 0,
        "warmup": 1,
    }
    assert st.errors == {"http": 1}
    assert st.latency["ttft"].count == 3 and st.latency["ttft"].values[50.0] == 100
    assert st.latency["tpot"].count == 1 and st.latency["tpot"].values[50.0] == 18
    assert st.latency["e2e"].count == 4 and st.latency["e2e"].max == 210
    assert st.latency["schedule_lag"].count == 5 and st.latency["schedule_lag"].max == 10
    assert st.latency["itl"].count == 5 and st.latency["chunk_gap"].count == 2
    assert st.tps.count == 1 and st.tps.values[90.0] == pytest.approx(1e9 / 18)
    assert st.duration_ns == 850  # first intended send 100 .. last byte 950
    assert st.tokens == {"output": 11, "input": 360, "input_cached": 140, "input_computed": 220}
    assert st.tokens_per_chunk == {1: 2, 2: 1, 3: 1, 4: 1}
    f = st.fidelity
    # the failed D counts on both sides: 60 prompt and 5 output tokens in the trace, none served
    assert (f["prompt_tokens_served"], f["prompt_tokens_trace"], f["prompt_mismatches"]) == (
        360,
        420,
        0,
    )
    assert (f["output_tokens_served"], f["output_tokens_trace"], f["output_mismatches"]) == (
        11,
        23,
        2,
    )
    assert f["prefix_hit_rate_server"] == pytest.approx(140 / 360)
    assert f["prefix_hit_rate_implied"] == pytest.approx(150 / 360)
    assert f["think_time_error"].count == 1 and f["think_time_error"].max == 0
    # goodput: A misses e2e (210 > 200), B and C are good, E has no first token.
    g = st.goodput
    assert g is not None
    assert (g["good_requests"], g["attempted_requests"]) == (2, 5)
    assert g["output_tokens_per_s"] == pytest.approx(5 / 850e-9)
    s = {r["session_id"]: r for r in st.sessions.to_pylist()}
    assert s["a"]["session_tps"] == pytest.approx(5e9 / 90)
    assert (s["a"]["wall_ns"], s["a"]["wait_ns"], s["a"]["think_ns"]) == (410, 330, 80)
    assert (s["b"]["requests_ok"], s["b"]["requests_failed"], s["b"]["wall_ns"]) == (1, 1, 105)
    assert s["b"]["session_tps"] is None or s["b"]["session_tps"] != s["b"]["session_tps"]


def test_definitions_table_entries_on_hand_computed_rows() -> None:
    from agent_replay.analysis.definitions import speeds

    st = _stats()
    # time to second token: A's second token comes in its second chunk (260 - 110 = 150); B
    # has one token; C's first chunk carries 4 (700 - 605 = 95); E has none
    ttst = st.latency["ttst"]
    assert (ttst.count, ttst.values[50.0], ttst.max) == (2, 95, 150)
    # E2E per output token: A 210/6 = 35, B 110/1, C 100/4 = 25; E has N = 0. Linear P90
    # (AgentX's North Star): k = (3 - 1) x 0.9 = 1.8 -> 35 + 0.8 x (110 - 35) = 95; the
    # nearest rank would give 110
    ept = st.latency["e2e_per_token"]
    assert (ept.count, ept.values[90.0]) == (3, pytest.approx(95))
    # AgentX ITL (E2E - TTFT) / (N - 1): A (210 - 100) / 5 = 22, C (100 - 95) / 3 = 5/3;
    # B (N = 1) and E (N = 0) have none. Linear P90: 5/3 + 0.9 x (22 - 5/3)
    ax = st.latency["agentx_itl"]
    assert ax.count == 2 and ax.values[90.0] == pytest.approx(5 / 3 + 0.9 * (22 - 5 / 3))
    sp = speeds(st.latency)
    assert sp["north_star"] == pytest.approx(1e9 / 95)
    assert sp["agentx_interactivity"] == pytest.approx(1e9 / (5 / 3 + 0.9 * (22 - 5 / 3)))
    assert sp["p90_tps"] == pytest.approx(1e9 / 18) == st.tps.values[90.0]


def test_agentx_total_tokens_per_gpu_and_an_unknown_gpu_count() -> None:
    # ok rows: input 100 + 200 + 50 + 10 = 360 (cached included), output 11; first send
    # 110 (A), last end 950 (E): (360 + 11) / 840 ns / 2 GPUs
    tp = _stats(gpus=2).extra["throughput"]
    assert tp["total_tokens_per_s_per_gpu"] == pytest.approx(371 / 840e-9 / 2)
    assert _stats().extra["throughput"]["total_tokens_per_s_per_gpu"] is None


def test_linear_and_nearest_rank_percentiles_differ_as_defined() -> None:
    from agent_replay.analysis.hist import percentile_summary

    v = np.array([10.0, 20.0, 30.0, 40.0])
    # nearest rank: ceil(0.9 x 4) = 4th = 40; linear: k = 3 x 0.9 = 2.7 -> 30 + 0.7 x 10 = 37
    assert percentile_summary(v, (90.0,)).values[90.0] == 40
    assert percentile_summary(v, (90.0,), method="linear").values[90.0] == pytest.approx(37)
    assert percentile_summary(v, (50.0,), method="linear").values[50.0] == pytest.approx(25)


def test_economics_arithmetic() -> None:
    # One hour: 1M cached, 2M computed input tokens and 0.5M output tokens per second.
    tokens = {
        "input_cached": 3_600 * 10**6,
        "input_computed": 7_200 * 10**6,
        "output": 1_800 * 10**6,
    }
    e = economics(tokens, 3_600 * 10**9, Prices(input_miss=0.27, input_hit=0.07, output=1.10), 8)
    # 1e6*3600*0.07/1e6 = 252; 2e6*3600*0.27/1e6 = 1944; 0.5e6*3600*1.10/1e6 = 1980
    assert e["usd_per_hour"] == pytest.approx(
        {"input_hit": 252.0, "input_miss": 1944.0, "output": 1980.0}
    )
    assert e["usd_per_gpu_hour"] == pytest.approx(4176.0 / 8)
    assert e["arithmetic"][-1].endswith("= $522.00 per GPU-hour")


def test_parse_slo() -> None:
    assert parse_slo("ttft=2s,tpot=50ms,e2e=300") == Slo(2e9, 50e6, 300e6)
    assert parse_slo(None) is None
    for bad in ("ttft", "foo=1", "ttft=abc", "tpot=-1ms"):
        with pytest.raises(Exception, match="--slo"):
            parse_slo(bad)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return write_results(
        tmp_path / "res",
        synthetic_batches(3000, 7, batch_rows=1000, failed_fraction=0.05, warmup_fraction=0.01),
        {"load_generator_bottleneck": True, "load_generator_warning": "CPU 98%"},
    )


def test_report_renders_every_section(results: Path) -> None:
    r = build_report(
        results, slo=parse_slo("ttft=1s,tpot=30ms"), gpus=4, prices=Prices(0.27, 0.07, 1.10)
    )
    text = to_text(r)
    first = text.splitlines()[0]
    assert first.startswith("WARNING: load generator saturated: CPU 98%") and "understate" in first
    assert sum("CPU 98%" in ln for ln in text.splitlines()) == 1
    for needle in (
        "90% of requests at least this fast",
        "median",
        "TTFT from intended",
        "ITL (per token) (hdr)",
        "request TPS",
        "Goodput",
        "per GPU-hour",
        "Replay fidelity",
        "Tokens per chunk",
        "Sessions (slowest 10 of 149",
        "failed by cause",
        "per GPU (4 GPUs)",
    ):  # s0 is all warmup
        assert needle in text, needle
    d = json.loads(to_json(r))
    assert d["requests"]["ok"] + d["requests"]["failed"] + d["requests"]["warmup"] == 3000
    assert d["headline"]["p90_tps"] == pytest.approx(r.stats.tps.values[90.0])
    assert d["latency_ms"]["tpot"]["count"] == r.stats.latency["tpot"].count
    md = to_markdown(r)
    assert md.startswith("> WARNING") and "| TPOT |" in md
    csv_text = to_csv(r)
    assert csv_text.startswith("section,name,field,value") and "latency_ms,ttft,p90," in csv_text


def test_cli_report_formats_and_errors(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(results), "--format", "json", "--gpus", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["throughput"]["gpus"] == 2
    assert main(["report", str(results), "--price-output", "1"]) == 2
    assert "all three prices" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a results folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "no request part files" in capsys.readouterr().err
    bad = tmp_path / "bad"
    (bad / "requests").mkdir(parents=True)
    (bad / "requests" / "part-00000.parquet").write_bytes(b"garbage")
    assert main(["report", str(bad)]) == 2
    assert "part-00000.parquet" in capsys.readouterr().err


def test_missing_column_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = rows_to_table(ALL_ROWS).drop_columns(["chunk_tokens"])
    root = tmp_path / "r"
    (root / "requests").mkdir(parents=True)
    import pyarrow.parquet as pq

    pq.write_table(t, root / "requests" / "part-00000.parquet")
    assert main(["report", str(root)]) == 2
    assert "missing column 'chunk_tokens'" in capsys.readouterr().err


@pytest.mark.slow
def test_plots_written_and_not_overwritten(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from agent_replay.analysis.plots import NAMES, write_plots
    from agent_replay.errors import OutputExistsError

    r = build_report(results)
    paths = write_plots(r, tmp_path / "plots")
    assert [p.name for p in paths] == list(NAMES)
    assert all(p.stat().st_size > 5_000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    with pytest.raises(OutputExistsError):
        write_plots(r, tmp_path / "plots")


def test_the_report_states_agentx_readings_and_an_unknown_gpu_count(tmp_path: Path) -> None:
    write_results(tmp_path / "r", rows_to_table(ALL_ROWS))
    text = to_text(build_report(tmp_path / "r"))
    assert "AgentX interactivity" in text and "(linear" in text and "1 / P90 of TPOT" in text
    assert "GPU count unknown (give --gpus N)" in text
    two = to_markdown(build_report(tmp_path / "r", gpus=2))
    assert f"{371 / 840e-9 / 2:,.1f}" in two


def test_report_of_several_folders_reports_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report demo-results/*`` after a second demo: each run in turn."""
    from agent_replay.analysis.fixtures import synthetic_results
    from agent_replay.replay.cli import main

    dirs = [write_results(tmp_path / f"demo-{i}", synthetic_results(50, i)) for i in (1, 2)]
    assert main(["report", *map(str, dirs)]) == 0
    out = capsys.readouterr().out
    assert out.count("agent-replay report: ") == 2 and str(dirs[0]) in out and str(dirs[1]) in out
    assert main(["report", *map(str, dirs), "--format", "json"]) == 2
    assert "take one" in capsys.readouterr().err
