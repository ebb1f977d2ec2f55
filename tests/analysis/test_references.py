"""Published reference points beside a frontier: the committed AgentX file loads, the
markdown lists every point with what it is and states the hardware difference, the plots
draw them, and a bad file is one line naming the point and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.frontier import X_AXES, Y_AXES, build
from agent_replay.analysis.references import hardware_line, load
from agent_replay.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
AGENTX = ROOT / "benchmarks" / "references" / "agentx.json"
AXES = [*X_AXES, *Y_AXES]


def _sweep(tmp: Path) -> Path:
    """Two load points of one target, two repeats each, launched on one H100."""
    sweep = tmp / "sweep"
    rows = []
    for point, base in ((1.0, 100.0), (4.0, 60.0)):
        for rep in (0, 1):
            path = f"runs/ded/c={point:g}/r{rep}"
            (sweep / path).mkdir(parents=True)
            (sweep / path / "run.json").write_text(
                json.dumps(
                    {"launch": {"gpus": ["NVIDIA H100 80GB HBM3"], "profile": "dedicated-decode"}}
                )
            )
            rows.append(
                {
                    "target": "ded",
                    "point": point,
                    "repeat": rep,
                    "status": "complete",
                    "phase": "sweep",
                    "path": path,
                    "p90_tps": base + rep,
                    "north_star": base / 2 + rep,
                    "output_tps_per_gpu": 400 / base * point,
                    "total_tps_per_gpu": 8000 / base * point,
                }
            )
    pq.write_table(pa.Table.from_pylist(rows), sweep / "index.parquet")
    (sweep / "sweep.json").write_text(
        json.dumps({"axis": "concurrent_sessions", "targets": [{"name": "ded"}]})
    )
    return sweep


def test_committed_agentx_file_records_what_each_point_is() -> None:
    ref = load(AGENTX, AXES)
    by = {p.label: p for p in ref.points}
    seed = by["seed: dedicated decode, 1 user"]
    assert seed.values == {"p90_tps": 829.0} and seed.hardware == "4x B300"
    assert seed.ratio["value"] == 1.26 and not seed.confirmed
    pr = by["InferenceX #3344 TP2 C64 chunk 4096"]
    assert pr.values == {"total_tps_per_gpu": 90885.06, "north_star": 84.42}
    assert pr.confirmed and pr.source.startswith(
        "https://github.com/SemiAnalysisAI/InferenceX/pull/3344"
    )
    assert pr.hardware == "GB300" and pr.concurrency == 64 and "SGLang" in pr.engine
    assert ref.hardware() == ["4x B300", "B300 / GB300", "GB300"]


def test_frontier_with_reference_lists_points_and_hardware_difference(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    res = build([sweep], tmp_path / "out", reference=AGENTX)
    md = res["markdown"]
    assert (
        "Hardware differs: the reference ran on 4x B300, B300 / GB300, GB300; this "
        "frontier on 1x NVIDIA H100 80GB HBM3."
    ) in md
    row = next(
        ln for ln in md.splitlines() if ln.startswith("| InferenceX #3344 TP2 C64 chunk 4096 |")
    )
    assert (
        "total tok/s per GPU 90,885.06; North Star: 1 / P90 E2E per output token (tok/s/user) 84.42"
        in row
    )
    assert "| GB300 (2 GPUs) |" in row and "| 64 |" in row
    seed = next(ln for ln in md.splitlines() if ln.startswith("| seed: dedicated decode, 1 user |"))
    assert "dedicated-decode / standard P90 TPS at 1 user 1.26" in seed
    assert "(not confirmed against a publication)" in seed
    approx = next(ln for ln in md.splitlines() if ln.startswith("| seed: throughput per GPU |"))
    assert "total tok/s per GPU ~1,000,000" in approx
    data = json.loads((tmp_path / "out" / "frontier.json").read_text())
    assert [p["label"] for p in data["reference"]["points"]][
        2
    ] == "InferenceX #3344 TP2 C64 chunk 4096"
    # the sweep's own table is unchanged by the overlay
    plain = build([sweep], tmp_path / "plain")["markdown"]
    assert md.startswith(plain)


def test_plot_draws_reference_points_on_log_scales(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent_replay.analysis.references import draw

    ref = load(AGENTX, AXES)
    _fig, ax = plt.subplots()
    # North Star x total: the two #3344 points as stars, the 1M/GPU seed as a line
    assert draw(ax, ref, "north_star", "total_tps_per_gpu") == 3
    stars = [c.get_offsets().tolist() for c in ax.collections]
    assert stars == [[[84.42, 90885.06]], [[66.63, 142565.09]]]
    assert [ln.get_ydata()[0] for ln in ax.get_lines()] == [1000000.0]
    _fig2, ax2 = plt.subplots()
    # P90 TPS x output per GPU: only the 829 single-user seed, as a vertical line
    assert draw(ax2, ref, "p90_tps", "output_tps_per_gpu") == 1
    assert [ln.get_xdata()[0] for ln in ax2.get_lines()] == [829.0]
    plt.close("all")
    sweep = _sweep(tmp_path)
    res = build([sweep], tmp_path / "out", reference=AGENTX)
    assert (tmp_path / "out" / "frontier-north_star-total.png") in res["files"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["points"][0]["values"].update(ttft=3), "points[0]: values.ttft: not an axis"),
        (
            lambda d: d["points"][1]["values"].update(total_tps_per_gpu=-1),
            "points[1]: values.total_tps_per_gpu: expected a positive number, got -1",
        ),
        (lambda d: d["points"][2].pop("source"), "points[2]: 'source' must be a non-empty string"),
        (lambda d: d["points"][3].update(gpus=0), "points[3]: 'gpus' must be a positive integer"),
        (lambda d: d.update(points=[]), "expected an object with a non-empty 'points' list"),
    ],
)
def test_bad_reference_file_is_one_line(tmp_path: Path, edit: object, message: str) -> None:
    raw = json.loads(AGENTX.read_text())
    edit(raw)  # type: ignore[operator]
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        load(bad, AXES)
    assert str(exc.value).startswith(f"{bad}: {message}") and "\n" not in str(exc.value)


def test_frontier_cli_reference_and_bad_path(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "frontier",
            str(sweep),
            "--reference",
            str(AGENTX),
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "## Reference: Published AgentX-style reference points" in ok.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "frontier",
            str(sweep),
            "--reference",
            str(tmp_path / "none.json"),
            "-o",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"agent-replay: error: {tmp_path / 'none.json'}: cannot read "
        "the reference file (No such file or directory)"
    )
    assert not (tmp_path / "p" / "frontier.md").exists()


def test_hardware_line_without_recorded_gpus() -> None:
    ref = load(AGENTX, AXES)
    assert "this frontier on hardware not recorded in the runs' run.json" in hardware_line(ref, [])


def test_sweep_html_draws_the_reference_on_log_charts_and_lists_it(tmp_path: Path) -> None:
    pytest.importorskip("bokeh")
    from agent_replay.analysis.html import sweep_html
    from agent_replay.analysis.html_charts import frontier_chart

    sweep = _sweep(tmp_path)
    res = build([sweep], tmp_path / "out", reference=AGENTX)
    page = sweep_html([sweep], res)
    assert "frontier-north_star-reference" in page and "frontier-p90_tps-reference" in page
    assert "<h2>Reference: Published AgentX-style reference points" in page
    assert "Hardware differs: the reference ran on" in page
    chart = frontier_chart(
        res["points"], "north_star", "total_tps_per_gpu", "i", "t", reference=res["reference"]
    )
    assert type(chart.x_scale).__name__ == type(chart.y_scale).__name__ == "LogScale"
    labels = sorted(m.text for m in chart.center if type(m).__name__ == "Label")
    assert labels == [
        "InferenceX #3344 TP2 C64 chunk 4096",
        "InferenceX #3344 TP2 C64 chunk 8192 (selected)",
    ]
    spans = [m.location for m in chart.center if type(m).__name__ == "Span"]
    assert spans == [1000000.0]
    # the y range reaches the 1M line and the lowest run, with a factor of margin
    assert chart.y_range.end == pytest.approx(1.3e6)
    assert chart.y_range.start == pytest.approx(80.0 / 1.3)
    plain = frontier_chart(res["points"], "north_star", "total_tps_per_gpu", "i", "t")
    assert type(plain.y_scale).__name__ == "LinearScale"


def test_a_run_on_a_server_it_did_not_launch_names_its_hosts_gpus() -> None:
    """run.json of a replay against a server started by a script (no ``launch``): the
    frontier names the GPUs its host showed (``provenance.gpus``)."""
    from agent_replay.analysis.frontier import _gpu_counts

    run = (
        Path(__file__).resolve().parents[2]
        / "benchmarks"
        / "results"
        / "gpu"
        / "2026-12-06-h100-agentx-solo"
        / "results"
        / "runs"
        / "standard"
        / "c4"
        / "r1"
        / "run.json"
    )
    assert _gpu_counts(run) == {"1x NVIDIA H100 80GB HBM3 (the host's)"}
