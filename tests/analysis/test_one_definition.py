"""One results folder through every consumer: the run summary, the report (table, Markdown,
JSON, CSV), compare, the sweep's point figures, the live statistics and the dashboard all
show the same figure for every statistic they share (the live statistics and the dashboard
keep HdrHistograms: equal to 3 significant digits)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.compare import compare_dirs
from agent_replay.analysis.dashboard import progress_line
from agent_replay.analysis.definitions import METRICS, speeds
from agent_replay.analysis.live import PART_COLUMNS, LiveStats
from agent_replay.analysis.points import point_metrics
from agent_replay.analysis.render import to_csv, to_json, to_markdown, to_text
from agent_replay.analysis.report import build_report
from agent_replay.engines.sim import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import run
from agent_replay.replay.summary import render_summary
from tests.replay.helpers import chain_rows, write_rows

HDR = 1e-3  # HdrHistogram at 3 significant digits


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("one")
    # 40 sessions x 4 requests: 160 requests, so P90 and P99 are on firm counts
    trace = write_rows(tmp / "t.parquet", chain_rows(40, 4, output_tokens=20, think_ns=20_000_000))
    out = tmp / "res"
    with SimProcess("fast") as sim:
        summary = run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(out),
                salt=0,
                speedup=4,
                scrape_interval_s=0,
                progress=False,
            ),
            progress=None,
        )
    assert summary.ok == 160
    return out, summary


def test_every_consumer_shows_the_same_figures(folder: tuple[Path, object]) -> None:
    out, summary = folder
    rep = build_report(out)
    lat = rep.stats.latency
    sp = speeds(lat)
    p90_tps = sp["p90_tps"]
    assert p90_tps is not None and p90_tps == pytest.approx(
        1e9 / lat["tpot"].values[90.0], rel=1e-12
    )

    # report: headline, JSON, CSV, Markdown and the terminal table
    assert rep.headline["p90_tps"] == p90_tps == rep.stats.tps.values[90.0]
    d = json.loads(to_json(rep))
    assert (
        d["headline"]["p90_tps"]
        == p90_tps
        == d["speeds_tok_s"]["p90_tps"]
        == d["request_tps"]["p90"]
    )
    rows = {
        (r["section"], r["name"], r["field"]): r["value"]
        for r in csv.DictReader(io.StringIO(to_csv(rep)))
    }
    assert float(rows[("speeds_tok_s", "speeds_tok_s", "p90_tps")]) == p90_tps
    assert float(rows[("request_tps", "tps", "p90")]) == p90_tps
    for m in METRICS:
        for p in (50.0, 90.0, 99.0):
            v = lat[m.key].values[p]
            if v is None:
                continue
            assert d["latency_ms"][m.key][f"p{p:g}"] == pytest.approx(v / 1e6, rel=1e-12)
            assert float(rows[("latency_ms", m.key, f"p{p:g}")]) == pytest.approx(
                v / 1e6, rel=1e-12
            )
    head = f"{p90_tps:,.1f} tok/s"
    assert head in to_markdown(rep) and head in to_text(rep)
    fid = rep.stats.fidelity
    assert (
        float(rows[("fidelity", "fidelity", "prompt_tokens_trace")]) == fid["prompt_tokens_trace"]
    )

    # the run summary: its headline line and its schedule lag P99 (the same rank rule)
    buf = io.StringIO()
    render_summary(summary, buf)  # type: ignore[arg-type]
    assert head in buf.getvalue()
    sc = summary.self_check  # type: ignore[attr-defined]
    assert sc.schedule_lag_p99_ns == lat["schedule_lag"].values[99.0]
    assert sc.schedule_lag_p50_ns == lat["schedule_lag"].values[50.0]

    # compare and the sweep's point figures
    c = compare_dirs([out, out], resamples=50)
    nums = c.side_by_side[0]
    assert nums["P90 TPS (tok/s)"] == p90_tps and nums["North Star (tok/s)"] == sp["north_star"]
    assert nums["TTFT P99 (ms)"] == lat["ttft"].values[99.0] / 1e6
    pt = point_metrics(rep, gpus=1)
    assert pt["p90_tps"] == p90_tps and pt["north_star"] == sp["north_star"]
    assert (
        pt["ttft_p99_ms"] == nums["TTFT P99 (ms)"]
        and pt["schedule_lag_p99_ms"] == sc.schedule_lag_p99_ns / 1e6
    )

    # live statistics from the part files, and the dashboard's line from them
    live = LiveStats()
    for f in sorted((out / "requests").glob("*.parquet")):
        live.observe_table(pq.read_table(f, columns=list(PART_COLUMNS)))
    live.flush()
    for name in ("ttft", "tpot", "e2e", "schedule_lag"):
        h = live.hists[name]
        assert h.count == lat[name].count, name
        for p in (50.0, 90.0, 99.0):
            got, want = h.percentiles([p])[p], lat[name].values[p]
            assert got == pytest.approx(want, rel=HDR, abs=1), (name, p)
    live_tps = 1e9 / live.hists["tpot"].percentiles([90.0])[90.0]
    assert live_tps == pytest.approx(p90_tps, rel=HDR)
    assert f"P90 TPS {live_tps:,.1f} tok/s" in progress_line(live, 160)
