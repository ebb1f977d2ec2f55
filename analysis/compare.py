"""Comparing runs: side-by-side numbers, deltas against the first run, bootstrap confidence
intervals on P50/P90 of TPOT, TTFT and request TPS, and a plain verdict.

The bootstrap is exact and vectorized without materializing resamples: the k-th smallest of
n indices drawn uniformly with replacement from a sorted sample is floor(n * U_(k)), and the
k-th order statistic U_(k) of n uniforms is Beta(k, n - k + 1). One resample's percentile is
therefore ``sorted[floor(n * Beta(k, n - k + 1))]``: one sort per run and one Beta draw per
resample, whatever the sample size. Resamples of the two runs are independent; the interval
is the 2.5th-97.5th percentile of the resampled relative difference. A difference is called
significant when that interval excludes zero. No interval is given where a side has fewer
requests than the percentile needs (``analysis.hist.min_count_for``) or than two time blocks
hold: a bootstrap of one or two values has no spread, and would call any change significant.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson
from rich.console import Group
from rich.table import Table
from rich.text import Text

from agent_replay.analysis.definitions import METRICS, SPEEDS, speeds
from agent_replay.analysis.hist import min_count_for, rank
from agent_replay.analysis.report import Report, build_report
from agent_replay.errors import InputError

# (key, label, array, percentile, higher is better)
STATS: tuple[tuple[str, str, str, float, bool], ...] = (
    ("tps_p90", "P90 TPS", "tpot", 90.0, True),
    ("tps_p50", "median TPS", "tpot", 50.0, True),
    ("tpot_p90", "P90 TPOT", "tpot", 90.0, False),
    ("tpot_p50", "median TPOT", "tpot", 50.0, False),
    ("ttft_p90", "P90 TTFT", "ttft", 90.0, False),
    ("ttft_p50", "median TTFT", "ttft", 50.0, False),
)
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Delta:
    key: str
    label: str
    base: float | None
    value: float | None
    change: float | None  # value / base - 1 (for TPS: speed ratio - 1)
    ci_low: float | None
    ci_high: float | None
    higher_is_better: bool
    note: str | None = None  # why there is no interval

    @property
    def significant(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None and (
            self.ci_low > 0 or self.ci_high < 0)

    def verdict(self, name: str) -> str:
        if self.change is None or self.ci_low is None or self.ci_high is None:
            return f"{self.label}: {self.note or 'not enough data'}"
        ci = f"95% CI {100 * self.ci_low:+.1f}% to {100 * self.ci_high:+.1f}%"
        if not self.significant:
            return (f"{self.label}: inconclusive ({name} {100 * self.change:+.1f}%, {ci}: the "
                    "interval includes 0)")
        if self.higher_is_better:
            word = "faster" if self.change > 0 else "slower"
            lo, hi = sorted((abs(self.ci_low), abs(self.ci_high)))
            return (f"{name} is {100 * abs(self.change):.0f}% {word} at {self.label}, 95% CI "
                    f"{100 * lo:.0f}-{100 * hi:.0f}%")
        word = "lower (better)" if self.change < 0 else "higher (worse)"
        lo, hi = sorted((abs(self.ci_low), abs(self.ci_high)))
        return (f"{name} has {100 * abs(self.change):.0f}% {word} {self.label}, 95% CI "
                f"{100 * lo:.0f}-{100 * hi:.0f}%")


def _sorted_clean(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sort(x[~np.isnan(x)])


def bootstrap_percentile(sorted_x: np.ndarray, p: float, resamples: int,
                         rng: np.random.Generator) -> np.ndarray:
    """``resamples`` bootstrap replicates of the ``p`` percentile (inverted CDF) of a sorted
    sample, exact in distribution (see the module docstring)."""
    n = sorted_x.size
    k = rank(p, n)
    u = rng.beta(k, n - k + 1, size=resamples)
    return sorted_x[np.minimum((u * n).astype(np.int64), n - 1)]


BLOCKS = 10
"""Time blocks of a run for the block bootstrap (contiguous in send order, equal counts)."""
BLOCK_MIN = 5
"""Fewest requests in a time block: a run of n requests has min(BLOCKS, n // BLOCK_MIN)."""


def min_interval_count(p: float, blocks: bool) -> int:
    """Requests each side needs for an interval of the ``p`` percentile: what the percentile
    needs, and with the time-block bootstrap at least two blocks (one block resamples to the
    run itself)."""
    return max(min_count_for(p), 2 * BLOCK_MIN if blocks else 2)


def block_bootstrap_percentile(x: np.ndarray, order: np.ndarray | None, p: float, resamples: int,
                               rng: np.random.Generator, blocks: int = BLOCKS) -> np.ndarray:
    """Bootstrap replicates of the ``p`` percentile that resample whole time blocks: the
    requests (in send order ``order``) are cut into ``blocks`` contiguous blocks, each
    replicate draws that many blocks with replacement and takes the nearest-rank percentile
    of their requests. Requests close in time share the server's state (batch, cache, a
    slow phase); resampling them one by one treats them as independent and gives an
    interval too narrow."""
    v = np.asarray(x, dtype=np.float64)
    if order is not None:
        v = v[np.argsort(order, kind="stable")]
    v = v[~np.isnan(v)]
    n = v.size
    nb = max(1, min(blocks, n // BLOCK_MIN))
    edges = np.linspace(0, n, nb + 1).astype(np.int64)
    parts = [np.sort(v[edges[i]:edges[i + 1]]) for i in range(nb)]
    out = np.empty(resamples)
    for r in range(resamples):
        pick = rng.integers(0, nb, size=nb)
        sample = np.concatenate([parts[i] for i in pick])
        k = rank(p, sample.size) - 1
        out[r] = np.partition(sample, k)[k]
    return out


def compare_arrays(base: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray], *,
                   resamples: int = 1000, seed: int = 0,
                   order: tuple[np.ndarray, np.ndarray] | None = None) -> list[Delta]:
    """Deltas of every STATS entry of ``other`` against ``base`` (per-request arrays in ns,
    keys ``tpot`` and ``ttft``; NaN entries ignored). ``order``: each side's send times;
    then the intervals come from the time-block bootstrap (``block_bootstrap_percentile``),
    else from the per-request one."""
    rng = np.random.default_rng(seed)
    a_lo, a_hi = (1 - CONFIDENCE) / 2 * 100, (1 + CONFIDENCE) / 2 * 100
    out = []
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, label, arr, p, higher in STATS:
        if arr not in cache:
            cache[arr] = (_sorted_clean(base[arr]), _sorted_clean(other[arr]))
        a, b = cache[arr]
        if a.size == 0 or b.size == 0:
            out.append(Delta(key, label, None, None, None, None, None, higher))
            continue
        va, vb = a[rank(p, a.size) - 1], b[rank(p, b.size) - 1]
        tps = key.startswith("tps")  # speed = 1 / TPOT: ratio of speeds = inverse ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            base_v, val_v = (1e9 / va, 1e9 / vb) if tps else (va / 1e6, vb / 1e6)  # tok/s, ms
            change = va / vb - 1 if tps else vb / va - 1
        need = min_interval_count(p, order is not None)
        if min(a.size, b.size) < need:
            out.append(Delta(key, label, float(base_v), float(val_v), float(change), None, None,
                             higher, f"no interval: {a.size} and {b.size} requests, it needs "
                             f"{need} a side"))
            continue
        if order is not None:
            ra = block_bootstrap_percentile(base[arr], order[0], p, resamples, rng)
            rb = block_bootstrap_percentile(other[arr], order[1], p, resamples, rng)
        else:
            ra = bootstrap_percentile(a, p, resamples, rng)
            rb = bootstrap_percentile(b, p, resamples, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = ra / rb - 1 if tps else rb / ra - 1
        reps = reps[np.isfinite(reps)]
        lo, hi = (np.percentile(reps, [a_lo, a_hi]) if reps.size else (np.nan, np.nan))
        out.append(Delta(key, label, float(base_v), float(val_v), float(change),
                         float(lo), float(hi), higher))
    return out


@dataclass(slots=True)
class CompareResult:
    names: list[str]
    side_by_side: list[dict[str, Any]]  # one dict of headline numbers per run
    deltas: list[list[Delta]]  # per run after the first
    verdicts: list[str]
    warnings: list[str] = field(default_factory=list)


def _numbers(r: Report) -> dict[str, Any]:
    """The headline figures of one run: the definitions table's speeds and headline
    percentiles (``analysis.definitions``), and throughput."""
    st = r.stats
    tp = st.extra.get("throughput", {})
    out: dict[str, Any] = {"requests ok": st.requests["ok"], "requests failed": st.requests["failed"]}
    sp = speeds(st.latency)
    for key, label, _, _ in SPEEDS:
        out[f"{label} (tok/s)"] = sp[key]
    for m in METRICS:
        for p in m.headline:
            v = st.latency[m.key].values.get(p)
            out[f"{m.label} P{p:g} ({m.unit})"] = None if v is None else v / 1e6
    out["output tok/s"] = tp.get("output_tokens_per_s")
    return out


def _arrays(r: Report) -> dict[str, np.ndarray]:
    t = r.stats.per_request
    ok = t.column("ok").to_numpy(zero_copy_only=False).astype(bool)
    return {k: np.asarray(t.column(k).to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
            for k in ("tpot", "ttft", "intended_ns")}


TIMING_OPTIONS = ("timing", "speedup", "concurrency", "sessions_multiplier", "max_sessions",
                  "duration_s", "warmup_s", "api", "rate", "arrival", "concurrent_sessions",
                  "ramp_s")
"""run.json options that shape the load: runs that differ in one are different experiments."""


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What makes two runs (their run.json) not comparable: another trace (content hash),
    model, or load-shaping option. The servers' URLs may differ: that is what is compared."""
    out = []
    ta, tb = a.get("trace") or {}, b.get("trace") or {}
    if ta.get("sha256") != tb.get("sha256"):
        out.append(f"trace {ta.get('path')} vs {tb.get('path')}")
    ma, mb = (a.get("target") or {}).get("model"), (b.get("target") or {}).get("model")
    if ma != mb:
        out.append(f"model {ma} vs {mb}")
    oa, ob = a.get("options") or {}, b.get("options") or {}
    for k in TIMING_OPTIONS:
        if oa.get(k) != ob.get(k):
            out.append(f"{k} {oa.get(k)} vs {ob.get(k)}")
    return out


def check_comparable(metas: Sequence[Mapping[str, Any]], names: Sequence[str], force: bool) -> list[str]:
    """Refuse (InputError) runs that differ in trace, model or timing options, naming what
    differs; with ``force`` the differences become warnings."""
    lines = []
    for m, name in zip(metas[1:], names[1:], strict=True):
        diff = differences(metas[0], m)
        if diff:
            lines.append(f"{name} differs from {names[0]}: {'; '.join(diff)}")
    if lines and not force:
        only_model = all(d.startswith("model ") for m in metas[1:] for d in differences(metas[0], m))
        hint = ("; pass --force to compare anyway" if not only_model else
                ": the same trace and load, served under different model names, which is "
                "expected when the deployments name their model differently (two simulated "
                "engine profiles, a quantized or renamed copy); pass --force to compare them")
        raise InputError("compare: not the same experiment (" + " | ".join(lines) + ")" + hint)
    return [f"not comparable, compared because of --force: {ln}" for ln in lines]


ONE_RUN_WARNING = ("one run per side: the intervals cover the variation within each run (time-"
                   "block bootstrap), not between runs, which is often larger; repeat the runs "
                   "(agent-replay sweep, or compare A1,A2,A3 B1,B2,B3) for intervals that do")


def compare_reports(reports: Sequence[Report], names: Sequence[str], *, resamples: int = 1000,
                    seed: int = 0, force: bool = False) -> CompareResult:
    warnings = check_comparable([r.meta for r in reports], names, force)
    base = _arrays(reports[0])
    deltas, verdicts = [], []
    for r, name in zip(reports[1:], names[1:], strict=True):
        other = _arrays(r)
        ds = compare_arrays(base, other, resamples=resamples, seed=seed,
                            order=(base["intended_ns"], other["intended_ns"]))
        deltas.append(ds)
        head = next(d for d in ds if d.key == "tps_p90")
        verdicts.append(head.verdict(name) if head.significant else
                        f"{name} vs {names[0]}: " + head.verdict(name))
        verdicts += [d.verdict(name) for d in ds if d.key != "tps_p90" and d.significant]
    warnings.append(ONE_RUN_WARNING)
    for r, name in zip(reports, names, strict=True):
        warnings += [f"{name}: {w}" for w in r.warnings]
    return CompareResult(list(names), [_numbers(r) for r in reports], deltas, verdicts, warnings)


def compare_dirs(dirs: Sequence[str | os.PathLike[str]], *, resamples: int = 1000,
                 seed: int = 0, force: bool = False) -> CompareResult:
    reports = [build_report(d) for d in dirs]
    names = [os.path.basename(os.path.normpath(str(d))) or str(d) for d in dirs]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return compare_reports(reports, names, resamples=resamples, seed=seed, force=force)


ARM_FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("p90_tps", "P90 TPS", True), ("median_tps", "median TPS", True),
    ("interactivity", "interactivity", True), ("ttft_p90_ms", "TTFT P90", False),
    ("ttft_p99_ms", "TTFT P99", False), ("tpot_p90_ms", "TPOT P90", False),
    ("output_tps", "output tok/s", True),
)


def compare_arms(arms: Sequence[Sequence[str | os.PathLike[str]]], names: Sequence[str], *,
                 force: bool = False, paired: bool = True) -> CompareResult:
    """Replicate runs per arm: each run's figures (``analysis.points``), the arm's mean, and
    each arm against the first with a run-level Student-t interval (paired by position when
    the arms have as many runs, as ``sweep`` makes them); "inconclusive" when it includes 0."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.replicates import paired_ci, verdict

    reports = [[build_report(d) for d in arm] for arm in arms]
    flat = [r for arm in reports for r in arm]
    warnings = check_comparable([r.meta for r in flat],
                                [f"{names[i]}[{j}]" for i, arm in enumerate(reports) for j in range(len(arm))],
                                force)
    figs = [[point_metrics(r, gpus=1) for r in arm] for arm in reports]
    side = []
    for arm, rows in zip(names, figs, strict=True):
        d: dict[str, Any] = {"runs": len(rows)}
        for key, label, _ in ARM_FIGURES:
            vals = [r[key] for r in rows if r.get(key) is not None]
            d[f"{label} (mean)"] = float(np.mean(vals)) if vals else None
        side.append(d)
        del arm
    verdicts = []
    for name, rows in zip(names[1:], figs[1:], strict=True):
        for key, label, hib in ARM_FIGURES:
            ci = paired_ci([r.get(key) for r in figs[0]], [r.get(key) for r in rows],
                           paired=paired and len(rows) == len(figs[0]))
            verdicts.append(verdict(f"{name} vs {names[0]}, {label}", ci, hib))
    if any(len(a) < 2 for a in arms):
        warnings.append("an arm has a single run: no run-to-run interval for it")
    return CompareResult(list(names), side, [[] for _ in names[1:]], verdicts, warnings)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def _rows(c: CompareResult) -> tuple[list[str], list[list[str]]]:
    head = ["metric", *c.names] + [f"{n} vs {c.names[0]}" for n in c.names[1:]]
    rows = []
    for key in c.side_by_side[0]:
        vals = [s[key] for s in c.side_by_side]
        deltas = []
        for v in vals[1:]:
            base = vals[0]
            deltas.append(f"{100 * (v / base - 1):+.1f}%" if isinstance(v, (int, float))
                          and isinstance(base, (int, float)) and base else "-")
        rows.append([key, *[_fmt(v) for v in vals], *deltas])
    return head, rows


def render_compare(c: CompareResult) -> Group:
    parts: list[Any] = [Text(w, style="yellow") for w in c.warnings]
    head, rows = _rows(c)
    t = Table(title="Side by side", title_justify="left", show_edge=False)
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    parts.append(t)
    for name, ds in zip(c.names[1:], c.deltas, strict=True):
        if not ds:  # replicate arms: the verdicts carry the run-level intervals
            continue
        bt = Table(title=f"{name} vs {c.names[0]}: bootstrap 95% CI of the change",
                   title_justify="left", show_edge=False)
        for h in ("statistic", c.names[0], name, "change", "95% CI", "significant"):
            bt.add_column(h, justify="left" if h == "statistic" else "right")
        for d in ds:
            bt.add_row(d.label, _fmt(d.base), _fmt(d.value),
                       "-" if d.change is None else f"{100 * d.change:+.1f}%",
                       "-" if d.ci_low is None or d.ci_high is None
                       else f"{100 * d.ci_low:+.1f}% .. {100 * d.ci_high:+.1f}%",
                       "yes" if d.significant else "no")
        parts.append(bt)
    parts.append(Text("TPS values in tok/s, TPOT/TTFT in ms; TPS change = ratio of speeds.",
                      style="dim"))
    parts += [Text(v, style="bold") for v in c.verdicts]
    return Group(*parts)


def to_markdown(c: CompareResult) -> str:
    head, rows = _rows(c)
    lines = [f"> {w}" for w in c.warnings]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"- **{v}**" for v in c.verdicts]
    return "\n".join(lines) + "\n"


def to_json(c: CompareResult) -> str:
    d = {"names": c.names, "side_by_side": c.side_by_side, "verdicts": c.verdicts,
         "warnings": c.warnings,
         "deltas": [[asdict(x) | {"significant": x.significant} for x in ds] for ds in c.deltas]}
    return orjson.dumps(d, option=orjson.OPT_INDENT_2).decode() + "\n"
