"""The GPU telemetry plot (``gpu.png`` of ``agent-replay report --plots``): per GPU power
and utilization over the run's clock, above the requests in flight, the measured window
shaded. matplotlib comes from ``analysis.plots``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agent_replay.analysis.report import Report

NAME = "gpu.png"
NS = 1e9


def in_flight(sent_ns: np.ndarray, end_ns: np.ndarray, grid_ns: np.ndarray) -> np.ndarray:
    """Requests sent at or before each grid time and not yet ended (NaN sends ignored; a
    request without an end counts until the grid ends)."""
    s = np.sort(sent_ns[~np.isnan(sent_ns)])
    e = np.sort(end_ns[~np.isnan(end_ns) & ~np.isnan(sent_ns)])
    return (
        np.searchsorted(s, grid_ns, side="right") - np.searchsorted(e, grid_ns, side="right")
    ).astype(np.int64)


def plot_gpu(report: Report, path: Path, plt: Any) -> Path:
    t = report.gpu_samples
    assert t is not None
    ts = np.asarray(t.column("t_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    gpu = np.asarray(t.column("gpu").to_numpy(zero_copy_only=False))

    def col(name: str) -> np.ndarray:
        return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

    power, util, sm = col("power_w"), col("gpu_util_pct"), col("sm_active_pct")
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for g in np.unique(gpu):
        sel = gpu == g
        order = np.argsort(ts[sel])
        x = ts[sel][order] / NS
        ax1.plot(x, power[sel][order], lw=1, label=f"GPU {g}")
        line = ax2.plot(x, util[sel][order], lw=1, label=f"GPU {g} util")[0]
        if not np.isnan(sm[sel]).all():
            ax2.plot(
                x, sm[sel][order], lw=1, ls="--", color=line.get_color(), label=f"GPU {g} SM active"
            )
    req = report.stats.per_request
    sent = np.asarray(req.column("sent_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    end = np.asarray(req.column("end_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    grid = np.linspace(np.nanmin(ts), np.nanmax(ts), 2000) if ts.size else np.zeros(0)
    ax3.step(grid / NS, in_flight(sent, end, grid), where="post", color="tab:orange")
    w = report.stats.extra.get("window_ns")
    for ax in (ax1, ax2, ax3):
        if w:
            ax.axvspan(w[0] / NS, w[1] / NS, color="0.9", zorder=0)
        ax.grid(True, alpha=0.3)
    ax1.set_ylabel("power W")
    ax2.set_ylabel("utilization %")
    ax3.set_ylabel("requests in flight")
    ax3.set_xlabel("seconds on the run's clock (shaded: the measured window)")
    g = report.gpu or {}
    jt = g.get("j_per_output_token")
    ax1.set_title(
        "GPU power and utilization with the requests in flight"
        + (f" ({jt:.3f} J per output token)" if jt else "")
    )
    if np.unique(gpu).size <= 8:
        ax1.legend(fontsize=7, ncol=4)
        ax2.legend(fontsize=7, ncol=4)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
