"""One run as one point of a sweep: the figures a frontier, a capacity search and an index
table need, from a ``Report`` (so from the same statistics the report prints).

Throughput per GPU = tokens / (last byte - first intended send) / GPUs (METRICS.md "across
runs"); cost per million tokens = the deployment's USD per hour / tokens per hour x 1e6.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from analysis.hist import percentile_summary
from analysis.metrics import NS
from analysis.report import Report

POINT_FIELDS: tuple[tuple[str, str], ...] = (
    ("requests_ok", "requests"), ("requests_failed", "requests"), ("duration_s", "s"),
    ("p90_tps", "tok/s"), ("median_tps", "tok/s"), ("interactivity", "tok/s"),
    ("ttft_p50_ms", "ms"), ("ttft_p90_ms", "ms"), ("ttft_p99_ms", "ms"),
    ("tpot_p50_ms", "ms"), ("tpot_p90_ms", "ms"), ("e2e_p90_ms", "ms"),
    ("schedule_lag_p99_ms", "ms"),
    ("output_tps", "tok/s"), ("total_tps", "tok/s"),
    ("output_tps_per_gpu", "tok/s/GPU"), ("total_tps_per_gpu", "tok/s/GPU"),
    ("usd_per_m_output", "USD"), ("usd_per_m_total", "USD"), ("revenue_per_gpu_hour", "USD"),
)
"""The per-run figures of a sweep's index table, with their units."""


def interactivity(per_request: Any) -> float | None:
    """InferenceX's E2E-normalized interactivity: per request r = E2E / N (output tokens),
    then 1 / P90(r), in tokens/s (ok requests with N >= 1)."""
    t = per_request
    ok = np.asarray(t.column("ok").to_numpy(zero_copy_only=False), dtype=bool)
    e2e = np.asarray(t.column("e2e").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    n = np.asarray(t.column("output_tokens").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    keep = (n >= 1) & ~np.isnan(e2e)
    p90 = percentile_summary(e2e[keep] / n[keep], (90.0,)).values[90.0]
    return None if p90 is None or p90 <= 0 else NS / p90


def point_metrics(report: Report, gpus: int, usd_per_gpu_hour: float | None = None) -> dict[str, Any]:
    st = report.stats
    tp = st.extra.get("throughput", {})

    def ms(metric: str, p: float) -> float | None:
        v = st.latency[metric].values.get(p)
        return None if v is None else v / 1e6

    secs = st.duration_ns / NS if st.duration_ns else None
    out_tps = st.tokens["output"] / secs if secs else None
    total_tps = (st.tokens["output"] + st.tokens["input"]) / secs if secs else None
    row: dict[str, Any] = {
        "requests_ok": st.requests["ok"], "requests_failed": st.requests["failed"],
        "duration_s": secs,
        "p90_tps": st.tps.values.get(90.0), "median_tps": st.tps.values.get(50.0),
        "interactivity": interactivity(st.per_request) if st.per_request.num_rows else None,
        "ttft_p50_ms": ms("ttft", 50.0), "ttft_p90_ms": ms("ttft", 90.0),
        "ttft_p99_ms": ms("ttft", 99.0), "tpot_p50_ms": ms("tpot", 50.0),
        "tpot_p90_ms": ms("tpot", 90.0), "e2e_p90_ms": ms("e2e", 90.0),
        "schedule_lag_p99_ms": ms("schedule_lag", 99.0),
        "output_tps": out_tps, "total_tps": total_tps,
        "output_tps_per_gpu": out_tps / gpus if out_tps is not None else None,
        "total_tps_per_gpu": total_tps / gpus if total_tps is not None else None,
        "usd_per_m_output": None, "usd_per_m_total": None,
        "revenue_per_gpu_hour": (st.economics or {}).get("usd_per_gpu_hour"),
    }
    del tp
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
