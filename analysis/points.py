"""One run as one point of a sweep: the figures a frontier, a capacity search and an index
table need, from a ``Report`` (so from the same statistics the report prints).

Throughput per GPU = tokens / (last byte - first intended send) / GPUs (docs/metrics.md,
"Across runs"); cost per million tokens = the deployment's USD per hour / tokens per hour x 1e6.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from agent_replay.analysis.definitions import METRICS, SPEEDS, headline_figures, speeds
from agent_replay.analysis.gpu_energy import POINT_FIELDS as ENERGY_FIELDS
from agent_replay.analysis.gpu_energy import point_figures
from agent_replay.analysis.hist import min_count_for
from agent_replay.analysis.metrics import NS
from agent_replay.analysis.report import Report

POINT_FIELDS: tuple[tuple[str, str], ...] = (
    ("requests_ok", "requests"), ("requests_failed", "requests"), ("duration_s", "s"),
    *((key, "tok/s") for key, _, _, _ in SPEEDS),
    *((f"{m.key}_p{p:g}_ms", "ms") for m in METRICS for p in m.headline),
    ("output_tps", "tok/s"), ("total_tps", "tok/s"),
    ("output_tps_per_gpu", "tok/s/GPU"), ("total_tps_per_gpu", "tok/s/GPU"),
    ("usd_per_m_output", "USD"), ("usd_per_m_total", "USD"), ("revenue_per_gpu_hour", "USD"),
    *ENERGY_FIELDS,
    *((f"{k}_n", "samples") for k in ("ttft", "tpot", "e2e", "e2e_per_token", "itl", "schedule_lag")),
)
"""The per-run figures of a sweep's index table, with their units (the energy figures None
when the run has no GPU telemetry), and the sample counts behind its percentiles."""

_SPEED_PCT = {"p90_tps": 90.0, "median_tps": 50.0, "interactivity": 90.0}


def basis(key: str) -> tuple[str, float] | None:
    """The (metric, percentile) behind a percentile figure of the index (``p90_tps`` is the
    P90 of TPOT, ``ttft_p99_ms`` the P99 of TTFT); None for other figures."""
    src = {k: s for k, _, s, _ in SPEEDS}
    if key in src:
        return src[key], _SPEED_PCT[key]
    for m in METRICS:
        for p in m.headline:
            if key == f"{m.key}_p{p:g}_ms":
                return m.key, p
    return None


def too_few(row: Mapping[str, Any], key: str) -> bool:
    """True when the figure ``key`` of a run is a percentile of fewer samples than it needs
    (``analysis.hist.min_count_for``: P90 10, P99 100): the report's ``*`` rule. A run
    indexed without counts falls back to its successful requests for per-request metrics."""
    b = basis(key)
    if b is None or row.get(key) is None:
        return False
    n = row.get(f"{b[0]}_n")
    if n is None and b[0] in ("ttft", "e2e", "e2e_per_token", "tpot"):
        n = row.get("requests_ok")
    return n is not None and int(n) < min_count_for(b[1])


def point_metrics(report: Report, gpus: int, usd_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """The run's figures: speeds and headline percentiles from the definitions table
    (``analysis.definitions``), throughput per GPU, cost and revenue, and the energy figures
    of ``analysis.gpu_energy.point_figures``."""
    st = report.stats
    lat = st.latency
    secs = st.duration_ns / NS if st.duration_ns else None
    out_tps = st.tokens["output"] / secs if secs else None
    total_tps = (st.tokens["output"] + st.tokens["input"]) / secs if secs else None
    figures = headline_figures(lat)
    row: dict[str, Any] = {
        "requests_ok": st.requests["ok"], "requests_failed": st.requests["failed"],
        "duration_s": secs, **speeds(lat),
        **{k: figures.get(k) for k, unit in POINT_FIELDS if unit == "ms"},
        "output_tps": out_tps, "total_tps": total_tps,
        "output_tps_per_gpu": out_tps / gpus if out_tps is not None else None,
        "total_tps_per_gpu": total_tps / gpus if total_tps is not None else None,
        "usd_per_m_output": None, "usd_per_m_total": None,
        "revenue_per_gpu_hour": (st.economics or {}).get("usd_per_gpu_hour"),
        **point_figures(report.gpu),
        **{f: lat[f.removesuffix("_n")].count for f, unit in POINT_FIELDS
           if unit == "samples" and f.removesuffix("_n") in lat},
    }
    if usd_per_gpu_hour is not None:
        per_hour = usd_per_gpu_hour * gpus
        if out_tps:
            row["usd_per_m_output"] = per_hour / (out_tps * 3600) * 1e6
        if total_tps:
            row["usd_per_m_total"] = per_hour / (total_tps * 3600) * 1e6
    return row


def empty_point() -> dict[str, Any]:
    return {k: None for k, _ in POINT_FIELDS}


def meets(row: Mapping[str, Any], key: str, op: str, bound: float) -> bool:
    v = row.get(key)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return False
    return bool(v >= bound) if op == ">=" else bool(v <= bound)
