"""The points of a metric's CDF, for every drawing of it (the report's PNG plot, the HTML
pages): the same per-request values (exact) or the same HdrHistogram (per-token metrics)
whose percentiles the tables print."""

from __future__ import annotations

from typing import Any

import numpy as np

from agent_replay.analysis.definitions import BY_KEY
from agent_replay.analysis.report import Report

CDF_POINTS = 2000
"""At most this many points per CDF line (quantiles evenly spaced; exact values)."""
MARKED = (50.0, 90.0, 99.0)
"""The percentiles marked on a CDF (and kept when it is thinned)."""
ZERO_MS = 1e-3
"""Where a log axis draws a value of 0 ms (tokens that came in one chunk); the chart says
how many it drew there (``zero_fraction``)."""


def _col(t: Any, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _ok(report: Report) -> np.ndarray:
    return report.stats.per_request.column("ok").to_numpy(zero_copy_only=False).astype(bool)


def cdf_points(report: Report, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(values in ms, fraction at or below) of one CDF metric: the exact per-request values
    of the rows the metric covers, or the histogram's buckets for a per-token metric; at
    most CDF_POINTS points, each an observed value and its exact fraction."""
    d = BY_KEY[key]
    if d.per != "request":
        hist = report.stats.extra.get("hists", {}).get(key)
        if hist is None:
            return np.zeros(0), np.zeros(0)
        v, f = hist.cdf()
    else:
        t = report.stats.per_request
        vals = _col(t, key)
        if d.rows != "all":
            vals = vals[_ok(report)]
        v = np.sort(vals[~np.isnan(vals)])
        f = np.arange(1, v.size + 1, dtype=np.float64) / max(1, v.size)
    if v.size > CDF_POINTS:  # evenly spaced ranks and the marked percentiles' own
        idx = np.linspace(0, v.size - 1, CDF_POINTS).round().astype(np.int64)
        at = np.searchsorted(f, np.asarray(MARKED) / 100 - 1e-12)
        idx = np.unique(np.concatenate((idx, np.minimum(at, v.size - 1))))
        v, f = v[idx], f[idx]
    return v / 1e6, f


def zero_fraction(v: np.ndarray, f: np.ndarray) -> float:
    """The fraction of a CDF's samples that are 0 (tokens that came in one chunk): a log
    axis cannot draw them where they are."""
    zero = v <= 0
    return float(f[zero][-1]) if zero.any() else 0.0
