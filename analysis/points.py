"""One run as one point of a sweep: the figures a frontier, a capacity search and an index
table need, from a ``Report`` (so from the same statistics the report prints). Every figure
is an entry of the definitions table (``analysis.definitions.FIGURES``).

Throughput per GPU = tokens / (last byte - first intended send) / GPUs (docs/metrics.md,
"Across runs"); cost per million tokens = the deployment's USD per hour / tokens per hour x 1e6.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from agent_replay.analysis.definitions import (
    FIGURES,
    METRICS,
    SPEEDS,
    RunInputs,
    run_figures,
)
from agent_replay.analysis.hist import min_count_for
from agent_replay.analysis.report import Report

POINT_FIELDS: tuple[tuple[str, str], ...] = (
    *((f.key, f.unit) for f in FIGURES),
    *(
        (f"{k}_n", "samples")
        for k in ("ttft", "tpot", "e2e", "e2e_per_token", "itl", "schedule_lag")
    ),
)
"""The per-run figures of a sweep's index table (every entry of ``FIGURES``), with their
units (the energy figures None when the run has no GPU telemetry, the goodput figures None
without an SLO), and the sample counts behind its percentiles."""


def basis(key: str) -> tuple[str, float] | None:
    """The (metric, percentile) behind a percentile figure of the index (``p90_tps`` is the
    P90 of TPOT, ``ttft_p99_ms`` the P99 of TTFT); None for other figures."""
    for sp in SPEEDS:
        if key == sp.key:
            return sp.source, sp.percentile
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
    if n is None and b[0] in ("ttft", "e2e", "e2e_per_token", "agentx_itl", "tpot"):
        n = row.get("requests_ok")
    return n is not None and int(n) < min_count_for(b[1])


def point_metrics(
    report: Report, gpus: int, usd_per_gpu_hour: float | None = None
) -> dict[str, Any]:
    """The run's figures: speeds and headline percentiles from the definitions table
    (``analysis.definitions``), throughput per GPU, cost and revenue, and the energy figures
    of ``analysis.gpu_energy.point_figures``."""
    st = report.stats
    lat = st.latency
    row: dict[str, Any] = dict(run_figures(RunInputs(st, gpus, usd_per_gpu_hour, report.gpu)))
    row.update(
        {
            f: lat[f.removesuffix("_n")].count
            for f, unit in POINT_FIELDS
            if unit == "samples" and f.removesuffix("_n") in lat
        }
    )
    return row


def empty_point() -> dict[str, Any]:
    return {k: None for k, _ in POINT_FIELDS}


def meets(row: Mapping[str, Any], key: str, op: str, bound: float) -> bool:
    v = row.get(key)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return False
    return bool(v >= bound) if op == ">=" else bool(v <= bound)
