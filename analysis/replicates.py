"""Run-level statistics over replicate runs: the interval a decision between deployments
needs covers the spread between runs, not only the spread between requests of one run.

Every figure these functions see is a positive quantity (a speed, a latency, a throughput),
and run-to-run noise on such figures is multiplicative. So intervals live on the log scale:

* ``mean_ci``: the geometric mean of replicate values with a Student-t interval on their
  logarithms (never below zero); values that are not all positive fall back to the
  arithmetic mean.
* ``ratio_ci``: the change of B against A as a ratio, from the logs of the per-repeat ratios
  (paired: same repeat index, interleaved) or Welch's interval on the logs (unpaired); the
  percent change and its bounds are exp(log-ratio) - 1, so never below -100%. It carries the
  two-sided p-value of the t test of a log ratio of 0.
* ``holm``: Holm's step-down adjustment of the p-values of one table's comparisons.
* ``verdict``: "inconclusive" unless the Holm-adjusted p-value is below ``ALPHA``.

A statistic and its reciprocal (P90 TPS = 1 / P90 TPOT) have log ratios of opposite sign
and the same size: they are one test, with one verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

ALPHA = 0.05
"""Family-wise error rate of one table's verdicts (Holm)."""

_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isnan(t) or df <= 0:
        return 1.0
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True, slots=True)
class Interval:
    estimate: float | None
    low: float | None
    high: float | None
    n: int
    method: str
    p: float | None = None
    """Two-sided p-value of "no difference" (comparisons only)."""
    p_adjusted: float | None = None
    """``p`` after Holm's adjustment across the comparisons of one table."""

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    @property
    def significant(self) -> bool:
        """The verdict: the Holm-adjusted p-value (the raw one before adjustment) below
        ``ALPHA``."""
        p = self.p_adjusted if self.p_adjusted is not None else self.p
        return p is not None and p < ALPHA and self.excludes_zero


def _clean(values: Sequence[float | None]) -> np.ndarray:
    a = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    return a[~np.isnan(a)]


def mean_ci(values: Sequence[float | None], *, lower: float | None = None) -> Interval:
    """Geometric mean of positive replicate values with a 95% Student-t interval on their
    logs (bounds exp(mean log +- t se)), which never leaves the positive half-line;
    arithmetic mean and interval otherwise, cut at ``lower`` (the least value the quantity
    can take, e.g. 0) when given."""
    v = _clean(values)
    if v.size == 0:
        return Interval(None, None, None, 0, "none")
    log = bool(np.all(v > 0))
    w = np.log(v) if log else v
    m = float(w.mean())
    back = math.exp if log else float
    if v.size < 2:
        return Interval(float(v[0]), None, None, 1, "one run: no run-to-run interval")
    half = t975(v.size - 1) * float(w.std(ddof=1)) / math.sqrt(v.size)
    if log:
        return Interval(
            back(m),
            back(m - half),
            back(m + half),
            int(v.size),
            f"t on logs, {v.size} runs (geometric mean)",
        )
    if lower is not None and m - half < lower:
        return Interval(m, lower, m + half, int(v.size), f"t, {v.size} runs, cut at {lower:g}")
    return Interval(m, m - half, m + half, int(v.size), f"t, {v.size} runs")


def ratio_ci(
    a: Sequence[float | None], b: Sequence[float | None], *, paired: bool = True
) -> Interval:
    """B against A as a relative change, exp(mean log(b / a)) - 1, with a 95% interval and a
    p-value from the t test on the log ratios. ``paired``: a[i], b[i] come from the same
    repeat (pairs with a missing side are left out); else Welch's test on the logs."""
    test = _paired_logs(a, b) if paired and len(a) == len(b) else _welch_logs(a, b)
    if isinstance(test, Interval):
        return test
    est, se, df, method = test
    n = int(min(len(a), len(b)))
    if se == 0:
        p = 1.0 if est == 0 else 0.0
        return Interval(math.expm1(est), math.expm1(est), math.expm1(est), n, method, p)
    half = t975(df) * se
    p = t_two_sided_p(est / se, df)
    return Interval(math.expm1(est), math.expm1(est - half), math.expm1(est + half), n, method, p)


LogTest = tuple[float, float, float, str]
"""The mean log ratio, its standard error, the degrees of freedom and the method's name."""


def _pairs(a: Sequence[float | None], b: Sequence[float | None]) -> list[tuple[float, float]]:
    """The pairs with both sides known (not None, not NaN)."""
    return [
        (float(x), float(y))
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and not (math.isnan(float(x)) or math.isnan(float(y)))
    ]


