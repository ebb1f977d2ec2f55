"""The HTML report: one self-contained file (Bokeh's JavaScript inlined, no network needed to
open it) with the tables of the terminal report and interactive charts.

``report_html`` (one run), ``compare_html`` (runs side by side) and ``sweep_html`` (a sweep's
frontier) return the page as a string; ``write_html`` writes it. The tables are rendered
from the same rows as the terminal and Markdown reports (``analysis.render``,
``analysis.compare``, ``analysis.frontier``), so every figure has one definition. Bokeh is
the optional ``html`` extra: ``available()`` says whether it is installed, and
``HTML_EXTRA_HINT`` how to get it.
"""

from __future__ import annotations

import contextlib
import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent_replay import __version__
from agent_replay.analysis.definitions import CDF_KEYS
from agent_replay.analysis.report import Report
from agent_replay.errors import AgentReplayError, InputError, OutputExistsError

FILE_NAME = "report.html"
"""The report every run writes beside its run.json."""
HTML_EXTRA_HINT = "pip install 'agent-replay[html]'"
SESSIONS_SHOWN = 500

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1280px;padding:0 16px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.path{color:#666;font-family:ui-monospace,monospace;font-size:13px;margin:0 0 12px}
.headline{font-size:18px;font-weight:600;color:#1a7f37;margin:10px 0}
.headline.open{color:#444}
.warn{color:#9a6700;background:#fff8c5;padding:4px 8px;margin:4px 0;font-size:13px}
.warn.strong{color:#cf222e;background:#ffebe9;font-weight:600}
table{border-collapse:collapse;font-size:13px;margin:4px 0 8px}
th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left} th{background:#f6f8fa}
table.kv td:first-child{color:#0550ae} table.kv td{text-align:left;white-space:normal}
.note{color:#666;font-size:12px;max-width:1000px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:12px}
.chart{border:1px solid #eee;padding:4px;min-width:0;margin-bottom:12px}
.scroll{overflow-x:auto}
footer{color:#888;font-size:12px;margin-top:32px}
"""


def available() -> bool:
    """Whether the ``html`` extra (Bokeh) is installed."""
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    return True


def _require() -> None:
    if not available():
        raise InputError(f"the HTML report needs Bokeh: {HTML_EXTRA_HINT}")


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(head: Sequence[str] | None, rows: Iterable[Sequence[str]], cls: str = "") -> str:
    out = ['<div class="scroll">', f'<table class="{cls}">' if cls else "<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</table></div>")
    return "".join(out)


def _warnings(lines: Iterable[str]) -> str:
    return "".join(
        f'<div class="warn{" strong" if w.startswith("WARNING") else ""}">{_e(w)}</div>'
        for w in lines
    )


def _charts(charts: Sequence[tuple[str, Any]]) -> tuple[str, dict[str, str]]:
    """Bokeh's script and one div per chart name (charts that are None are left out)."""
    from bokeh.embed import components

    models = {name: fig for name, fig in charts if fig is not None}
    if not models:
        return "", {}
    script, divs = components(models)
    return script, dict(divs)


def _chart_block(divs: dict[str, str], names: Sequence[str], grid: bool = True) -> str:
    cells = "".join(
        f'<div class="chart" data-chart="{_e(n)}">{divs[n]}</div>' for n in names if n in divs
    )
    if not cells:
        return ""
    return f'<div class="grid">{cells}</div>' if grid else cells


def _page(title: str, body: str, script: str) -> str:
    from bokeh import __version__ as bokeh_version
    from bokeh.resources import Resources

    js = Resources(mode="inline", components=["bokeh"]).render()
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style>{js}</head><body>{body}"
        f"<footer>agent-replay {_e(__version__)}; charts by Bokeh {_e(bokeh_version)}, "
        "inlined: this file opens offline. Drag to pan, scroll to zoom, click a legend "
        f"entry to hide its line.</footer>{script}</body></html>\n"
    )


OPTIONAL_CHARTS = (
    ("throughput", "Throughput and load over time", ["throughput", "in-flight"], False),
    ("timelines", "Sessions over time", ["timelines"], False),
    ("gpu-power", "GPU telemetry", ["gpu-power", "gpu-util"], True),
)
"""The report's chart sections shown only when their first chart was drawn: (that chart,
heading, the charts, whether in a grid)."""


def report_html(report: Report) -> str:
    """The page of one run: the terminal report's tables, then the charts."""
    _require()
    from agent_replay.analysis import html_charts as hc
    from agent_replay.analysis.render import (
        FOOTNOTE,
        HEAD,
        _kv_sections,
        _latency_rows,
        _session_rows,
        report_dict,
    )

    d = report_dict(report)
    over = hc.over_time(report) or (None, None)
    gpu = hc.gpu_charts(report) or (None, None)
    charts = [(f"cdf-{k}", hc.latency_cdf([("", report)], k)) for k in CDF_KEYS]
    charts += [
        ("tps", hc.tps_histogram(report)),
        ("throughput", over[0]),
        ("in-flight", over[1]),
        ("timelines", hc.timelines(report)),
        ("gpu-power", gpu[0]),
        ("gpu-util", gpu[1]),
    ]
    script, divs = _charts(charts)
    body = [
        f"<h1>agent-replay report</h1><p class='path'>{_e(d['results_dir'])}</p>",
        _warnings(d["warnings"]),
        f'<p class="headline">{_e(d["headline"]["text"])}</p>',
        "<h2>Latency</h2>",
        _table(HEAD, _latency_rows(d)),
        f'<p class="note">{_e(FOOTNOTE)}</p>',
        "<h2>Latency distributions</h2>",
        _chart_block(divs, [f"cdf-{k}" for k in CDF_KEYS] + ["tps"]),
    ]
    for first, heading, keys, grid in OPTIONAL_CHARTS:
        if first in divs:
            body += [f"<h2>{heading}</h2>", _chart_block(divs, keys, grid=grid)]
    for title, kv in _kv_sections(d):
        body += [f"<h2>{_e(title)}</h2>", _table(None, kv, "kv")]
    head, rows = _session_rows(d, SESSIONS_SHOWN)
    n = len(d["sessions"])
    body += [
        f"<h2>Sessions (slowest {min(n, SESSIONS_SHOWN):,} of {n:,} by session TPS)</h2>",
        _table(head, rows),
    ]
    return _page(f"agent-replay report: {d['results_dir']}", "".join(body), script)


OPEN_VERDICTS = (
    "no verdict",
    "inconclusive",
    "not enough data",
    "no interval",
    "no finite resample",
    "no ratio",
    "Holm-corrected",
    "Holm correction",
    "paired:",
)
"""Words of a verdict line that reaches no conclusion: drawn in a neutral colour, not in
the success colour of a conclusion."""


def is_conclusion(verdict: str) -> bool:
    """Whether a verdict line of ``compare`` concludes (a significant change)."""
    return not any(w in verdict for w in OPEN_VERDICTS)


def _verdict(v: str) -> str:
    """A verdict line: the success colour for a conclusion, a neutral one otherwise."""
    cls = "headline" if is_conclusion(v) else "headline open"
    return f'<p class="{cls}">{_e(v)}</p>'


def run_identity(name: str, report: Report) -> tuple[str, str, str, str, str, str]:
    """What tells one compared run from another beyond its folder's name: its target, model,
    load options, start time and status."""
    import datetime as dt

    m = report.meta
    load = ", ".join(
        f"{k} {m.option(k)}"
        for k in ("speedup", "concurrency", "rate", "concurrent_sessions", "duration_s")
        if m.option(k) not in (None, 1.0)
    )
    load = m.timing + (f", {load}" if load else "")
    t0 = m.clock.t0_wall_ns
    when = (
        "-"
        if t0 is None
        else dt.datetime.fromtimestamp(t0 / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    )
    return (name, m.target.url or "-", m.target.model or "-", load, when, m.status or "-")


def compare_html(result: Any, runs: Sequence[tuple[str, Report]]) -> str:
    """The page of ``compare``: its tables and verdicts (``analysis.compare``), then the runs'
    latency CDFs overlaid. ``runs``: (name, report) of each run drawn."""
    _require()
    from agent_replay.analysis import html_charts as hc
    from agent_replay.analysis.compare import _fmt, _rows

    head, rows = _rows(result)
    body = [
        "<h1>agent-replay compare</h1>",
        f"<p class='path'>{_e(' vs '.join(result.names))}</p>",
        _table(
            ("run", "target", "model", "load", "started (UTC)", "status"),
            [run_identity(name, r) for name, r in runs],
        ),
        _warnings(result.warnings),
        "".join(_verdict(v) for v in result.verdicts),
        "<h2>Side by side</h2>",
        _table(head, rows),
        '<p class="note">TPS values in tok/s, times in ms; TPS change = ratio of speeds.</p>',
    ]
    for name, ds in zip(result.names[1:], result.deltas, strict=True):
        if ds:
            body += [
                f"<h2>{_e(name)} vs {_e(result.names[0])}: bootstrap 95% CI of the change</h2>",
                _table(
                    ("statistic", result.names[0], name, "change", "95% CI", "significant"),
                    [_delta_row(x, _fmt) for x in ds],
                ),
            ]
    charts = [(f"cdf-{k}", hc.latency_cdf(runs, k)) for k in CDF_KEYS]
    script, divs = _charts(charts)
    body += ["<h2>Latency distributions</h2>", _chart_block(divs, [f"cdf-{k}" for k in CDF_KEYS])]
    return _page("agent-replay compare: " + " vs ".join(result.names), "".join(body), script)


def _delta_row(x: Any, fmt: Any) -> tuple[str, ...]:
    """A statistic's change between two runs, with its interval, as table cells."""
    change = "-" if x.change is None else f"{100 * x.change:+.1f}%"
    ci = (
        "-"
        if x.ci_low is None or x.ci_high is None
        else f"{100 * x.ci_low:+.1f}% .. {100 * x.ci_high:+.1f}%"
    )
    return (x.label, fmt(x.base), fmt(x.value), change, ci, "yes" if x.significant else "no")


def _md_tables(md: str) -> str:
    """The Markdown the frontier and capacity writers produce, as HTML: tables as tables,
    other lines as notes (the same cells, not recomputed)."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            # a column empty in every row (the sweep's name, when there is one sweep) is left out
            keep = [
                i
                for i in range(len(table[0]))
                if any(i < len(r) and r[i] not in ("", "-") for r in table[1:])
            ]
            rows = [[r[i] if i < len(r) else "" for i in keep] for r in table]
            out.append(_table(rows[0], rows[1:]))
            table.clear()

    for line in md.splitlines():
        s = line.strip()
        if s.startswith("|"):
            if set(s) <= set("|-: "):  # the header's separator row
                continue
            table.append([c.strip() for c in s[1:-1].split(" | ")])
            continue
        flush()
        if s.startswith("#"):
            out.append(f"<h2>{_e(s.lstrip('#').strip())}</h2>")
        elif s:
            out.append(f'<p class="note">{_e(s.removeprefix("- "))}</p>')
    flush()
    return "".join(out)


def contention_banner(pts: Sequence[Any]) -> str | None:
    """The sweep page's first warning when runs had host contention (named by target, load
    point and repeat), None when none had: the table's flag column is easily missed."""
    bad = [
        f"{p.target} {p.point:g} r{r['repeat']}"
        for p in pts
        for r in p.runs
        if r.get("machine_contention")
    ]
    if not bad:
        return None
    total = sum(len(p.runs) for p in pts)
    shown = ", ".join(bad[:12]) + (f" and {len(bad) - 12} more" if len(bad) > 12 else "")
    return (
        f"WARNING: host contention in {len(bad)} of {total} runs ({shown}): other processes "
        "took CPU from the load generator, so their timings carry that noise; rerun them "
        "on a quiet host before reading small differences"
    )


def sweep_html(sweep_dirs: Sequence[str | os.PathLike[str]], result: dict[str, Any]) -> str:
    """The page of a sweep: the frontier table and comparisons (``analysis.frontier.build``'s
    result), the capacity table when there is one, and the frontier charts with the
    run-to-run intervals."""
    _require()
    from agent_replay.analysis import html_charts as hc
    from agent_replay.analysis.frontier import ENERGY, X_AXES, Y_AXES, has_energy

    pts = result["points"]
    ref = result.get("reference")
    charts = [
        (
            f"frontier-{x}",
            hc.frontier_chart(
                pts, x, "output_tps_per_gpu", X_AXES[x], Y_AXES["output_tps_per_gpu"]
            ),
        )
        for x in X_AXES
    ]
    if ref is not None:  # the throughput the published points state: total, on both x axes
        charts += [
            (
                f"frontier-{x}-reference",
                hc.frontier_chart(
                    pts,
                    x,
                    "total_tps_per_gpu",
                    X_AXES[x],
                    Y_AXES["total_tps_per_gpu"],
                    reference=ref,
                ),
            )
            for x in X_AXES
        ]
    if has_energy(pts):
        charts.append(
            (
                "frontier-energy",
                hc.frontier_chart(
                    pts, "p90_tps", ENERGY, X_AXES["p90_tps"], "joules per output token"
                ),
            )
        )
    script, divs = _charts(charts)
    names = ", ".join(str(s) for s in sweep_dirs)
    body = [
        "<h1>agent-replay sweep</h1>",
        f"<p class='path'>{_e(names)}</p>",
        _warnings(w for w in (contention_banner(pts),) if w),
        "<h2>Frontier</h2>",
        _chart_block(divs, [n for n, _ in charts], grid=False),
        _md_tables(result["markdown"]),
    ]
    cap = Path(sweep_dirs[0]) / "capacity.md"
    if cap.exists():
        body += ["<h2>Capacity</h2>", _md_tables(cap.read_text())]
    return _page(f"agent-replay sweep: {names}", "".join(body), script)


def write_html(page: str, path: str | os.PathLike[str], *, force: bool = True) -> Path:
    """Write ``page`` to ``path`` (atomically: a reader never sees half a file)."""
    dest = Path(path)
    if dest.exists() and not force:
        raise OutputExistsError(str(dest))
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, dest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise AgentReplayError(
            f"{dest}: cannot write the HTML report: {exc.strerror or exc}"
        ) from exc
    return dest


def write_run_report(
    results_dir: str | os.PathLike[str], report: Report | None = None
) -> tuple[Path | None, str]:
    """Write ``report.html`` beside a run's run.json. Returns (its path, a line for the user);
    without the ``html`` extra (None, how to get it), and on any failure (None, why): a
    finished run is never failed by its report."""
    if not available():
        return (
            None,
            f"HTML report: {HTML_EXTRA_HINT}, then agent-replay report {results_dir} --html FILE",
        )
    try:
        if report is None:
            from agent_replay.analysis.report import build_report

            report = build_report(results_dir)
        path = write_html(report_html(report), Path(results_dir) / FILE_NAME)
    except Exception as exc:  # the run's data is written; its page is an extra
        return None, f"HTML report not written: {type(exc).__name__}: {exc}"
    return path, f"HTML report: {path}"


class RunReportHook:
    """A sweep's ``RunHook`` that writes each run's report.html after the run."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def start(self, run_dir: Path, target: Any, url: str) -> None:
        self.run_dir = run_dir

    def stop(self) -> None:
        if self.run_dir is not None and (self.run_dir / "run.json").exists() and available():
            write_run_report(self.run_dir)
        self.run_dir = None
