"""Is a run's start cold? A server's first seconds can be slow for reasons the workload does
not cause (JIT compilation, CUDA graph capture, an empty prefix cache), and a comparison that
includes them can reverse its conclusion. ``cold_start`` flags a run when

* nothing warmed the server before it (no ``--warmup`` window and no warm-up replay), or
* its first window is an outlier: the median TPOT of requests sent in the first
  ``WINDOW_FRACTION`` of the run (at most ``WINDOW_MAX_S``) is ``RATIO`` times the rest's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

WINDOW_FRACTION = 0.1
WINDOW_MAX_S = 4.0
RATIO = 1.5
MIN_WINDOW = 5
MIN_REST = 20


def start_outlier(per_request: pa.Table) -> str | None:
    """The outlier test on a run's rows (``analysis.runstats`` per-request table)."""
    if per_request.num_rows == 0:
        return None
    ok = np.asarray(per_request.column("ok").to_numpy(zero_copy_only=False), dtype=bool)
    t = np.asarray(per_request.column("intended_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    tpot = np.asarray(per_request.column("tpot").to_numpy(zero_copy_only=False), dtype=np.float64)
    keep = ok & ~np.isnan(tpot)
    t, tpot = t[keep], tpot[keep]
    if t.size < MIN_WINDOW + MIN_REST:
        return None
    start, span = float(t.min()), float(t.max() - t.min())
    window = min(span * WINDOW_FRACTION, WINDOW_MAX_S * 1e9)
    first = t <= start + window
    if first.sum() < MIN_WINDOW or (~first).sum() < MIN_REST:
        return None
    a, b = float(np.median(tpot[first])), float(np.median(tpot[~first]))
    if b > 0 and a >= RATIO * b:
        return (f"the first {window / 1e9:.1f} s look cold: median TPOT {a / 1e6:.2f} ms against "
                f"{b / 1e6:.2f} ms after ({a / b:.1f}x)")
    return None


def cold_start(meta: Mapping[str, Any], per_request: pa.Table) -> str | None:
    """Why this run's start may be cold (None: no sign of it)."""
    why = start_outlier(per_request)
    if why:
        return why
    opts = meta.get("options") or {}
    if not meta.get("warmup_ns") and not opts.get("warmed_up"):
        return ("no warm-up: the server may have been cold at the start (use --warmup SECONDS, "
                "or agent-replay sweep, which warms up before each run)")
    return None
