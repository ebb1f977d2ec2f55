"""The HTML report: the same figures as the terminal report, drawn from the same values, in
one self-contained file; and, in headless Chromium, every chart rendered with data and no
console error (the screenshots are kept in the test's folder, or in
``$AGENT_REPLAY_SCREENSHOTS`` when set)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.definitions import CDF_KEYS
from agent_replay.analysis.fixtures import synthetic_results, write_results
from agent_replay.analysis.report import Report, build_report
from agent_replay.analysis.timeseries import lanes
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA

pytest.importorskip("bokeh", reason="the html extra (Bokeh) is not installed")

from agent_replay.analysis import cdf
from agent_replay.analysis import html as html_mod
from agent_replay.analysis import html_charts as hc
from tests.browser import chromium_path, load

S = 1_000_000_000


def _gpu_samples(t0: int, t1: int) -> pa.Table:
    ts = np.arange(t0, t1, S // 2)
    rows = [
        {
            "t_ns": int(t),
            "gpu": g,
            "uuid": f"GPU-{g}",
            "gpu_util_pct": 40.0 + 10 * g,
            "sm_active_pct": 30.0 + 10 * g,
            "power_w": 300.0 + 50 * g + (i % 5),
            "energy_mj": int(1e9 + i * 150_000),
            "mem_used_bytes": 1 << 30,
            "temp_c": 50.0,
        }
        for i, t in enumerate(ts)
        for g in (0, 1)
    ]
    return pa.table(
        {f.name: [r.get(f.name) for r in rows] for f in GPU_TELEMETRY_SCHEMA},
        schema=GPU_TELEMETRY_SCHEMA,
    )


def make_results(root: Path, *, seed: int = 3, tpot_scale: float = 1.0, gpu: bool = True) -> Path:
    """300 requests in 30 sessions; session s1 replayed as clone 1 too, s2 with a subagent;
    5% failed, two of them cancelled; two GPUs sampled beside it."""
    t = synthetic_results(300, seed, tpot_scale, requests_per_session=10, failed_fraction=0.05)
    sid = t.column("session_id").to_pylist()
    clone = [1 if s == "s1" and i % 2 else 0 for i, s in enumerate(sid)]
    agent = [("sub-1" if i % 3 == 0 else "main") if s == "s2" else None for i, s in enumerate(sid)]
    kinds = t.column("error_kind").to_pylist()
    failed_rows = [i for i, k in enumerate(kinds) if k is not None][:2]
    for i in failed_rows:
        kinds[i] = "cancelled"
    t = t.set_column(t.schema.get_field_index("clone"), "clone", pa.array(clone, pa.int32()))
    t = t.set_column(t.schema.get_field_index("agent_id"), "agent_id", pa.array(agent, pa.string()))
    t = t.set_column(
        t.schema.get_field_index("error_kind"), "error_kind", pa.array(kinds, pa.string())
    )
    meta = {"options": {"timing": "session"}, "status": "ok", "gpus": 2}
    if gpu:
        meta["gpu_telemetry"] = {
            "enabled": True,
            "source": "NVML",
            "gpus": [
                {"index": 0, "uuid": "GPU-0", "name": "H200"},
                {"index": 1, "uuid": "GPU-1", "name": "H200"},
            ],
        }
    root = write_results(root, t, meta)
    if gpu:
        lo = int(pc.min(t.column("intended_ns")).as_py())
        hi = int(pc.max(t.column("end_ns")).as_py())
        pq.write_table(_gpu_samples(lo - S, hi + S), root / "gpu_telemetry.parquet")
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return build_report(make_results(tmp_path_factory.mktemp("html") / "run"))


@pytest.mark.parametrize("key", CDF_KEYS)
def test_each_cdf_crosses_p50_p90_p99_at_the_tables_values(report: Report, key: str) -> None:
    """The CDF is drawn from the values the table's percentiles come from: the smallest
    value whose fraction reaches p% is the table's P-th percentile (ITL: the same
    HdrHistogram, so the same bucket value)."""
    ms, frac = cdf.cdf_points(report, key)
    s = report.stats.latency[key]
    assert ms.size and np.all(np.diff(frac) >= 0) and frac[-1] == pytest.approx(1.0)
    for p in (50.0, 90.0, 99.0):
        crossing = ms[np.searchsorted(frac, p / 100 - 1e-12)]
        assert crossing == pytest.approx(s.values[p] / 1e6, rel=1e-9), (key, p)


def test_a_thinned_cdf_keeps_the_percentiles_crossings(tmp_path: Path) -> None:
    """Over CDF_POINTS values the line is thinned; its P50/P90/P99 crossings are kept."""
    rep = build_report(write_results(tmp_path / "big", synthetic_results(5_003, 9)))
    for key in ("ttft", "e2e"):
        ms, frac = cdf.cdf_points(rep, key)
        assert ms.size <= cdf.CDF_POINTS + len(cdf.MARKED)
        for p in cdf.MARKED:
            crossing = ms[np.searchsorted(frac, p / 100 - 1e-12)]
            assert crossing == pytest.approx(rep.stats.latency[key].values[p] / 1e6, rel=1e-9)


def test_clones_and_subagents_get_lanes_of_their_own(report: Report) -> None:
    labels, lane = lanes(report.stats.per_request)
    assert "s1 #0" in labels and "s1 #1" in labels  # clones are not merged under one label
    assert "s2 #0 / main" in labels and "s2 #0 / sub-1" in labels
    assert len(labels) == 30 + 1 + 1  # 30 sessions, s1's clone, s2's subagent
    assert lane.min() == 0 and lane.max() == len(labels) - 1


def test_page_has_the_terminal_reports_figures_and_needs_no_network(report: Report) -> None:
    from agent_replay.analysis.render import _latency_rows, report_dict

    page = html_mod.report_html(report)
    assert report.headline["text"] in page.replace("&#x27;", "'")
    for row in _latency_rows(report_dict(report)):  # every latency row, cell for cell
        assert "".join(f"<td>{c}</td>" for c in row) in page.replace("&#x27;", "'")
    # self-contained: no script, style or image fetched from anywhere
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']?(https?:)?//""", page)
    assert "Bokeh" in page and len(page) > 500_000  # the library itself, inlined


