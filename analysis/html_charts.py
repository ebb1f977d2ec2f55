"""The charts of the HTML report, as Bokeh models (the ``html`` extra; imported only by
``analysis.html``). Each builder takes analysis values (a Report, sweep points) and returns
a figure, or None when it has nothing to draw; every chart carries its title, axis labels
with units and a legend, so it reads without the docs.

The numbers are the report's: a CDF is drawn from the same per-request values (exact) or
the same HdrHistogram (ITL) whose percentiles the tables print, and those percentiles are
marked on it from the same Summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from bokeh import models as _models
from bokeh import plotting as _plotting
from bokeh.palettes import Category10_10

from agent_replay.analysis.cdf import MARKED, ZERO_MS, cdf_points, zero_fraction
from agent_replay.analysis.definitions import BY_KEY
from agent_replay.analysis.frontier import by_target, series_name
from agent_replay.analysis.metrics import served_output_tokens
from agent_replay.analysis.report import Report
from agent_replay.analysis.timeseries import bin_edges, lanes, mean_in_flight, spread_rate

# Bokeh's own type stubs disagree with its keyword API: its models are used untyped here.
bm: Any = _models
figure: Any = _plotting.figure
ColumnDataSource, FactorRange, HoverTool = bm.ColumnDataSource, bm.FactorRange, bm.HoverTool
Label, Range1d, Span, Whisker = bm.Label, bm.Range1d, bm.Span, bm.Whisker
NS = 1e9
MAX_LANES = 400
"""Session timelines: at most this many lanes (the title says how many were left out)."""
LANE_PX = 16
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
STATUS_COLORS = {"ok": "#1f77b4", "failed": "#d62728", "cancelled": "#7f7f7f"}


def colors(n: int) -> list[str]:
    return [Category10_10[i % 10] for i in range(n)]


def _fig(title: str, x_label: str, y_label: str, **kw: Any) -> Any:
    p = figure(
        title=title,
        x_axis_label=x_label,
        y_axis_label=y_label,
        tools=TOOLS,
        sizing_mode="stretch_width",
        height=kw.pop("height", 320),
        **kw,
    )
    p.title.text_font_size = "13px"
    p.toolbar.logo = None
    return p


def _legend_below(p: Any) -> None:
    """The legend under the plot, in a row: inside it would hide the data of a time chart."""
    for leg in list(p.legend):
        p.center = [c for c in p.center if c is not leg]
        leg.orientation = "horizontal"
        leg.location = "top_left"
        leg.click_policy = "hide"
        leg.label_text_font_size = "11px"
        p.add_layout(leg, "below")


def _col(t: Any, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _ok(report: Report) -> np.ndarray:
    return report.stats.per_request.column("ok").to_numpy(zero_copy_only=False).astype(bool)


def _unit_of(key: str) -> str:
    return "tokens" if BY_KEY[key].per == "token" else "requests"


def latency_cdf(runs: Sequence[tuple[str, Report]], key: str) -> Any | None:
    """One metric's CDF, one line per run, its P50/P90/P99 marked (the tables' values)."""
    d = BY_KEY[key]
    lines = [(name, *cdf_points(r, key), r.stats.latency[key]) for name, r in runs]
    many = len(lines) > 1
    drawn = [
        (name if many else "", v, f, s, color)
        for (name, v, f, s), color in zip(lines, colors(len(lines)), strict=True)
        if v.size
    ]
    if not drawn:
        return None
    hdr = "" if d.per == "request" else " (HdrHistogram, 3 significant digits)"
    p = _fig(
        f"{d.label} CDF{hdr}",
        f"{d.label}, ms (log scale)",
        f"fraction of {_unit_of(key)} at or below",
        x_axis_type="log",
    )
    p.y_range = Range1d(0, 1.02)
    p.xaxis.formatter = bm.NumeralTickFormatter(format="0,0.[000]")
    for name, v, f, s, color in drawn:
        _cdf_line(p, name, v, f, s, color)
    _fit_log_axis(p, [(v, f) for _, v, f, _, _ in drawn])
    p.title.text += _zeros_note([(name, v, f) for name, v, f, _, _ in drawn], many)
    p.add_tools(HoverTool(tooltips=[("ms", "@ms{0,0.000}"), ("fraction", "@frac{0.000}")]))
    _legend_below(p)  # inside, the legend covers the curves' tails
    return p


def _zeros_note(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], many: bool) -> str:
    """The title's note on the samples of 0 ms, per run when ``many``; "" when none."""
    zeros = [
        f"{name + ' ' if many else ''}{100 * z:.0f}%"
        for name, v, f in curves
        if (z := zero_fraction(v, f)) > 0
    ]
    if not zeros:
        return ""
    return (
        f"; {', '.join(zeros)} of the samples are 0 ms (tokens in one chunk), "
        f"drawn at {ZERO_MS:g} ms"
    )


