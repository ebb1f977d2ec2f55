"""The Pareto frontier of a sweep (or several): per target and load point, throughput per
GPU against what each user feels (P90 TPS, InferenceX AgentX's North Star and interactivity),
with the run-to-run spread, the frontier's points marked, cost and revenue per point, and
paired comparisons between targets. Runs with GPU telemetry add joules per output token (a
column of the table, a second y-axis of the plots). Input: the index table(s) ``replay.sweep`` writes; the
frontier can be rebuilt from a sweep tree at any time without rerunning anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agent_replay.analysis.definitions import FIGURES, FIGURES_BY_KEY
from agent_replay.analysis.hist import FEW, min_count_for
from agent_replay.analysis.points import too_few
from agent_replay.analysis.replicates import Interval, adjust, holm_note, mean_ci, ratio_ci, verdict
from agent_replay.errors import InputError
from agent_replay.runmeta import RunMeta

X_AXES = {f.key: f.axis_label or f.label for f in FIGURES if f.axis == "x"}
"""What a user feels: the definitions table's figures marked ``axis="x"``."""
Y_AXES = {f.key: f.axis_label or f.label for f in FIGURES if f.axis == "y"}
"""Throughput: the figures marked ``axis="y"``."""
OFFERED = "offered"
"""sweep.json's ``axis_kind`` of a load axis whose throughput is the offered load's (session
timing), not a capacity (``replay.options.OFFERED``)."""
CLOSED_AXES = ("concurrency",)
"""The closed-loop axis of sweep.json files written before they recorded ``axis_kind``."""


def axis_kind(meta: dict[str, Any]) -> str:
    """``offered`` or ``closed``: what the sweep's load axis declares (sweep.json)."""
    kind = meta.get("axis_kind")
    if isinstance(kind, str):
        return kind
    return "closed" if meta.get("axis") in CLOSED_AXES else OFFERED


ENERGY = next(f.key for f in FIGURES if f.axis == "y2")
"""The second y-axis of the frontier (``j_per_output_token``, from the GPU telemetry)."""


@dataclass
class Point:
    sweep: str
    target: str
    point: float
    runs: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    ci: dict[str, Interval] = field(default_factory=dict)
    on_frontier: dict[str, bool] = field(default_factory=dict)

    def mean(self, key: str) -> float | None:
        return (
            self.ci[key].estimate
            if key in self.ci
            else mean_ci([r.get(key) for r in self.runs]).estimate
        )

    def unsteady(self) -> list[int]:
        """Repeats whose warm-up never became steady (``warmup_steady`` false)."""
        return [int(r["repeat"]) for r in self.runs if r.get("warmup_steady") is False]

    def few(self, key: str) -> list[int]:
        """Repeats whose ``key`` is a percentile of too few samples (``points.too_few``)."""
        return [int(r["repeat"]) for r in self.runs if too_few(r, key)]


SUMMARY_KEYS = (
    "p90_tps",
    "median_tps",
    "north_star",
    "agentx_interactivity",
    "ttft_p99_ms",
    "tpot_p90_ms",
    "output_tps_per_gpu",
    "total_tps_per_gpu",
    "usd_per_m_output",
    "usd_per_m_total",
    "revenue_per_gpu_hour",
    ENERGY,
    "output_tokens_per_s_per_kw",
)