def test_run_without_the_extra_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_results(tmp_path / "run", gpu=False)
    monkeypatch.setattr(html_mod, "available", lambda: False)
    path, line = html_mod.write_run_report(root)
    assert path is None and "pip install 'agent-replay[html]'" in line
    assert not (root / "report.html").exists()
    monkeypatch.undo()
    path, line = html_mod.write_run_report(root)
    assert path == root / "report.html" and path.stat().st_size > 500_000
    assert line == f"HTML report: {path}"


# The check run in the page: for every chart, Bokeh's view finished rendering, every glyph
# has data, and the chart's own pixels (legends hidden first) hold enough colour to be marks.
CHECK = r"""
(async () => {
  if (!window.Bokeh || !Bokeh.documents || !Bokeh.documents.length) return null;
  const doc = Bokeh.documents[0];
  const out = [];
  for (const el of document.querySelectorAll('[data-chart]')) {
    const rid = el.querySelector('[data-root-id]').dataset.rootId;
    const view = Bokeh.index[rid];
    if (!view || !view.has_finished()) return null;
    const model = doc.get_model_by_id(rid);
    const rows = model.renderers.filter(r => r.data_source).map(r => r.data_source.get_length());
    const legends = [...model.center, ...model.below].filter(item => item.type === 'Legend');
    for (const item of legends) item.visible = false;
    await new Promise(r => setTimeout(r, 50));
    const c = view.export('png').canvas;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let coloured = 0;
    for (let i = 0; i < d.length; i += 4) {
      const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
      if (d[i + 3] > 0 && hi - lo > 60) coloured++;
    }
    for (const item of legends) item.visible = true;
    const xr = model.x_range, xaxis = model.below.find(a => a.type && a.type.endsWith('Axis'));
    const ticks = xaxis && xaxis.ticker.ticks ? xaxis.ticker.ticks : null;
    out.push({chart: el.dataset.chart, title: model.title ? model.title.text : '',
              rows, coloured, width: c.width, height: c.height,
              legends_inside: model.center.filter(item => item.type === 'Legend').length,
              x_type: xaxis ? xaxis.type : null, ticks, x_start: xr.start, x_end: xr.end,
              markers: model.renderers.filter(r => r.glyph && r.glyph.marker)
                .map(r => [r.glyph.marker.value || r.glyph.marker, r.glyph.fill_alpha.value ?? r.glyph.fill_alpha])});
  }
  return out;
})()
"""


