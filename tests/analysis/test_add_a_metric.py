"""Adding a per-request metric is one entry in ``analysis/definitions.py`` plus its formula:
a fresh interpreter loads the definitions module with one more entry (decode time, last byte
minus first token, live, drawn as a CDF, tested by compare) and nothing else changed, and
the report (terminal, Markdown, JSON, CSV), compare (side by side and its verdict table),
the sweep's point figures, the live statistics, the dashboard, the HTML report and
comparison pages and the PNG CDF plot all show it, at the value computed here by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_replay.analysis import definitions
from agent_replay.analysis.fixtures import rows_to_table, write_results

ENTRY = """    Metric(key="decode_time", label="decode time", unit="ms", per="request", rows="ok",
           live=True, higher_is_better=False, doc="e - f", formula=decode_time,
           headline=(50.0,), cdf=True, compared=(50.0,)),
"""
FORMULA = """def decode_time(x: Inputs) -> np.ndarray:
    return _f64(x.batch, "end_ns") - _f64(x.batch, "first_token_ns")


"""

PROBE = r"""
import io, json, sys, types
from pathlib import Path

import agent_replay.analysis as pkg

path = Path(pkg.__file__).parent / "definitions.py"
src = path.read_text()
anchor = "METRICS: tuple[Metric, ...] = (\n"
assert src.count(anchor) == 1
src = src.replace(anchor, sys.argv[2] + anchor + sys.argv[3])
mod = types.ModuleType("agent_replay.analysis.definitions")
mod.__file__ = str(path)
sys.modules[mod.__name__] = mod
exec(compile(src, str(path), "exec"), mod.__dict__)

import pyarrow.parquet as pq

from agent_replay.analysis.compare import compare_dirs
from rich.console import Console

from agent_replay.analysis.dashboard import render_dashboard
from agent_replay.analysis.live import PART_COLUMNS, LiveStats
from agent_replay.analysis.points import point_metrics
from agent_replay.analysis.render import to_csv, to_json, to_markdown, to_text
from agent_replay.analysis.report import build_report

out = Path(sys.argv[1])
rep = build_report(out)
cmp = compare_dirs([out, out], resamples=20)
from agent_replay.analysis.html import compare_html, report_html

page = report_html(rep)
cmp_page = compare_html(cmp, [("a", rep), ("b", rep)])
import matplotlib.axes

drawn = []
step = matplotlib.axes.Axes.step
matplotlib.axes.Axes.step = lambda self, *a, **k: (drawn.append(k.get("label")), step(self, *a, **k))[1]
from agent_replay.analysis.plots import write_plots

write_plots(rep, out / "plots")
live = LiveStats()
for f in sorted((out / "requests").glob("*.parquet")):
    live.observe_table(pq.read_table(f, columns=list(PART_COLUMNS)))
live.flush()
buf = io.StringIO()
Console(file=buf, width=100, height=30, color_system=None).print(render_dashboard(live, 100, 30))
print(json.dumps({
    "json": json.loads(to_json(rep))["latency_ms"].get("decode_time"),
    "csv": [line for line in to_csv(rep).splitlines() if ",decode_time," in line],
    "text": "decode time" in to_text(rep), "markdown": "decode time" in to_markdown(rep),
    "compare": cmp.side_by_side[0].get("decode time P50 (ms)"),
    "verdict_rows": [[d.key, d.label, d.base] for d in cmp.deltas[0]],
    "html": 'data-chart="cdf-decode_time"' in page and "decode time CDF" in page,
    "compare_html": 'data-chart="cdf-decode_time"' in cmp_page and "median decode time" in cmp_page,
    "png": [x for x in drawn if x and x.startswith("decode time")],
    "point": point_metrics(rep, gpus=1).get("decode_time_p50_ms"),
    "live_count": live.hists["decode_time"].count,
    "live_p50": live.hists["decode_time"].percentiles([50.0])[50.0],
    "dashboard": "decode time" in buf.getvalue(),
}))
"""


def test_one_entry_reaches_every_consumer(tmp_path: Path) -> None:
    ms = 1_000_000
    # first token and last byte (ms): decode times 30, 10, 50, 20 ms; a failed request and a
    # warm-up one do not count. Nearest-rank P50 of [10, 20, 30, 50] = 20 ms.
    ok = [(100, 130), (200, 210), (300, 350), (400, 420)]
    rows = [
        {
            "sent_ns": (f - 50) * ms,
            "first_token_ns": f * ms,
            "end_ns": e * ms,
            "chunk_ns": [f * ms, e * ms],
            "chunk_tokens": [1, 4],
            "intended_ns": (f - 50) * ms,
            "session_id": f"s{i}",
        }
        for i, (f, e) in enumerate(ok)
    ]
    rows.append(
        {
            "sent_ns": 0,
            "first_token_ns": ms,
            "end_ns": 500 * ms,
            "chunk_ns": [ms],
            "chunk_tokens": [1],
            "status": "error",
            "error_kind": "http",
        }
    )
    rows.append(
        {
            "sent_ns": 0,
            "first_token_ns": ms,
            "end_ns": 900 * ms,
            "chunk_ns": [ms],
            "chunk_tokens": [1],
            "warmup": True,
        }
    )
    out = write_results(tmp_path / "res", rows_to_table(rows))
    assert "decode_time" not in definitions.BY_KEY  # the shipped table does not have it

    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), FORMULA, ENTRY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["json"]["p50"] == 20.0 and got["json"]["max"] == 50.0
    assert got["csv"] and any(line.endswith(",p50,20.0") for line in got["csv"]), got["csv"]
    assert got["text"] and got["markdown"] and got["dashboard"]
    assert got["compare"] == 20.0 and got["point"] == 20.0
    assert ["decode_time_p50", "median decode time", 20.0] in got["verdict_rows"]
    assert got["html"] and got["compare_html"]
    assert got["png"] == ["decode time (n=4 requests)"]
    assert got["live_count"] == 4 and abs(got["live_p50"] - 20 * ms) <= 20 * ms * 1e-3
