"""Run-level statistics over replicate runs: the interval a decision between deployments
needs covers the spread between runs, not only the spread between requests of one run.

* ``mean_ci``: mean of replicate values with a Student-t interval.
* ``paired_ci``: the difference B - A (absolute and relative to A's mean) over repeats run
  as pairs (same repeat index, interleaved), Student-t on the per-pair differences; with
  unpaired or unequal counts, Welch's interval.
* ``verdict``: "inconclusive" whenever the interval includes 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: float) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (table to 30, then
    the normal 1.96 plus the first correction term)."""
    if df < 1:
        return math.inf
    if df <= 30:
        lo = math.floor(df)
        hi = min(lo + 1, 30)
        a, b = _T975[lo - 1], _T975[hi - 1]
        return a + (b - a) * (df - lo)
    return 1.959964 + 2.37 / df


@dataclass(frozen=True, slots=True)
class Interval:
    estimate: float | None
    low: float | None
    high: float | None
    n: int
    method: str

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def _clean(values: Sequence[float | None]) -> np.ndarray:
    a = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return a[~np.isnan(a)]


def mean_ci(values: Sequence[float | None], *, lower: float | None = None) -> Interval:
    """The mean with a Student-t 95% interval. ``lower``: the least value the quantity can
    take (0 for speeds, throughputs, latencies): the interval is cut there, since a mean of
    such values cannot lie below it (cutting keeps the coverage)."""
    v = _clean(values)
    if v.size == 0:
        return Interval(None, None, None, 0, "none")
    m = float(v.mean())
    if v.size < 2:
        return Interval(m, None, None, int(v.size), "one run: no run-to-run interval")
    half = t975(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    low = m - half
    if lower is not None and low < lower:
        return Interval(m, lower, m + half, int(v.size), f"t, {v.size} runs, cut at {lower:g}")
    return Interval(m, low, m + half, int(v.size), f"t, {v.size} runs")


def paired_ci(a: Sequence[float | None], b: Sequence[float | None], *,
              paired: bool = True, relative: bool = True) -> Interval:
    """Interval of mean(b) - mean(a) (relative: divided by mean(a)). ``paired``: a[i], b[i]
    come from the same repeat; pairs with a missing side are left out."""
    if paired and len(a) == len(b):
        both = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None
                and not (math.isnan(float(x)) or math.isnan(float(y)))]
        if not both:
            return Interval(None, None, None, 0, "none")
        xa = np.asarray([p[0] for p in both], dtype=np.float64)
        xb = np.asarray([p[1] for p in both], dtype=np.float64)
        d = xb - xa
        scale = float(xa.mean()) if relative else 1.0
        if relative and scale == 0:
            return Interval(None, None, None, int(d.size), "mean of A is 0")
        est = float(d.mean()) / scale
        if d.size < 2:
            return Interval(est, None, None, int(d.size), "one pair: no run-to-run interval")
        half = t975(d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size) / abs(scale)
        return Interval(est, est - half, est + half, int(d.size), f"paired t, {d.size} pairs")
    xa, xb = _clean(a), _clean(b)
    if xa.size == 0 or xb.size == 0:
        return Interval(None, None, None, 0, "none")
    scale = float(xa.mean()) if relative else 1.0
    est = (float(xb.mean()) - float(xa.mean())) / scale
    if xa.size < 2 or xb.size < 2:
        return Interval(est, None, None, int(min(xa.size, xb.size)), "one run per arm")
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (xa.size - 1)) + (vb ** 2 / (xb.size - 1))) if se > 0 else 1.0
    half = t975(df) * se / abs(scale)
    return Interval(est, est - half, est + half, int(min(xa.size, xb.size)), "Welch t")


def verdict(label: str, ci: Interval, higher_is_better: bool = True) -> str:
    """One line: the change with its interval, and "inconclusive" when it includes 0."""
    if ci.estimate is None:
        return f"{label}: not enough data"
    if ci.low is None or ci.high is None:
        return f"{label}: {100 * ci.estimate:+.1f}% (inconclusive: {ci.method})"
    span = f"{100 * ci.estimate:+.1f}% (95% CI {100 * ci.low:+.1f}% to {100 * ci.high:+.1f}%, {ci.method})"
    if not ci.excludes_zero:
        return f"{label}: {span}: inconclusive, the run-to-run spread covers the difference"
    better = (ci.estimate > 0) == higher_is_better
    return f"{label}: {span}: {'better' if better else 'worse'}"