def _check_in_chromium(page_path: Path, shot: Path, expected: set[str]) -> list[dict[str, object]]:
    page = asyncio.run(load(page_path, check=CHECK, screenshot=str(shot)))
    assert page.errors == []
    charts = page.result
    assert charts, "the charts did not finish rendering"
    assert {c["chart"] for c in charts} == expected
    for c in charts:
        assert c["title"], c
        assert c["rows"] and min(c["rows"]) > 0, c  # every glyph has data
        assert c["coloured"] > 200, c  # marks were painted (a blank chart has 0)
        if str(c["chart"]).startswith("cdf-"):
            assert c["legends_inside"] == 0, c  # below the plot: it covers no curve
            assert c["x_type"] == "LogAxis", c
            shown = sorted(t for t in c["ticks"] if c["x_start"] <= t <= c["x_end"])
            # a tick label at least every factor 2.5 over the drawn range, none of it bare
            assert len(shown) >= 3 and shown[0] <= c["x_start"] * 2.5, c
            assert all(b / a <= 2.5 for a, b in itertools.pairwise(shown)), c
            assert c["x_end"] / shown[-1] <= 2.5, c
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("AGENT_REPLAY_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return charts


needs_chromium = pytest.mark.skipif(
    chromium_path() is None, reason="no chromium (apt-get install chromium; scripts/test.sh does)"
)


@pytest.mark.slow
@needs_chromium
def test_report_renders_every_chart_in_chromium(report: Report, tmp_path: Path) -> None:
    path = html_mod.write_html(html_mod.report_html(report), tmp_path / "report.html")
    _check_in_chromium(
        path,
        tmp_path / "report.png",
        {
            "cdf-ttft",
            "cdf-tpot",
            "cdf-itl",
            "cdf-e2e",
            "tps",
            "throughput",
            "in-flight",
            "timelines",
            "gpu-power",
            "gpu-util",
        },
    )


@pytest.mark.slow
@needs_chromium
def test_compare_and_sweep_pages_render_in_chromium(tmp_path: Path) -> None:
    from agent_replay.analysis.compare import compare_dirs
    from agent_replay.analysis.frontier import points, to_markdown

    a = make_results(tmp_path / "a", seed=3, gpu=False)
    b = make_results(tmp_path / "b", seed=4, tpot_scale=1.3, gpu=False)
    result = compare_dirs([a, b], resamples=200)
    page = html_mod.compare_html(result, [("a", build_report(a)), ("b", build_report(b))])
    path = html_mod.write_html(page, tmp_path / "compare.html")
    _check_in_chromium(path, tmp_path / "compare.png", {f"cdf-{k}" for k in CDF_KEYS})

    rows = []
    for target, speed in (("standard", 1.0), ("mtp", 0.8)):
        for point in (2, 8, 32):
            for rep in range(3):
                v = speed * (400 / (1 + point / 8)) * (1 + 0.05 * (rep - 1))
                rows.append(
                    {
                        "target": target,
                        "point": float(point),
                        "repeat": rep,
                        "status": "complete",
                        "p90_tps": v,
                        "north_star": 0.8 * v,
                        "agentx_interactivity": 0.9 * v,
                        "output_tps_per_gpu": point * v / 2,
                        "total_tps_per_gpu": point * v,
                        "ttft_p99_ms": 50.0 * point,
                        "warmup_steady": not (point == 2 and rep == 0),
                        "machine_contention": target == "mtp" and point == 32 and rep == 1,
                    }
                )
    pts = points(rows)
    res = {"points": pts, "markdown": to_markdown(pts, "concurrent_sessions")}
    page = html_mod.sweep_html([tmp_path], res)
    # before: the flag sat in a clipped table column; now the page opens with it
    assert '<div class="warn strong">WARNING: host contention in 1 of 18 runs (mtp 32 r1)' in page
    assert "hollow triangles in the plots" in page
    path = html_mod.write_html(page, tmp_path / "sweep.html")
    charts = _check_in_chromium(
        path,
        tmp_path / "sweep.png",
        {"frontier-p90_tps", "frontier-north_star", "frontier-agentx_interactivity"},
    )
    for c in charts:  # the promised hollow triangles: the two unsteady runs (one per target)
        assert ["triangle", 0] in c["markers"], c["markers"]


def test_each_sweep_run_gets_its_page(tmp_path: Path) -> None:
    """The sweep's hook writes report.html into a run's folder once the run is done."""
    hook = html_mod.RunReportHook()
    run_dir = make_results(tmp_path / "runs" / "a" / "r0", gpu=False)
    hook.start(run_dir, None, "http://127.0.0.1:1")
    assert not (run_dir / "report.html").exists()
    hook.stop()
    assert (run_dir / "report.html").stat().st_size > 500_000
    empty = tmp_path / "runs" / "a" / "r1"  # a run that never started: nothing to report
    empty.mkdir(parents=True)
    hook.start(empty, None, "http://127.0.0.1:1")
    hook.stop()
    assert not (empty / "report.html").exists()


def test_an_unwritable_page_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_replay.replay.cli import main

    root = make_results(tmp_path / "run", gpu=False)
    (tmp_path / "file").write_text("")
    assert main(["report", str(root), "--html", str(tmp_path / "file" / "r.html")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the HTML report" in err


@pytest.mark.parametrize(
    ("lo", "hi"), [(0.004, 0.05), (800.0, 2400.0), (310.0, 390.0), (1.0, 1e5), (0.001, 3.0)]
)
def test_log_ticks_leave_no_stretch_of_the_range_unlabelled(lo: float, hi: float) -> None:
    """Before: 1-2-5 ticks only, so E2E values between 500 and 1000 ms (40% of a run) had
    no label; now a label at least every factor 2.5, one below and one above the range."""
    ticks = hc.log_ticks(lo, hi)
    inside = [t for t in ticks if lo <= t <= hi]
    assert len(inside) >= 3 or hi / lo < 2, ticks
    assert ticks[0] <= lo and ticks[-1] >= hi, ticks
    assert all(b / a <= 2.5 for a, b in itertools.pairwise(ticks)), ticks


def test_zero_gaps_are_said_in_the_title() -> None:
    """Tokens read in one chunk have 0 ms gaps; a log axis draws them at 0.001 ms, and the
    title says how many there are."""
    assert (
        cdf.zero_fraction(np.array([0.0, 0.0, 1.0, 2.0]), np.array([0.25, 0.5, 0.75, 1.0])) == 0.5
    )
    assert cdf.zero_fraction(np.array([1.0]), np.array([1.0])) == 0.0


def test_open_verdicts_are_not_drawn_as_conclusions(tmp_path: Path) -> None:
    """Before: "no verdict: host contention" in the green of a conclusion; now neutral."""
    from agent_replay.analysis.compare import compare_dirs

    assert html_mod.is_conclusion("B is 12% faster at P90 TPS, 95% CI 8-16%")
    assert not html_mod.is_conclusion("B vs A: P90 TPS: inconclusive (B +1.0%, ...)")
    a = make_results(tmp_path / "a", seed=3, gpu=False)
    result = compare_dirs([a, a], resamples=50)
    page = html_mod.compare_html(result, [("a", build_report(a)), ("a2", build_report(a))])
    verdicts = re.findall(r'<p class="headline([^"]*)">([^<]*)</p>', page)
    assert verdicts and all(cls == " open" for cls, _ in verdicts), verdicts  # a run vs itself
    assert "http://" in page and "<th>model</th>" in page  # runs named beyond their folders
