"""Comparing runs: side-by-side numbers, deltas against the first run, bootstrap confidence
intervals on the P50/P90 of TPOT and TTFT, and a plain verdict.

One test per statistic: the speed P90 TPS is 1 / P90 TPOT, so the two have one log ratio and
one verdict ("P90 TPS (= 1 / P90 TPOT)"). Intervals are taken on the log ratio of the two
runs' percentiles and shown as percent change, exp(log ratio) - 1: never below -100%, and
the same interval, mirrored, for a statistic and its reciprocal. The verdicts of one table
are Holm-corrected across all its comparisons (``analysis.replicates.holm``).

The bootstrap is exact and vectorized without materializing resamples: the k-th smallest of
n indices drawn uniformly with replacement from a sorted sample is floor(n * U_(k)), and the
k-th order statistic U_(k) of n uniforms is Beta(k, n - k + 1). One resample's percentile is
therefore ``sorted[floor(n * Beta(k, n - k + 1))]``: one sort per run and one Beta draw per
resample, whatever the sample size. Resamples of the two runs are independent; the interval
is the 2.5th-97.5th percentile of the resampled log ratio, its p-value twice the smaller
share of resampled log ratios on either side of zero. No interval is given where a side has
fewer requests than the percentile needs (``analysis.hist.min_count_for``) or than two time
blocks hold: a bootstrap of one or two values has no spread, and would call any change
significant. With one run per side no verdict is given where either run's self-check found
host contention: its timings carry the other processes' noise, which one run cannot measure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import orjson
from rich.console import Group
from rich.table import Table
from rich.text import Text

from agent_replay import safetext as safe
from agent_replay.analysis.definitions import (
    COMPARED,
    FIGURES,
    METRICS,
    RUN_FIGURES,
    SPEEDS,
    RunInputs,
    speeds,
)
from agent_replay.analysis.hist import min_count_for, rank
from agent_replay.analysis.replicates import (
    ALPHA,
    holm,
    holm_note,
    inside_margin,
    margin_verdict,
)
from agent_replay.analysis.report import Report, build_report, self_check
from agent_replay.errors import InputError
from agent_replay.runmeta import RunMeta

STATS = COMPARED
"""The statistics tested between two runs, the headline first (``analysis.definitions``:
the speeds and percentiles marked ``compared``); a speed stands for its time's percentile
too: one test for a statistic and its reciprocal."""
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
    p: float | None = None  # bootstrap two-sided p-value of "no change"
    p_holm: float | None = None  # ``p`` after Holm's adjustment across the table
    design: str = "unpaired: time-block bootstrap of each run"
    """How the interval was computed (``analysis.paired`` for the paired design)."""

    @property
    def significant(self) -> bool:
        q = self.p_holm if self.p_holm is not None else self.p
        return (
            self.ci_low is not None
            and self.ci_high is not None
            and q is not None
            and q < ALPHA
            and (self.ci_low > 0 or self.ci_high < 0)
        )

    def finding(self, margin: float = 0.0) -> bool:
        """Significant, and its interval not wholly inside +-``margin``."""
        return self.significant and not inside_margin(self.ci_low, self.ci_high, margin)

    def verdict(self, name: str, margin: float = 0.0) -> str:
        if self.change is None or self.ci_low is None or self.ci_high is None:
            return f"{self.label}: {self.note or 'not enough data'}"
        ci = f"95% CI {100 * self.ci_low:+.1f}% to {100 * self.ci_high:+.1f}%"
        if inside_margin(self.ci_low, self.ci_high, margin):
            return f"{self.label}: " + margin_verdict(
                self.change, f"{name} {100 * self.change:+.1f}% ({ci})", self.significant, margin
            )
        if not (self.ci_low > 0 or self.ci_high < 0):
            return (
                f"{self.label}: inconclusive ({name} {100 * self.change:+.1f}%, {ci}: the "
                "interval includes 0)"
            )
        if not self.significant:
            return (
                f"{self.label}: inconclusive after the Holm correction ({name} "
                f"{100 * self.change:+.1f}%, {ci}, Holm p={self.p_holm:.3g})"
            )
        if self.higher_is_better:
            word = "faster" if self.change > 0 else "slower"
            lo, hi = sorted((abs(self.ci_low), abs(self.ci_high)))
            return (
                f"{name} is {100 * abs(self.change):.0f}% {word} at {self.label}, 95% CI "
                f"{100 * lo:.0f}-{100 * hi:.0f}%"
            )
        word = "lower (better)" if self.change < 0 else "higher (worse)"
        lo, hi = sorted((abs(self.ci_low), abs(self.ci_high)))
        return (
            f"{name} has {100 * abs(self.change):.0f}% {word} {self.label}, 95% CI "
            f"{100 * lo:.0f}-{100 * hi:.0f}%"
        )


def _sorted_clean(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sort(x[~np.isnan(x)])


def bootstrap_percentile(
    sorted_x: np.ndarray, p: float, resamples: int, rng: np.random.Generator
) -> np.ndarray:
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


def block_bootstrap_percentile(
    x: np.ndarray,
    order: np.ndarray | None,
    p: float,
    resamples: int,
    rng: np.random.Generator,
    blocks: int = BLOCKS,
) -> np.ndarray:
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
    parts = [np.sort(v[edges[i] : edges[i + 1]]) for i in range(nb)]
    out = np.empty(resamples)
    for r in range(resamples):
        pick = rng.integers(0, nb, size=nb)
        sample = np.concatenate([parts[i] for i in pick])
        k = rank(p, sample.size) - 1
        out[r] = np.partition(sample, k)[k]
    return out


def compare_arrays(
    base: Mapping[str, np.ndarray],
    other: Mapping[str, np.ndarray],
    *,
    resamples: int = 1000,
    seed: int = 0,
    order: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Delta]:
    """Deltas of every STATS entry of ``other`` against ``base`` (per-request arrays in ns,
    keyed by metric: each entry's ``source``; NaN entries ignored). ``order``: each side's send times;
    then the intervals come from the time-block bootstrap (``block_bootstrap_percentile``),
    else from the per-request one."""
    rng = np.random.default_rng(seed)
    a_lo, a_hi = (1 - CONFIDENCE) / 2 * 100, (1 + CONFIDENCE) / 2 * 100
    out = []
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for st in STATS:
        key, label, arr, p, higher = st.key, st.label, st.source, st.percentile, st.higher_is_better
        if arr not in cache:
            cache[arr] = (_sorted_clean(base[arr]), _sorted_clean(other[arr]))
        a, b = cache[arr]
        if a.size == 0 or b.size == 0:
            out.append(Delta(key, label, None, None, None, None, None, higher))
            continue
        va, vb = a[rank(p, a.size) - 1], b[rank(p, b.size) - 1]
        tps = st.reciprocal  # speed = 1 / time: ratio of speeds = inverse ratio
        with np.errstate(divide="ignore", invalid="ignore"):
            base_v, val_v = (1e9 / va, 1e9 / vb) if tps else (va / 1e6, vb / 1e6)  # tok/s, ms
            change = va / vb - 1 if tps else vb / va - 1
        if not (va > 0 and vb > 0):
            out.append(
                Delta(
                    key, label, None, None, None, None, None, higher, "a percentile <= 0: no ratio"
                )
            )
            continue
        need = min_interval_count(p, order is not None)
        if min(a.size, b.size) < need:
            out.append(
                Delta(
                    key,
                    label,
                    float(base_v),
                    float(val_v),
                    float(change),
                    None,
                    None,
                    higher,
                    f"no interval: {a.size} and {b.size} requests, it needs {need} a side",
                )
            )
            continue
        if order is not None:
            ra = block_bootstrap_percentile(base[arr], order[0], p, resamples, rng)
            rb = block_bootstrap_percentile(other[arr], order[1], p, resamples, rng)
        else:
            ra = bootstrap_percentile(a, p, resamples, rng)
            rb = bootstrap_percentile(b, p, resamples, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(ra / rb) if tps else np.log(rb / ra)
        logs = logs[np.isfinite(logs)]
        if logs.size == 0:
            out.append(
                Delta(
                    key,
                    label,
                    float(base_v),
                    float(val_v),
                    float(change),
                    None,
                    None,
                    higher,
                    "no finite resample",
                )
            )
            continue
        lo, hi = np.expm1(np.percentile(logs, [a_lo, a_hi]))
        pval = min(1.0, 2 * min(float(np.mean(logs <= 0)), float(np.mean(logs >= 0))))
        out.append(
            Delta(
                key,
                label,
                float(base_v),
                float(val_v),
                float(change),
                float(lo),
                float(hi),
                higher,
                p=pval,
            )
        )
    return out


def with_holm(deltas: Sequence[Sequence[Delta]]) -> list[list[Delta]]:
    """The deltas of one table with Holm-adjusted p-values across all of them."""
    flat = [d for ds in deltas for d in ds]
    adj = iter(holm([d.p for d in flat]))
    return [[replace(d, p_holm=next(adj)) for d in ds] for ds in deltas]


def contention_note(reports: Sequence[Report], names: Sequence[str]) -> str | None:
    """The refusal line when any of these runs' self-check found host contention."""
    return contention_refusal(
        [n for r, n in zip(reports, names, strict=True) if self_check(r.meta, r.stats).contention]
    )


def contention_refusal(
    bad: Sequence[str], remedy: str = "with replicates (compare A1,A2,A3 B1,B2,B3)"
) -> str | None:
    """The line that refuses a verdict because runs ``bad`` met host contention (None when
    none did)."""
    if not bad:
        return None
    return f"no verdict: host contention in run {', '.join(bad)}: rerun on a quiet host or {remedy}"


@dataclass(slots=True)
class CompareResult:
    names: list[str]
    side_by_side: list[dict[str, Any]]  # one dict of headline numbers per run
    deltas: list[list[Delta]]  # per run after the first
    verdicts: list[str]
    warnings: list[str] = field(default_factory=list)
    margin: float = 0.0
    """The smallest relative change that matters (``--margin``); 0: none given."""


def _numbers(r: Report) -> dict[str, Any]:
    """The headline figures of one run: the definitions table's speeds and headline
    percentiles (``analysis.definitions``), and throughput."""
    st = r.stats
    gpus = st.extra.get("throughput", {}).get("gpus") or 1
    out: dict[str, Any] = {
        "requests ok": st.requests["ok"],
        "requests failed": st.requests["failed"],
    }
    sp = speeds(st.latency)
    for x in SPEEDS:
        out[f"{x.label} (tok/s)"] = sp[x.key]
    for m in METRICS:
        for p in m.headline:
            v = st.latency[m.key].values.get(p)
            out[f"{m.label} P{p:g} ({m.unit})"] = None if v is None else v / 1e6
    for f in RUN_FIGURES:  # the run-level figures compare shows (``Figure.compare``)
        if f.compare and f.value is not None:
            out[f.label] = f.value(RunInputs(st, gpus, gpu=r.gpu))
    return out


def _arrays(r: Report) -> dict[str, np.ndarray]:
    t = r.stats.per_request
    ok = t.column("ok").to_numpy(zero_copy_only=False).astype(bool)
    keys = dict.fromkeys([*(st.source for st in STATS), "intended_ns"])
    return {
        k: np.asarray(t.column(k).to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
        for k in keys
    }


def differences(a: RunMeta | Mapping[str, Any], b: RunMeta | Mapping[str, Any]) -> list[str]:
    """What makes two runs (their run.json) not comparable: another trace (content hash),
    model, or option that either run declares load-shaping (``RunMeta.load_options``). The
    servers' URLs may differ: that is what is compared."""
    out = []
    a, b = RunMeta.of(a), RunMeta.of(b)
    if a.trace.sha256 != b.trace.sha256:
        out.append(f"trace {a.trace.path} vs {b.trace.path}")
    if a.target.model != b.target.model:
        out.append(f"model {a.target.model} vs {b.target.model}")
    for k in dict.fromkeys(a.load_options() + b.load_options()):
        if a.option(k) != b.option(k):
            out.append(f"{k} {a.option(k)} vs {b.option(k)}")
    return out


def server_difference_lines(
    metas: Sequence[RunMeta | Mapping[str, Any]], names: Sequence[str]
) -> list[str]:
    """The table's lines on the servers' settings (``analysis.settings``): every setting in
    which a run's server differs from the first's, or that none were recorded."""
    from agent_replay.analysis.settings import setting_differences

    return setting_differences(metas, names)


def check_comparable(
    metas: Sequence[RunMeta | Mapping[str, Any]], names: Sequence[str], force: bool
) -> list[str]:
    """Refuse (InputError) runs that differ in trace, model or timing options, naming what
    differs; with ``force`` the differences become warnings."""
    lines = []
    for m, name in zip(metas[1:], names[1:], strict=True):
        diff = differences(metas[0], m)
        if diff:
            lines.append(f"{name} differs from {names[0]}: {'; '.join(diff)}")
    if lines and not force:
        only_model = all(
            d.startswith("model ") for m in metas[1:] for d in differences(metas[0], m)
        )
        hint = (
            "; pass --force to compare anyway"
            if not only_model
            else ": the same trace and load, served under different model names, which is "
            "expected when the deployments name their model differently (two simulated "
            "engine profiles, a quantized or renamed copy); pass --force to compare them"
        )
        raise InputError("compare: not the same experiment (" + " | ".join(lines) + ")" + hint)
    return [f"not comparable, compared because of --force: {ln}" for ln in lines]


ONE_RUN_WARNING = (
    "one run per side: the intervals cover the variation within each run (time-"
    "block bootstrap), not between runs, which is often larger; repeat the runs "
    "(agent-replay sweep, or compare A1,A2,A3 B1,B2,B3) for intervals that do"
)


PAIRED_ONE_RUN_WARNING = (
    "one run per side, paired request by request: the intervals cover which "
    "requests were played and each request's noise, not a shift that hit "
    "one whole run (a busy hour); repeat the runs (compare A1,A2,A3 "
    "B1,B2,B3) for intervals that do"
)


def compare_reports(
    reports: Sequence[Report],
    names: Sequence[str],
    *,
    resamples: int = 1000,
    seed: int = 0,
    force: bool = False,
    paired: bool = True,
    margin: float = 0.0,
) -> CompareResult:
    """Each run against the first: request by request where both replayed the same plan
    (``analysis.paired``; ``paired=False`` never), else each run's time-block bootstrap.
    A change whose interval lies inside +-``margin`` reads as equivalent, not a finding."""
    from agent_replay.analysis.paired import as_delta, paired_comparison

    warnings = check_comparable([r.meta for r in reports], names, force)
    warnings += server_difference_lines([r.meta for r in reports], names)
    base = _arrays(reports[0])
    raw: list[list[Delta]] = []
    refusals: list[str | None] = []
    busy = [self_check(r.meta, r.stats).contention for r in reports]
    for r, hot in zip(reports[1:], busy[1:], strict=True):
        pc = (
            paired_comparison([(reports[0], r)], [(busy[0], hot)], resamples=resamples, seed=seed)
            if paired
            else "not asked"
        )
        if not isinstance(pc, str):
            raw.append([as_delta(x, pc.design) for x in pc.intervals])
            refusals.append(None)
            continue
        other = _arrays(r)
        raw.append(
            compare_arrays(
                base,
                other,
                resamples=resamples,
                seed=seed,
                order=(base["intended_ns"], other["intended_ns"]),
            )
        )
        refusals.append(pc if pc.startswith("not paired: host contention") else None)
    deltas = with_holm(raw)
    verdicts = []
    for i, (ds, r, name) in enumerate(zip(deltas, reports[1:], names[1:], strict=True)):
        refuse = (
            contention_note([reports[0], r], [names[0], name])
            if (refusals[i] or ds[0].design.startswith("unpaired"))
            else None
        )
        if refuse is not None and refusals[i]:
            refuse += f"; {refusals[i]}"
        if refuse is not None:
            deltas[i] = [
                replace(d, ci_low=None, ci_high=None, p=None, p_holm=None, note=refuse) for d in ds
            ]
            verdicts.append(f"{name} vs {names[0]}: {refuse}")
            continue
        head = ds[0]  # the headline statistic (STATS' first)
        verdicts.append(
            head.verdict(name, margin)
            if head.finding(margin)
            else f"{name} vs {names[0]}: " + head.verdict(name, margin)
        )
        verdicts += [d.verdict(name, margin) for d in ds[1:] if d.finding(margin)]
        verdicts.append(f"{name} vs {names[0]}: {ds[0].design}")
    n_tests = sum(1 for ds in deltas for d in ds if d.p is not None)
    if n_tests:
        verdicts.append(holm_note(n_tests))
    unpaired = [bool(ds) and ds[0].design.startswith("unpaired") for ds in deltas]
    if any(unpaired):
        warnings.append(ONE_RUN_WARNING)
    if not all(unpaired):
        warnings.append(PAIRED_ONE_RUN_WARNING)
    for r, name in zip(reports, names, strict=True):
        warnings += [f"{name}: {w}" for w in r.warnings]
    return CompareResult(
        list(names), [_numbers(r) for r in reports], deltas, verdicts, warnings, margin
    )


def compare_dirs(
    dirs: Sequence[str | os.PathLike[str]],
    *,
    resamples: int = 1000,
    seed: int = 0,
    force: bool = False,
    margin: float = 0.0,
) -> CompareResult:
    reports = [build_report(d) for d in dirs]
    names = [os.path.basename(os.path.normpath(str(d))) or str(d) for d in dirs]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return compare_reports(
        reports, names, resamples=resamples, seed=seed, force=force, margin=margin
    )


ARM_FIGURES: tuple[tuple[str, str, bool], ...] = tuple(
    (f.key, f.label, f.higher_is_better) for f in FIGURES if f.compare
)
"""Each arm's figures, side by side (geometric means of its runs): the definitions table's
figures marked ``compare``."""
ARM_TESTS: tuple[tuple[str, str, bool], ...] = tuple(
    (f.key, f.test_label or f.label, f.higher_is_better) for f in FIGURES if f.tested
)
"""The figures tested between arms (``Figure.tested``): one test per statistic (TPOT P90 is
P90 TPS's reciprocal, so it is tested once, as P90 TPS)."""


def compare_arms(
    arms: Sequence[Sequence[str | os.PathLike[str]]],
    names: Sequence[str],
    *,
    force: bool = False,
    paired: bool = True,
    by_request: bool = True,
    margin: float = 0.0,
) -> CompareResult:
    """Replicate runs per arm: each run's figures (``analysis.points``), the arm's mean, and
    each arm against the first. Where the arms have as many runs (paired by position, as
    ``sweep`` makes them) and each pair replayed one plan, the statistics of per-request
    metrics are compared request by request (``analysis.paired``, the run pairs as strata);
    the others (and every statistic of arms that cannot be paired) with a run-level
    Student-t interval (paired by position when the arms have as many runs); ``by_request``
    False: run-level intervals for every statistic. "Inconclusive"
    when the interval includes 0."""
    reports = [[build_report(d) for d in arm] for arm in arms]
    return compare_arm_reports(
        reports, names, force=force, paired=paired, by_request=by_request, margin=margin
    )


def compare_arm_reports(
    reports: Sequence[Sequence[Report]],
    names: Sequence[str],
    *,
    force: bool = False,
    paired: bool = True,
    by_request: bool = True,
    margin: float = 0.0,
) -> CompareResult:
    """``compare_arms`` on reports already built."""
    from agent_replay.analysis.hist import FEW
    from agent_replay.analysis.paired import as_interval, paired_comparison
    from agent_replay.analysis.points import point_metrics, too_few
    from agent_replay.analysis.replicates import adjust, mean_ci, ratio_ci, verdict

    flat = [r for arm in reports for r in arm]
    warnings = check_comparable(
        [r.meta for r in flat],
        [f"{names[i]}[{j}]" for i, arm in enumerate(reports) for j in range(len(arm))],
        force,
    )
    warnings += server_difference_lines([arm[0].meta for arm in reports], names)
    figs = [[point_metrics(r, gpus=1) for r in arm] for arm in reports]
    side = []
    for rows in figs:
        d: dict[str, Any] = {"runs": len(rows)}
        for key, label, _ in ARM_FIGURES:
            few = FEW if any(too_few(r, key) for r in rows) else ""
            d[f"{label}{few} (geometric mean)"] = mean_ci([r.get(key) for r in rows]).estimate
        side.append(d)
    tests = []
    busy = [[self_check(r.meta, r.stats).contention for r in arm] for arm in reports]
    for i, (name, rows) in enumerate(zip(names[1:], figs[1:], strict=True), start=1):
        twins: dict[str, Any] = {}
        if by_request and paired and len(reports[i]) == len(reports[0]):
            pc = paired_comparison(
                list(zip(reports[0], reports[i], strict=True)),
                list(zip(busy[0], busy[i], strict=True)),
            )
            if not isinstance(pc, str):
                twins = {x.stat.key: as_interval(x, pc.design) for x in pc.intervals}
        for key, label, hib in ARM_TESTS:
            if key in twins:
                tests.append((f"{name} vs {names[0]}, {label}", twins[key], hib))
                continue
            ci = ratio_ci(
                [r.get(key) for r in figs[0]],
                [r.get(key) for r in rows],
                paired=paired and len(rows) == len(figs[0]),
            )
            few = FEW if any(too_few(r, key) for r in figs[0] + rows) else ""
            tests.append((f"{name} vs {names[0]}, {label}{few}", ci, hib))
    adjusted = adjust([ci for _, ci, _ in tests])
    verdicts = [
        verdict(label, ci, hib, margin) for (label, _, hib), ci in zip(tests, adjusted, strict=True)
    ]
    n = sum(1 for c in adjusted if c.p is not None)
    if n:
        verdicts.append(holm_note(n))
    if any(too_few(r, key) for rows in figs for r in rows for key, _, _ in ARM_FIGURES):
        warnings.append(
            f"{FEW} a run's percentile over fewer samples than it needs (P90 >= "
            f"{min_count_for(90)}, P99 >= {min_count_for(99)})"
        )
    if any(len(a) < 2 for a in reports):
        warnings.append("an arm has a single run: no run-to-run interval for it")
    return CompareResult(list(names), side, [[] for _ in names[1:]], verdicts, warnings, margin)


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
            deltas.append(
                f"{100 * (v / base - 1):+.1f}%"
                if isinstance(v, (int, float)) and isinstance(base, (int, float)) and base
                else "-"
            )
        rows.append([key, *[_fmt(v) for v in vals], *deltas])
    return head, rows


def render_compare(c: CompareResult) -> Group:
    parts: list[Any] = [safe.text(w, style="yellow") for w in c.warnings]
    head, rows = _rows(c)
    t = Table(title="Side by side", title_justify="left", show_edge=False)
    for i, h in enumerate(head):  # run names come from folders and run.json: data, not markup
        t.add_column(safe.text(h), justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(safe.text(x) for x in row))
    parts.append(t)
    for name, ds in zip(c.names[1:], c.deltas, strict=True):
        if not ds:  # replicate arms: the verdicts carry the run-level intervals
            continue
        bt = Table(
            title=safe.text(
                f"{name} vs {c.names[0]}: 95% CI of the change (log ratio); {ds[0].design}"
            ),
            title_justify="left",
            show_edge=False,
        )
        for h in ("statistic", c.names[0], name, "change", "95% CI", "Holm p", "significant"):
            bt.add_column(safe.text(h), justify="left" if h == "statistic" else "right")
        for d in ds:
            bt.add_row(
                d.label,
                _fmt(d.base),
                _fmt(d.value),
                "-" if d.change is None else f"{100 * d.change:+.1f}%",
                "-"
                if d.ci_low is None or d.ci_high is None
                else f"{100 * d.ci_low:+.1f}% .. {100 * d.ci_high:+.1f}%",
                "-" if d.p_holm is None else f"{d.p_holm:.3g}",
                _significance(d, c.margin),
            )
        parts.append(bt)
    parts.append(
        Text("TPS values in tok/s, times in ms; TPS change = ratio of speeds.", style="dim")
    )
    parts += [safe.text(v, style="bold") for v in c.verdicts]
    return Group(*parts)


def _significance(delta: Delta, margin: float) -> str:
    if not delta.significant:
        return "no"
    return "yes" if delta.finding(margin) else "yes, < margin"


def to_markdown(c: CompareResult) -> str:
    head, rows = _rows(c)
    lines = [f"> {safe.plain(w)}" for w in c.warnings]
    lines += ["| " + " | ".join(map(safe.plain, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(safe.plain, r)) + " |" for r in rows]
    lines += [""] + [f"- **{safe.plain(v)}**" for v in c.verdicts]
    return "\n".join(lines) + "\n"


def to_json(c: CompareResult) -> str:
    d = {
        "names": c.names,
        "side_by_side": c.side_by_side,
        "verdicts": c.verdicts,
        "warnings": c.warnings,
        "margin": c.margin,
        "deltas": [
            [asdict(x) | {"significant": x.significant, "finding": x.finding(c.margin)} for x in ds]
            for ds in c.deltas
        ],
    }
    return orjson.dumps(d, option=orjson.OPT_INDENT_2).decode() + "\n"