def _fit_log_axis(p: Any, curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """The log x-axis over the curves' values (each sorted, with its fractions), from P10 / 10
    when smaller values would stretch it over decades, with ticks that label all of it."""
    # a few near-zero values (chunks read together) would stretch a log axis over decades
    lo = min(float(v[np.searchsorted(f, 0.1)]) for v, f in curves) / 10
    smallest = min(float(v[0]) for v, _ in curves)
    hi = max(float(v[-1]) for v, _ in curves)
    if smallest < lo:
        p.x_range = Range1d(max(lo, ZERO_MS), hi * 1.2)
        p.title.text += "; axis from P10 / 10, zoom out for smaller values"
    p.xaxis.ticker = bm.FixedTicker(ticks=log_ticks(max(min(lo, smallest), ZERO_MS), hi * 1.2))


def _cdf_line(p: Any, name: str, v: np.ndarray, f: np.ndarray, s: Any, color: str) -> None:
    """One run's CDF step line and its P50/P90/P99 marks; ``name`` prefixes the legend
    when several runs share the chart."""
    label = f"{name}: n={s.count:,}" if name else f"n={s.count:,}"
    src = ColumnDataSource({"ms": np.maximum(v, ZERO_MS), "frac": f})
    p.step("ms", "frac", source=src, mode="after", line_width=2, color=color, legend_label=label)
    marks = [(q, float(m) / 1e6) for q in MARKED if (m := s.values.get(q)) is not None]
    if marks:
        msrc = ColumnDataSource(
            {"ms": [max(m, ZERO_MS) for _, m in marks], "frac": [q / 100 for q, _ in marks]}
        )
        p.scatter(
            "ms",
            "frac",
            source=msrc,
            size=8,
            color=color,
            marker="circle",
            legend_label=f"{name + ': ' if name else ''}P50 / P90 / P99 (as in the table)",
        )


def log_ticks(lo: float, hi: float, least: int = 4) -> list[float]:
    """Tick values for a log axis over [lo, hi]: 1, 2, 5 of every decade, or every digit
    when that gives fewer than ``least`` inside the range (a range within a decade), and
    one tick below and above, so that no stretch of the data is left without a label."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    steps = ((1, 2, 5), tuple(range(1, 10)), tuple(x / 2 for x in range(2, 20)))
    grids = [np.array(sorted({m * 10.0**e for e in decades for m in ms})) for ms in steps]
    ticks = next((g for g in grids if np.count_nonzero((g >= lo) & (g <= hi)) >= least), grids[-1])
    first = max(0, int(np.searchsorted(ticks, lo, side="left")) - 1)  # one below the range
    last = int(np.searchsorted(ticks, hi, side="right"))  # and one above it
    return [float(f"{t:.6g}") for t in ticks[first : last + 1]]


def tps_histogram(report: Report) -> Any | None:
    """Per-request decode speed with the P90 TPS headline marked."""
    t = report.stats.per_request
    tps = _col(t, "tps")[_ok(report)]
    tps = tps[np.isfinite(tps)]
    if not tps.size:
        return None
    counts, edges = np.histogram(tps, bins=min(60, max(5, tps.size // 3)))
    p = _fig(
        "Per-request decode speed (request TPS = 1 / TPOT)", "tokens/s per request", "requests"
    )
    src = ColumnDataSource({"left": edges[:-1], "right": edges[1:], "n": counts})
    p.quad(
        left="left",
        right="right",
        bottom=0,
        top="n",
        source=src,
        color="#1f77b4",
        alpha=0.7,
        legend_label=f"requests (n={tps.size:,})",
    )
    p90 = report.stats.tps.values.get(90.0)
    if p90 is not None:
        p.add_layout(Span(location=p90, dimension="height", line_color="#d62728", line_width=2))
        p.line(
            [p90, p90],
            [0, 0],
            color="#d62728",
            line_width=2,
            legend_label=f"P90 TPS {p90:,.1f} tok/s (90% of requests at least this fast)",
        )
    p.add_tools(
        HoverTool(tooltips=[("tok/s", "@left{0,0.0} to @right{0,0.0}"), ("requests", "@n")])
    )
    _legend_below(p)
    return p


def _t0(report: Report) -> float:
    w = report.stats.extra.get("window_ns")
    if w:
        return float(w[0])
    intended = _col(report.stats.per_request, "intended_ns")
    return float(np.nanmin(intended)) if intended.size else 0.0


def over_time(report: Report) -> tuple[Any, Any] | None:
    """Output tokens/s and mean requests in flight, per bin of the run's clock."""
    t = report.stats.per_request
    if t.num_rows == 0:
        return None
    ok = _ok(report)
    sent, end = _col(t, "sent_ns"), _col(t, "end_ns")
    e2e, ttft = _col(t, "e2e"), _col(t, "ttft")
    first = end - e2e + ttft  # the first token's arrival: s + TTFT, with s = end - E2E
    out_tok = served_output_tokens(
        _col(t, "completion_tokens"), _col(t, "output_tokens"), _col(t, "exact") > 0
    )
    t0 = _t0(report)
    stop = np.nanmax(end) if np.isfinite(end).any() else t0
    edges = bin_edges(t0, max(stop, t0 + 1e8))
    tok = spread_rate(first[ok], end[ok], out_tok[ok], edges)
    flight = mean_in_flight(sent, end, edges)
    x = (edges - t0) / NS
    width = float(np.diff(edges)[0]) / NS
    src = ColumnDataSource({"left": x[:-1], "right": x[1:], "tok": tok, "flight": flight})
    p1 = _fig(
        f"Output tokens/s over the run ({width:g} s bins)",
        "seconds since the run's start",
        "output tokens/s",
        height=300,
    )
    p1.quad(
        left="left",
        right="right",
        bottom=0,
        top="tok",
        source=src,
        color="#2ca02c",
        alpha=0.75,
        legend_label="output tokens/s (each request's tokens spread from its "
        "first to its last token)",
    )
    p1.add_tools(HoverTool(tooltips=[("s", "@left{0.0} to @right{0.0}"), ("tok/s", "@tok{0,0.0}")]))
    p2 = _fig(
        f"Requests in flight over the run (mean per {width:g} s bin)",
        "seconds since the run's start",
        "requests in flight",
        height=270,
        x_range=p1.x_range,
    )
    p2.quad(
        left="left",
        right="right",
        bottom=0,
        top="flight",
        source=src,
        color="#ff7f0e",
        alpha=0.75,
        legend_label="mean requests between send and last byte (failed too)",
    )
    p2.add_tools(
        HoverTool(tooltips=[("s", "@left{0.0} to @right{0.0}"), ("in flight", "@flight{0.00}")])
    )
    for p in (p1, p2):
        _legend_below(p)
        p.y_range.start = 0
    return p1, p2


def _statuses(report: Report) -> np.ndarray:
    """Each request's outcome: ok, cancelled (by the run's stop) or failed."""
    t = report.stats.per_request
    kinds = (
        t.column("error_kind").to_pylist()
        if "error_kind" in t.column_names
        else [None] * t.num_rows
    )
    return np.asarray(
        [
            "ok" if o else ("cancelled" if k == "cancelled" else "failed")
            for o, k in zip(_ok(report), kinds, strict=True)
        ]
    )


def timelines(report: Report) -> Any | None:
    """One lane per session (clone, subagent); a bar per request from its send to its last
    byte, coloured by outcome; the gaps are the agent's think time."""
    t = report.stats.per_request
    if t.num_rows == 0:
        return None
    labels, lane = lanes(report.stats.per_request)
    shown = labels[:MAX_LANES]
    keep = lane < len(shown)
    sent, end = _col(t, "sent_ns"), _col(t, "end_ns")
    keep &= ~np.isnan(sent)
    if not keep.any():
        return None
    span = float(np.nanmax(np.fmax(sent, end)) - np.nanmin(sent))
    # a bar at least 0.3% of the run wide: a request that failed at once (or without an end
    # time) stays visible
    end = np.fmax(np.where(np.isnan(end), sent, end), sent + 0.003 * span)
    status = _statuses(report)
    t0 = _t0(report)
    idx = np.nonzero(keep)[0]
    title = (
        f"Session timelines: {len(labels):,} lanes (session #clone / subagent)"
        if len(shown) == len(labels)
        else f"Session timelines: the first {len(shown):,} of {len(labels):,} lanes by start"
    )
    p = _fig(
        title,
        "seconds since the run's start (bars: send to last byte; gaps: think time)",
        "session",
        y_range=FactorRange(factors=list(reversed(shown))),
        height=max(200, 90 + LANE_PX * len(shown)),
    )
    rid = _col(t, "request_index")
    for st, color in STATUS_COLORS.items():
        sel = idx[status[idx] == st]
        if not sel.size:
            continue
        src = ColumnDataSource(
            {
                "lane": [shown[i] for i in lane[sel]],
                "left": (sent[sel] - t0) / NS,
                "right": (end[sel] - t0) / NS,
                "request": rid[sel],
                "ttft": _col(t, "ttft")[sel] / 1e6,
                "e2e": _col(t, "e2e")[sel] / 1e6,
                "tokens": _col(t, "output_tokens")[sel],
            }
        )
        p.hbar(
            y="lane",
            left="left",
            right="right",
            height=0.7,
            source=src,
            color=color,
            legend_label=f"{st} ({sel.size:,})",
        )
    p.add_tools(
        HoverTool(
            tooltips=[
                ("lane", "@lane"),
                ("request", "@request"),
                ("sent at s", "@left{0.000}"),
                ("TTFT ms", "@ttft{0,0.0}"),
                ("E2E ms", "@e2e{0,0.0}"),
                ("output tokens", "@tokens{0,0}"),
            ]
        )
    )
    p.yaxis.major_label_text_font_size = "9px"
    _legend_below(p)
    return p


def gpu_charts(report: Report) -> tuple[Any, Any] | None:
    """Per GPU power and utilization on the run's clock (telemetry beside the run)."""
    t = report.gpu_samples
    if t is None or t.num_rows == 0:
        return None
    ts = _col(t, "t_ns")
    gpu = np.asarray(t.column("gpu").to_numpy(zero_copy_only=False))
    t0 = _t0(report)
    g = report.gpu or {}
    jt = g.get("j_per_output_token")
    p1 = _fig(
        "GPU power" + (f" ({jt:.3f} J per output token)" if jt else ""),
        "seconds since the run's start",
        "power, W",
        height=260,
    )
    p2 = _fig(
        "GPU utilization",
        "seconds since the run's start",
        "utilization, %",
        height=260,
        x_range=p1.x_range,
    )
    ids = np.unique(gpu)
    for gid, color in zip(ids, colors(ids.size), strict=True):
        sel = gpu == gid
        order = np.argsort(ts[sel])
        x = (ts[sel][order] - t0) / NS
        p1.line(x, _col(t, "power_w")[sel][order], color=color, legend_label=f"GPU {gid}")
        p2.line(x, _col(t, "gpu_util_pct")[sel][order], color=color, legend_label=f"GPU {gid} busy")
        sm = _col(t, "sm_active_pct")[sel][order]
        if not np.isnan(sm).all():
            p2.line(x, sm, color=color, line_dash="dashed", legend_label=f"GPU {gid} SM active")
    for p in (p1, p2):
        _legend_below(p)
        if ids.size > 8:
            p.legend.visible = False
    return p1, p2


def _with(group: Sequence[Any], x: str, y: str) -> list[dict[str, Any]]:
    """The runs of a target's points that have both figures."""
    return [r for pt in group for r in pt.runs if None not in (r.get(x), r.get(y))]


def _run_dots(
    p: Any, group: Sequence[Any], x: str, y: str, name: str, color: str
) -> list[tuple[float, float]]:
    """Every run of a target as a dot, a run whose warm-up never became steady as a hollow
    triangle (what the frontier table's warm-up line refers to); returns all (x, y)."""
    runs = _with(group, x, y)
    for flagged, kw, label in (
        (False, {"size": 6, "alpha": 0.4}, "one run"),
        (
            True,
            {"size": 9, "marker": "triangle", "fill_alpha": 0, "line_width": 1.5},
            "one run, warm-up not steady",
        ),
    ):
        these = [r for r in runs if (r.get("warmup_steady") is False) is flagged]
        if these:
            p.scatter(
                [r[x] for r in these],
                [r[y] for r in these],
                color=color,
                legend_label=f"{name}: {label}",
                **kw,
            )
    return [(r[x], r[y]) for r in runs]


def frontier_chart(
    pts: Sequence[Any], x: str, y: str, x_label: str, y_label: str, reference: Any = None
) -> Any | None:
    """Every run as a dot, each target's means joined, with the run-to-run 95% interval of
    the mean on both axes (whiskers). ``reference`` (``analysis.references.Reference``): its
    points on these axes in black, stars or dotted lines, on log scales."""
    by = {series_name(group[0]): group for group in by_target(pts).values()}
    if not by:
        return None
    refs = _reference_points(reference, x, y)
    log = {"x_axis_type": "log", "y_axis_type": "log"} if refs else {}
    p = _fig(
        f"{y_label} against {x_label} (95% intervals over repeats; labels: load point"
        + ("; black: published reference, other hardware; log scales)" if refs else ")"),
        x_label,
        y_label,
        height=420,
        **log,
    )
    xs, ys = _draw_targets(p, by, x, y)
    if not xs:
        return None
    for r in refs:
        rx, ry = _draw_reference(p, r, x, y)
        xs += [rx] if rx is not None else []
        ys += [ry] if ry is not None else []
    _fit_ranges(p, xs, ys, log=bool(refs))
    p.add_tools(
        HoverTool(
            tooltips=[
                ("load point", "@point"),
                ("runs", "@n"),
                (x_label, "@x{0,0.0} [@xlo{0,0.0}, @xhi{0,0.0}]"),
                (y_label, "@y{0,0.0} [@ylo{0,0.0}, @yhi{0,0.0}]"),
            ]
        )
    )
    _legend_below(p)
    return p


def _reference_points(reference: Any, x: str, y: str) -> list[Any]:
    """The published points that have either figure."""
    if reference is None:
        return []
    return [r for r in reference.points if x in r.values or y in r.values]


def _draw_targets(
    p: Any, by: dict[str, list[Any]], x: str, y: str
) -> tuple[list[float], list[float]]:
    """Each target's runs and means; the x and y values drawn (none: no target had means)."""
    xs: list[float] = []
    ys: list[float] = []
    for (name, group), color in zip(by.items(), colors(len(by)), strict=True):
        every = _run_dots(p, group, x, y, name, color)
        src = _means_source(group, x, y)
        if src is None:
            continue
        xs += src.data["xlo"] + src.data["xhi"] + [a for a, _ in every]
        ys += src.data["ylo"] + src.data["yhi"] + [b for _, b in every]
        _draw_means(p, src, name, color)
    return xs, ys


def _means_source(group: Sequence[Any], x: str, y: str) -> Any | None:
    """A target's means and their intervals on both axes (an unknown bound: the mean), per
    load point that has both; None when none has."""
    rows = [
        _mean_row(pt, cx, cy)
        for pt in group
        if _estimated(cx := pt.ci.get(x)) and _estimated(cy := pt.ci.get(y))
    ]
    if not rows:
        return None
    return ColumnDataSource({k: [r[k] for r in rows] for k in rows[0]})


def _estimated(ci: Any) -> bool:
    return ci is not None and ci.estimate is not None


def _mean_row(pt: Any, cx: Any, cy: Any) -> dict[str, Any]:
    def bound(v: float | None, ci: Any) -> float:
        return v if v is not None else ci.estimate

    return {
        "x": cx.estimate,
        "y": cy.estimate,
        "xlo": bound(cx.low, cx),
        "xhi": bound(cx.high, cx),
        "ylo": bound(cy.low, cy),
        "yhi": bound(cy.high, cy),
        "point": f"{pt.point:g}",
        "n": len(pt.runs),
    }


def _draw_means(p: Any, src: Any, name: str, color: str) -> None:
    """A target's means joined and labelled with their load points, with whiskers."""
    p.line("x", "y", source=src, color=color, line_width=2, legend_label=f"{name}: mean")
    p.text(
        "x",
        "y",
        text="point",
        source=src,
        x_offset=6,
        y_offset=-4,
        text_font_size="10px",
        text_color=color,
    )
    p.scatter("x", "y", source=src, size=9, color=color, legend_label=f"{name}: mean")
    p.add_layout(
        Whisker(
            base="x", lower="ylo", upper="yhi", source=src, dimension="height", line_color=color
        )
    )
    p.add_layout(
        Whisker(base="y", lower="xlo", upper="xhi", source=src, dimension="width", line_color=color)
    )


def _draw_reference(p: Any, r: Any, x: str, y: str) -> tuple[float | None, float | None]:
    """A published point: a labelled star when it has both figures, else a dotted line at
    the one it has; returns its (x, y)."""
    rx, ry = r.values.get(x), r.values.get(y)
    if rx is not None and ry is not None:
        p.scatter(
            [rx], [ry], marker="star", size=16, color="black", legend_label="published reference"
        )
        p.add_layout(Label(x=rx, y=ry, text=r.label, text_font_size="10px", x_offset=6))
    else:
        p.add_layout(
            Span(
                location=rx if rx is not None else ry,
                dimension="height" if rx is not None else "width",
                line_color="black",
                line_dash="dotted",
            )
        )
    return rx, ry


def _fit_ranges(p: Any, xs: list[float], ys: list[float], log: bool) -> None:
    """Both axes over every value drawn, so the whiskers stay inside the frame."""
    for rng, vals in ((p.x_range, xs), (p.y_range, ys)):
        lo, hi = min(vals), max(vals)
        if log:  # log scales: a factor of margin, above zero
            lo = min((v for v in vals if v > 0), default=1.0)
            rng.start, rng.end = lo / 1.3, hi * 1.3
            continue
        pad = 0.06 * (hi - lo or abs(hi) or 1.0)
        rng.start, rng.end = lo - pad, hi + pad