def _paired_logs(a: Sequence[float | None], b: Sequence[float | None]) -> Interval | LogTest:
    """The paired t test on the log ratios of the pairs with both sides; an Interval when
    no test can be made."""
    both = _pairs(a, b)
    if not both:
        return Interval(None, None, None, 0, "none")
    if any(x <= 0 or y <= 0 for x, y in both):
        return Interval(None, None, None, len(both), "a value <= 0: no ratio")
    d = np.log([y / x for x, y in both])
    est = float(d.mean())
    if d.size < 2:
        return Interval(math.expm1(est), None, None, 1, "one pair: no run-to-run interval")
    return (
        est,
        float(d.std(ddof=1)) / math.sqrt(d.size),
        float(d.size - 1),
        f"paired t on log ratios, {d.size} pairs",
    )


def _welch_logs(a: Sequence[float | None], b: Sequence[float | None]) -> Interval | LogTest:
    """Welch's t test on the logs of two arms; an Interval when no test can be made."""
    xa, xb = _clean(a), _clean(b)
    if xa.size == 0 or xb.size == 0:
        return Interval(None, None, None, 0, "none")
    if np.any(xa <= 0) or np.any(xb <= 0):
        return Interval(None, None, None, int(min(xa.size, xb.size)), "a value <= 0: no ratio")
    la, lb = np.log(xa), np.log(xb)
    est = float(lb.mean() - la.mean())
    if xa.size < 2 or xb.size < 2:
        return Interval(math.expm1(est), None, None, int(min(xa.size, xb.size)), "one run per arm")
    va, vb = la.var(ddof=1) / la.size, lb.var(ddof=1) / lb.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (la.size - 1)) + (vb**2 / (lb.size - 1))) if se > 0 else 1.0
    return est, se, float(df), "Welch t on logs"


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count): the i-th
    smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: float(ps[i] or 0.0))
    m = len(idx)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for j, i in enumerate(idx):
        running = max(running, min(1.0, (m - j) * float(ps[i] or 0.0)))
        out[i] = running
    return out


def adjust(cis: Sequence[Interval]) -> list[Interval]:
    """The intervals with their Holm-adjusted p-values (one family: one table)."""
    adj = holm([c.p for c in cis])
    return [replace(c, p_adjusted=q) for c, q in zip(cis, adj, strict=True)]


def holm_note(m: int) -> str:
    """The sentence a table of ``m`` comparisons carries."""
    return (
        f"Verdicts are Holm-corrected across the {m} comparisons of this table "
        f"(family-wise error {ALPHA:.0%}); the intervals are 95% each, uncorrected."
    )


def inside_margin(low: float | None, high: float | None, margin: float) -> bool:
    """Whether an interval of a relative change lies wholly inside +-``margin`` (the
    smallest change that matters; 0: none given, never inside)."""
    return margin > 0 and low is not None and high is not None and -margin < low and high < margin


def margin_verdict(change: float, span: str, significant: bool, margin: float) -> str:
    """The verdict of a change whose interval lies inside +-``margin``: equivalent for the
    comparison, or a real difference smaller than the margin."""
    bound = f"+-{100 * margin:g}%"
    if significant:
        return f"{span}: a real difference of {100 * change:+.1f}%, smaller than the {bound} margin"
    return f"{span}: equivalent within the {bound} margin"


def verdict(label: str, ci: Interval, higher_is_better: bool = True, margin: float = 0.0) -> str:
    """One line: the change with its interval and p-values; "inconclusive" unless the
    Holm-adjusted p-value is below ``ALPHA``; with a ``margin``, an interval wholly inside
    it reads as equivalent (``margin_verdict``)."""
    if ci.estimate is None:
        return f"{label}: not enough data"
    if ci.low is None or ci.high is None:
        return f"{label}: {100 * ci.estimate:+.1f}% (inconclusive: {ci.method})"
    ps = (
        ""
        if ci.p is None
        else f", p={ci.p:.3g}" + ("" if ci.p_adjusted is None else f", Holm p={ci.p_adjusted:.3g}")
    )
    span = (
        f"{100 * ci.estimate:+.1f}% (95% CI {100 * ci.low:+.1f}% to {100 * ci.high:+.1f}%, "
        f"{ci.method}{ps})"
    )
    if inside_margin(ci.low, ci.high, margin):
        return f"{label}: " + margin_verdict(ci.estimate, span, ci.significant, margin)
    if not ci.excludes_zero:
        return f"{label}: {span}: inconclusive, the run-to-run spread covers the difference"
    if not ci.significant:
        return f"{label}: {span}: inconclusive after the Holm correction"
    better = (ci.estimate > 0) == higher_is_better
    return f"{label}: {span}: {'better' if better else 'worse'}"