def read_sweep(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    p = Path(path)
    idx = p / "index.parquet"
    if not idx.exists():
        raise InputError(f"{p}: not a sweep folder (no index.parquet)")
    meta = json.loads((p / "sweep.json").read_text()) if (p / "sweep.json").exists() else {}
    return meta, [dict(r) for r in pq.read_table(idx).to_pylist()]


def points(rows: Sequence[Mapping[str, Any]], sweep: str = "", phase: str = "sweep") -> list[Point]:
    """Rows grouped by (target, point); complete runs give the means and intervals, the
    others are kept as failed with their reasons."""
    groups: dict[tuple[str, float], Point] = {}
    for r in rows:
        if r.get("phase", "sweep") != phase:
            continue
        k = (str(r["target"]), float(r["point"]))
        pt = groups.setdefault(k, Point(sweep, k[0], k[1], [], []))
        (pt.runs if r["status"] == "complete" else pt.failed).append(dict(r))
    out = sorted(groups.values(), key=lambda p: (p.sweep, p.target, p.point))
    for pt in out:
        # every summary figure is a speed, throughput, latency, price or energy: never < 0
        pt.ci = {k: mean_ci([r.get(k) for r in pt.runs], lower=0.0) for k in SUMMARY_KEYS}
    return out


def pareto_mask(xy: Sequence[tuple[float, float]]) -> list[bool]:
    """True for the points no other point dominates (another is >= on both and > on one);
    both coordinates higher-is-better."""
    out = []
    for i, (x, y) in enumerate(xy):
        dominated = any(
            (x2 >= x and y2 >= y and (x2 > x or y2 > y)) for j, (x2, y2) in enumerate(xy) if j != i
        )
        out.append(not dominated)
    return out


def by_target(pts: Sequence[Point]) -> dict[tuple[str, str], list[Point]]:
    """The points grouped by (sweep, target), in their order."""
    by: dict[tuple[str, str], list[Point]] = {}
    for p in pts:
        by.setdefault((p.sweep, p.target), []).append(p)
    return by


def _has_means(p: Point, x: str, y: str) -> bool:
    return p.mean(x) is not None and p.mean(y) is not None


def mark_frontier(pts: Sequence[Point], x: str, y: str) -> None:
    """Per (sweep, target): mark each point on the frontier of (mean x, mean y)."""
    for group in by_target(pts).values():
        have = [p for p in group if _has_means(p, x, y)]
        mask = pareto_mask([(float(p.mean(x) or 0), float(p.mean(y) or 0)) for p in have])
        for p in group:
            p.on_frontier[f"{x}:{y}"] = False
        for p, m in zip(have, mask, strict=True):
            p.on_frontier[f"{x}:{y}"] = m


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def _ci(i: Interval, digits: int = 1, few: bool = False) -> str:
    mark = FEW if few else ""
    if i.estimate is None:
        return "-"
    if i.low is None or i.high is None:
        return f"{_f(i.estimate, digits)}{mark} (n={i.n})"
    return f"{_f(i.estimate, digits)}{mark} [{_f(i.low, digits)}, {_f(i.high, digits)}]"


def _cell(p: Point, key: str, digits: int = 1) -> str:
    return _ci(p.ci[key], digits, few=bool(p.few(key)))


def warmup_line(pts: Sequence[Point]) -> str | None:
    """The runs whose warm-up never became steady, counted and named; None when none."""
    bad = [f"{p.target} {p.point:g} r{r}" for p in pts for r in p.unsteady()]
    total = sum(len(p.runs) for p in pts)
    if not bad:
        return None
    return (
        f"Warm-up not reached: {len(bad)} of {total} runs never had two bursts with median "
        f"TPOT within the tolerance ({', '.join(bad)}); their figures may include the "
        "server's warm-up (flagged per run below; hollow triangles in the plots)."
    )


FEW_NOTE = (
    f"{FEW} a run's percentile over fewer samples than it needs (P90 >= "
    f"{min_count_for(90)}, P99 >= {min_count_for(99)}): at that count the P99 is the "
    "run's maximum or next to it."
)


def _frontier_cell(p: Point, x: str, y: str) -> str:
    """The frontier column: which frontiers the point is on, starred."""
    fr = [
        label
        for key, label in ((f"{x}:{y}", "P90 TPS"), (f"north_star:{y}", "North Star"))
        if p.on_frontier.get(key)
    ]
    return "* " + ", ".join(fr) if fr else ""


def _flags(p: Point) -> str:
    """The failed / flagged column: failed runs with their reasons, then flagged runs."""
    return "; ".join(
        [f"r{r['repeat']} {r['status']}: {r.get('reason')}" for r in p.failed]
        + [f"r{r['repeat']} host contention" for r in p.runs if r.get("machine_contention")]
        + [f"r{r['repeat']} cold start" for r in p.runs if r.get("cold_start")]
        + [f"r{r} warm-up not steady" for r in p.unsteady()]
    )


def _table_row(p: Point, x: str, y: str, energy: bool) -> str:
    energy_cell = [_ci(p.ci[ENERGY], 3)] if energy else []
    return (
        "| "
        + " | ".join(
            [
                p.sweep,
                p.target,
                f"{p.point:g}",
                str(len(p.runs)),
                _cell(p, "p90_tps"),
                _cell(p, "north_star"),
                _ci(p.ci["output_tps_per_gpu"], 0),
                _ci(p.ci["total_tps_per_gpu"], 0),
                _cell(p, "ttft_p99_ms"),
                _ci(p.ci["usd_per_m_output"], 3),
                _ci(p.ci["revenue_per_gpu_hour"], 2),
                *energy_cell,
                _frontier_cell(p, x, y),
                _flags(p),
            ]
        )
        + " |"
    )


ENERGY_NOTE = (
    " J/output token: GPU energy over the measured window (every sampled GPU) "
    "per output token; '-' for runs without GPU telemetry."
)
OFFERED_NOTE = (
    " Throughput here is what the offered load drew over a fixed run length: "
    "with think times the server idles between turns, and a slower target "
    "finishes fewer turns in the same time; it is not the server's capacity "
    "(agent-replay sweep --find-capacity)."
)


def to_markdown(
    pts: Sequence[Point],
    axis: str,
    x: str = "p90_tps",
    y: str = "output_tps_per_gpu",
    kind: str | None = None,
) -> str:
    """The frontier table: one row per (target, point), means with 95% intervals over the
    replicate runs, the frontier marked (*), failed runs with their reasons."""
    mark_frontier(pts, x, y)
    mark_frontier(pts, "north_star", y)
    energy = has_energy(pts)
    offered = (kind or axis_kind({"axis": axis})) == OFFERED
    head = [
        "sweep",
        "target",
        axis,
        "runs",
        "P90 TPS",
        "North Star",
        "output tok/s/GPU",
        "total tok/s/GPU",
        "TTFT p99 ms",
        "$/M output",
        "revenue $/GPU-h",
        *(["J/output token"] if energy else []),
        "frontier",
        "failed / flagged",
    ]
    lines = [w + "\n" for w in [warmup_line(pts)] if w]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [_table_row(p, x, y, energy) for p in pts]
    lines.append("")
    lines.append(
        "Geometric means over replicate runs with 95% Student-t intervals on the log "
        "scale [low, high]; the frontier column marks a point no other point of the "
        "same target beats on both per-user speed and throughput per GPU (means). "
        + FEW_NOTE
        + (ENERGY_NOTE if energy else "")
        + (OFFERED_NOTE if offered else "")
    )
    return "\n".join(lines) + "\n"


def has_energy(pts: Sequence[Point]) -> bool:
    """True when any point has a joules-per-output-token figure (GPU telemetry)."""
    return any(p.mean(ENERGY) is not None for p in pts)


PAIRED: tuple[tuple[str, bool], ...] = tuple(
    (k, FIGURES_BY_KEY[k].higher_is_better)
    for k in ("p90_tps", "output_tps_per_gpu", "ttft_p99_ms")
)
"""The figures compared between targets at each point, with which way is better (the
definitions table's ``higher_is_better``)."""


def _targets_in_order(pts: Sequence[Point], order: Sequence[str]) -> list[str]:
    """The targets named in ``order`` first, then the others by their earliest run."""
    known = [t for t in order if any(p.target == t for p in pts)]

    def earliest(t: str) -> int:
        return min((r.get("order", 0) for p in pts if p.target == t for r in p.runs), default=0)

    return known + sorted({p.target for p in pts} - set(known), key=earliest)


def _paired_tests(
    a: Point, b: Point, label: str, metrics: Sequence[tuple[str, bool]]
) -> list[tuple[str, Interval, bool]]:
    """One ratio interval per metric between two points, their runs paired by repeat."""
    ra = {int(r["repeat"]): r for r in a.runs}
    rb = {int(r["repeat"]): r for r in b.runs}
    reps = sorted(set(ra) | set(rb))
    tests = []
    for m, hib in metrics:
        ci = ratio_ci(
            [ra[i].get(m) if i in ra else None for i in reps],
            [rb[i].get(m) if i in rb else None for i in reps],
        )
        few = FEW if a.few(m) or b.few(m) else ""
        tests.append((f"{label}, {m}{few}", ci, hib))
    return tests


def comparisons(
    pts: Sequence[Point], metrics: Sequence[tuple[str, bool]] = PAIRED, order: Sequence[str] = ()
) -> list[str]:
    """Each target against the first (``order``: the experiment's target names; else the
    earliest run) at every shared point: paired by repeat, intervals on the log ratio, one
    test per statistic, Holm-corrected across all of them (the last line says so)."""
    targets = _targets_in_order(pts, order)
    if len(targets) < 2:
        return []
    base = targets[0]
    by = {(p.target, p.point): p for p in pts}
    tests: list[tuple[str, Interval, bool]] = []
    for t, pt in itertools.product(targets[1:], sorted({p.point for p in pts})):
        a, b = by.get((base, pt)), by.get((t, pt))
        if a is not None and b is not None:
            tests += _paired_tests(a, b, f"{t} vs {base} at {pt:g}", metrics)
    return _holm_verdicts(tests)


def _holm_verdicts(tests: Sequence[tuple[str, Interval, bool]]) -> list[str]:
    """A verdict per test after Holm's correction across all of them, then the note."""
    adjusted = adjust([ci for _, ci, _ in tests])
    out = [verdict(label, ci, hib) for (label, _, hib), ci in zip(tests, adjusted, strict=True)]
    return out + [holm_note(sum(1 for c in adjusted if c.p is not None))]


def plot(
    pts: Sequence[Point],
    out: str | os.PathLike[str],
    x: str = "p90_tps",
    y: str = "output_tps_per_gpu",
    title: str = "",
    reference: Any = None,
) -> Path | None:
    """A PNG: every run as a dot (the run-to-run spread), each target's means joined by a
    line, its frontier points ringed; with GPU telemetry, each target's mean joules per output
    token on a second y-axis (dashed, same colour). None when matplotlib (the plots extra)
    is missing."""
    plt = _pyplot()
    if not pts or plt is None:
        return None
    mark_frontier(pts, x, y)
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    ax2 = ax.twinx() if has_energy(pts) else None
    flagged = False
    for group in by_target(pts).values():
        flagged |= _draw_target(ax, ax2, group, x, y)
    drawn, logged = _draw_reference(ax, pts, reference, x, y)
    ax.set_xlabel(X_AXES.get(x, x))
    ax.set_ylabel(Y_AXES.get(y, y))
    ax.set_title(title or f"{Y_AXES.get(y, y)} vs {X_AXES.get(x, x)}")
    ax.grid(alpha=0.3)
    notes = _plot_notes(flagged, any(p.few(x) for p in pts), drawn, logged)
    if notes:
        ax.text(0.01, 0.01, "; ".join(notes), transform=ax.transAxes, fontsize=7, va="bottom")
    _legend(ax, ax2)
    dest = Path(out)
    fig.savefig(dest, bbox_inches="tight" if ax2 is not None or drawn else None)
    plt.close(fig)
    return dest


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; None when the plots extra is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _mean_pairs(group: Sequence[Point], x: str, y: str) -> list[tuple[float, float]]:
    """(mean x, mean y) of the points that have both."""
    return [
        (float(mx), float(my))
        for mx, my in ((p.mean(x), p.mean(y)) for p in group)
        if mx is not None and my is not None
    ]


def _draw_target(ax: Any, ax2: Any, group: Sequence[Point], x: str, y: str) -> bool:
    """One target: its means joined by a line, its runs, its frontier points and its energy
    (when there is a second axis); True when a run's warm-up never became steady."""
    name = series_name(group[0])
    means = _mean_pairs(group, x, y)
    color = ax.plot([a for a, _ in means], [b for _, b in means], "-", label=name)[0].get_color()
    flagged = _draw_runs(ax, group, x, y, color)
    _mark_points(ax, group, x, y, color)
    if ax2 is not None:
        _draw_energy(ax2, name, group, x, color)
    return flagged


def series_name(p: Point) -> str:
    """``sweep:target`` when several sweeps are overlaid, else the target."""
    return f"{p.sweep}:{p.target}" if p.sweep else p.target


def _mark_points(ax: Any, group: Sequence[Point], x: str, y: str, color: Any) -> None:
    """A target's frontier points ringed, each point labelled with its load."""
    fr = [p for p in group if p.on_frontier.get(f"{x}:{y}")]
    ax.scatter(
        [float(p.mean(x) or 0) for p in fr],
        [float(p.mean(y) or 0) for p in fr],
        s=80,
        facecolors="none",
        edgecolors=color,
        linewidths=1.5,
    )
    for p in group:
        if _has_means(p, x, y):
            ax.annotate(
                f"{p.point:g}" + (FEW if p.few(x) else ""),
                (p.mean(x), p.mean(y)),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )


def _run_pairs(group: Sequence[Point], x: str, y: str, steady: bool) -> list[tuple[Any, Any]]:
    """(x, y) of the runs that have both, whose warm-up became steady (or did not)."""
    runs = [r for p in group for r in p.runs if r.get(x) is not None and r.get(y) is not None]
    return [(r[x], r[y]) for r in runs if (r.get("warmup_steady") is not False) == steady]


def _draw_runs(ax: Any, group: Sequence[Point], x: str, y: str, color: Any) -> bool:
    """Every run as a dot, those whose warm-up never became steady as hollow triangles;
    True when any was."""
    keep = _run_pairs(group, x, y, steady=True)
    cold = _run_pairs(group, x, y, steady=False)
    if keep:
        ax.scatter(
            [float(a) for a, _ in keep], [float(b) for _, b in keep], s=12, alpha=0.5, color=color
        )
    if cold:
        ax.scatter(
            [float(a) for a, _ in cold],
            [float(b) for _, b in cold],
            s=28,
            marker="^",
            facecolors="none",
            edgecolors=color,
            linewidths=1.0,
        )
    return bool(cold)


def _draw_energy(ax2: Any, name: str, group: Sequence[Point], x: str, color: Any) -> None:
    """The target's mean joules per output token on the second y-axis, dashed."""
    energy = _mean_pairs(group, x, ENERGY)
    if energy:
        ax2.plot(
            [a for a, _ in energy],
            [b for _, b in energy],
            "--",
            marker="x",
            markersize=5,
            linewidth=1,
            alpha=0.8,
            color=color,
            label=f"{name} J/output token",
        )


def _draw_reference(
    ax: Any, pts: Sequence[Point], reference: Any, x: str, y: str
) -> tuple[int, bool]:
    """The published reference points; (how many were drawn, whether the axes went log)."""
    if reference is None:
        return 0, False
    from agent_replay.analysis.references import draw

    drawn = draw(ax, reference, x, y)
    ours = [(p.mean(x), p.mean(y)) for p in pts]
    logged = bool(drawn) and any(a and b and a > 0 and b > 0 for a, b in ours)
    if logged:  # published points sit orders of magnitude away: log scales keep ours legible
        ax.set_xscale("log")
        ax.set_yscale("log")
    return drawn, logged


def _plot_notes(flagged: bool, few: bool, drawn: int, logged: bool) -> list[str]:
    notes = []
    if flagged:
        notes.append("hollow triangle: a run whose warm-up never became steady")
    if few:
        notes.append(f"{FEW}: a percentile over too few samples in some run")
    if drawn:
        notes.append(
            ("log scales; " if logged else "") + "black stars and dotted lines: published "
            "reference points, other hardware (frontier.md)"
        )
    return notes


def _legend(ax: Any, ax2: Any) -> None:
    """One legend for both axes; below the plot when there is a second axis, which would
    draw over a legend inside it."""
    handles, labels = ax.get_legend_handles_labels()
    if ax2 is None:
        ax.legend(handles, labels, fontsize=8)
        return
    ax2.set_ylabel("joules per output token (dashed)")
    ax2.set_ylim(bottom=0)
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(
        handles + h2,
        labels + l2,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=2,
        frameon=False,
    )


def sweep_label(sweep: str | os.PathLike[str], count: int) -> str:
    """A sweep's name among ``count`` overlaid sweeps: its folder name; "" when alone."""
    return "" if count == 1 else (os.path.basename(os.path.normpath(str(sweep))) or str(sweep))


def _first_run_json(sweeps: Sequence[str | os.PathLike[str]], p: Point) -> Path | None:
    """The run.json of the point's first run that has one."""
    root = {sweep_label(s, len(sweeps)): Path(s) for s in sweeps}[p.sweep]
    for r in p.runs:
        f = root / str(r.get("path")) / "run.json"
        if r.get("path") and f.exists():
            return f
    return None


def target_settings(
    sweeps: Sequence[str | os.PathLike[str]], pts: Sequence[Point], order: Sequence[str]
) -> list[str]:
    """What the targets' servers differ in (``analysis.settings``), from the run.json of
    each target's first complete run."""
    from agent_replay.analysis.settings import setting_differences

    metas, names = [], []
    ranked = sorted(
        pts, key=lambda p: (p.sweep, order.index(p.target) if p.target in order else len(order))
    )
    for p in ranked:
        name = series_name(p)
        f = None if name in names else _first_run_json(sweeps, p)
        if f is not None:
            metas.append(RunMeta.from_json(json.loads(f.read_text())))
            names.append(name)
    return setting_differences(metas, names) if len(metas) > 1 else []


def _gpu_counts(run_json: Path) -> set[str]:
    """``N x GPU name`` of the server a run launched (run.json ``launch.gpus``); for a
    server it did not launch, the GPUs its host showed (``provenance.gpus``)."""
    meta = json.loads(run_json.read_text())
    launch = meta.get("launch") or {}
    gpus = launch.get("gpus") if isinstance(launch, dict) else None
    if isinstance(gpus, list):
        return {f"{gpus.count(g)}x {g}" for g in set(map(str, gpus))}
    seen = (meta.get("provenance") or {}).get("gpus")
    names = (
        [str(g["name"]) for g in seen if isinstance(g, dict) and g.get("name")]
        if isinstance(seen, list)
        else []
    )
    return {f"{names.count(n)}x {n} (the host's)" for n in set(names)}


def our_hardware(sweeps: Sequence[str | os.PathLike[str]], pts: Sequence[Point]) -> list[str]:
    """``N x GPU name`` of every launched server in the runs (run.json ``launch.gpus``)."""
    out: set[str] = set()
    for p in pts:
        f = _first_run_json(sweeps, p)
        if f is not None:
            out |= _gpu_counts(f)
    return sorted(out)


def _read_sweeps(
    sweeps: Sequence[str | os.PathLike[str]],
) -> tuple[list[Point], str, str, list[str]]:
    """The points of all sweeps, the (last) sweep's load axis and its kind, and the
    experiments' target names in order."""
    pts: list[Point] = []
    axis, kind = "load", OFFERED
    order: list[str] = []
    for s in sweeps:
        meta, rows = read_sweep(s)
        axis, kind = meta.get("axis", axis), axis_kind(meta)
        order += [str(t.get("name")) for t in meta.get("targets", []) if isinstance(t, dict)]
        pts += points(rows, sweep_label(s, len(sweeps)))
    return pts, axis, kind, order


def _settings_md(diffs: Sequence[str]) -> str:
    if not diffs:
        return ""
    return (
        "Targets' server settings (run.json): a comparison means what its target names "
        "say only where the servers differ in nothing else.\n\n"
        + "\n".join(f"- {d}" for d in diffs)
        + "\n\n"
    )


def _comparisons_md(cmp: Sequence[str]) -> str:
    if not cmp:
        return ""
    return (
        "\n## Paired comparisons (run-level 95% intervals on the log ratio)\n\n"
        + "\n".join(f"- {c}" for c in cmp[:-1])
        + f"\n\n{cmp[-1]}\n"
    )


def _write_plots(pts: Sequence[Point], dest: Path, ref: Any) -> list[Path]:
    """One PNG per (x, y) axis pair; none without matplotlib."""
    files = []
    for x, y in itertools.product(X_AXES, Y_AXES):
        name = f"frontier-{x}.png" if y == "output_tps_per_gpu" else f"frontier-{x}-total.png"
        png = plot(pts, dest / name, x=x, y=y, reference=ref)
        if png is not None:
            files.append(png)
    return files


def _point_json(p: Point) -> dict[str, Any]:
    """A point's entry in frontier.json."""
    return {
        "sweep": p.sweep,
        "target": p.target,
        "point": p.point,
        "runs": len(p.runs),
        "failed": [
            {"repeat": r["repeat"], "status": r["status"], "reason": r.get("reason")}
            for r in p.failed
        ],
        "on_frontier": p.on_frontier,
        "warmup_not_steady": p.unsteady(),
        "too_few_samples": {
            k: p.few(k) for k in ("p90_tps", "north_star", "ttft_p99_ms") if p.few(k)
        },
        "mean_ci": {
            k: {"estimate": v.estimate, "low": v.low, "high": v.high, "n": v.n}
            for k, v in p.ci.items()
        },
    }


def build(
    sweeps: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Rebuild the frontier files of one or several sweep trees (overlaid): frontier.md,
    frontier.json, and the PNGs when matplotlib is there. ``out_dir``: default the first
    sweep's folder. ``reference``: a file of published points (``analysis.references``)
    listed in frontier.md and drawn on the plots."""
    ref = None
    if reference is not None:
        from agent_replay.analysis.references import load

        ref = load(reference, [*X_AXES, *Y_AXES])
    pts, axis, kind, order = _read_sweeps(sweeps)
    dest = Path(out_dir or sweeps[0])
    dest.mkdir(parents=True, exist_ok=True)
    md = to_markdown(pts, axis, kind=kind)
    cmp = comparisons(pts, order=order)
    diffs = target_settings(sweeps, pts, order)
    text = _settings_md(diffs) + md + _comparisons_md(cmp)
    if ref is not None:
        from agent_replay.analysis.references import to_markdown as ref_markdown

        text += "\n" + ref_markdown(ref, our_hardware(sweeps, pts), {**X_AXES, **Y_AXES})
    (dest / "frontier.md").write_text(text)
    files = [dest / "frontier.md", *_write_plots(pts, dest, ref)]
    (dest / "frontier.json").write_text(
        json.dumps(
            {
                "points": [_point_json(p) for p in pts],
                "comparisons": cmp,
                "server_settings": diffs,
                **(
                    {
                        "reference": {
                            "path": ref.path,
                            "title": ref.title,
                            "points": [dataclasses.asdict(p) for p in ref.points],
                        }
                    }
                    if ref
                    else {}
                ),
            },
            indent=2,
        )
        + "\n"
    )
    files.append(dest / "frontier.json")
    return {"points": pts, "markdown": text, "files": files, "comparisons": cmp, "reference": ref}
