"""Is a run's start cold? A server's first seconds can be slow for reasons the workload does
not cause (JIT compilation, CUDA graph capture, an empty prefix cache), and a comparison that
includes them can reverse its conclusion. ``cold_start`` flags a run when

* nothing warmed the server before it (no ``--warmup`` window, no warm-up request of its
  own such as an AgentX warm-up phase's, and no warm-up replay),
* the sweep's warm-up replay before it never became steady (``warmup.json``), or
* its first window is an outlier: the median TPOT of requests sent in the first
  ``WINDOW_FRACTION`` of the run (at most ``WINDOW_MAX_S``) is ``RATIO`` times the rest's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from agent_replay.runmeta import RunMeta

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
    t = np.asarray(
        per_request.column("intended_ns").to_numpy(zero_copy_only=False), dtype=np.float64
    )
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
        return (
            f"the first {window / 1e9:.1f} s look cold: median TPOT {a / 1e6:.2f} ms against "
            f"{b / 1e6:.2f} ms after ({a / b:.1f}x)"
        )
    return None


def unsteady_warmup(path: str | os.PathLike[str]) -> str | None:
    """Why a sweep's warm-up (its ``warmup.json``) did not leave the server warm: it never
    had two bursts in a row with median TPOT within its tolerance. None when it did."""
    import json

    try:
        w = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(w, dict) or w.get("steady", True):
        return None
    meds = [b.get("tpot_p50_ms") for b in w.get("bursts", []) if isinstance(b, dict)]
    shown = ", ".join("-" if m is None else f"{m:.2f}" for m in meds)
    return (
        f"warm-up not reached: {len(meds)} warm-up bursts never had two in a row with median "
        f"TPOT within {100 * float((w.get('policy') or {}).get('tolerance', 0)):.0f}% "
        f"({shown} ms): the server may not have been warm (a longer [warmup] max_bursts "
        "or burst_s helps)"
    )


def cold_start(
    meta: RunMeta | Mapping[str, Any],
    per_request: pa.Table,
    results_dir: str | os.PathLike[str] | None = None,
    warmup_rows: int = 0,
) -> str | None:
    """Why this run's start may be cold (None: no sign of it). A sweep's warm-up replay is
    known from run.json (``options.warmed_up``) or from its folder beside the run's;
    ``warmup_rows``: the run's own warm-up requests (an AgentX warm-up phase, ``--warmup``),
    which warmed the server when there are any."""
    why = start_outlier(per_request)
    if why:
        return why
    meta = RunMeta.of(meta)
    warm_dir = (
        None
        if results_dir is None
        else Path(results_dir).with_name(Path(results_dir).name + ".warmup")
    )
    if warm_dir is not None and (warm_dir / "warmup.json").exists():
        return unsteady_warmup(warm_dir / "warmup.json")
    if not meta.warmup_ns and not meta.warmed_up and not warmup_rows:
        return (
            "no warm-up: the server may have been cold at the start (use --warmup SECONDS, "
            "or agent-replay sweep, which warms up before each run)"
        )
    return None
