"""The table of metric definitions: one entry per statistic, read by every consumer.

An entry names the metric, its unit, what it is computed over (per request or per token /
chunk), which rows count, its percentiles, whether the live statistics carry it, which way
is better, and, for per-request metrics, the pure formula that computes it from a batch.
``analysis.runstats`` computes every per-request entry with its formula and summarizes it
with the one percentile rule (``analysis.hist``: nearest rank, exact or HdrHistogram); the
report's latency table (terminal, Markdown, JSON, CSV) lists the entries in this order;
``compare`` and the sweep's index show the entries' ``headline`` percentiles; the dashboard
keeps a histogram of every ``live`` entry. Adding a metric is one entry here (and a test
that pins it on a hand-computed example).

Speeds are read from times: request TPS = 1 / TPOT, and its P90 = 1 / P90 of TPOT
(``speed_at``, nearest rank). InferenceX AgentX's figures use its own rules, kept apart:
AgentX interactivity = 1 / P90 of each request's (E2E - TTFT) / (N - 1) (AIPerf's
per-request inter-token latency), the North Star axis = 1 / P90 of E2E / N, both with
linear-interpolation percentiles (``percentile_method``) over the measured ok requests of
parents and subagents pooled (InferenceX ``utils/agentic/aggregation``:
``request_metrics.py``, ``aggregation_common.percentile``); total tokens per GPU =
(input, cached included, + output tokens) / (last end - first send) / GPUs
(``total_tokens_per_s_per_gpu``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent_replay.analysis.hist import PERCENTILES, Summary
from agent_replay.analysis.metrics import NS, Lists, RequestMetrics, _f64


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a per-request formula gets for one batch: the batch, its chunk times and token
    counts as flat lists, and the core per-request metrics (``analysis.metrics``)."""

    batch: Any
    c: Lists
    k: Lists
    m: RequestMetrics


Formula = Callable[[Inputs], np.ndarray]


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    per: str
    """``request`` (one value per request, exact) or ``token`` / ``chunk`` (folded into an
    HdrHistogram by ``analysis.fold``)."""
    rows: str
    """Which non-warmup rows count: ``ok``, ``ok_exact`` (ok with exact tokens per chunk,
    for per-token metrics) or ``all`` (every sent request, failed ones too)."""
    live: bool
    higher_is_better: bool
    doc: str
    formula: Formula | None = None
    """Per-request values in ns (NaN where undefined); None for per-token/chunk metrics."""
    headline: tuple[float, ...] = ()
    """Percentiles ``compare`` and the sweep index show."""
    percentiles: tuple[float, ...] = PERCENTILES
    percentile_method: str = "nearest"
    """``analysis.hist.PERCENTILE_METHODS``: ``linear`` only where a standard requires it."""


def time_to_second_token(x: Inputs) -> np.ndarray:
    """Send to the arrival of the second output token: the first chunk's arrival when it
    carries two or more tokens, else the second chunk's (NaN with fewer than 2 tokens)."""
    c, k = x.c, x.k
    n = c.offsets.size - 1
    out = np.full(n, np.nan)
    lengths = c.lengths
    starts = c.offsets[:-1]
    sent = _f64(x.batch, "sent_ns") + np.nan_to_num(_f64(x.batch, "connect_ns"))
    has1 = lengths >= 1
    k1 = np.zeros(n, dtype=np.int64)
    k1[has1] = k.values[starts[has1]]
    first_two = has1 & (k1 >= 2)
    out[first_two] = c.values[starts[first_two]] - sent[first_two]
    second = has1 & (k1 < 2) & (lengths >= 2)
    out[second] = c.values[starts[second] + 1] - sent[second]
    return out


def e2e_per_token(x: Inputs) -> np.ndarray:
    """E2E / N, the time per output token over the whole request (InferenceX's
    interactivity is 1 / its P90)."""
    n = x.m.output_tokens.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 1, x.m.e2e / np.maximum(n, 1), np.nan)


def agentx_itl(x: Inputs) -> np.ndarray:
    """(E2E - TTFT) / (N - 1): AIPerf's per-request inter-token latency, whose P90 InferenceX
    AgentX inverts into interactivity (NaN with fewer than 2 output tokens)."""
    n = x.m.output_tokens.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 2, (x.m.e2e - x.m.ttft) / np.maximum(n - 1, 1), np.nan)


def total_tokens_per_s_per_gpu(input_tokens: int, output_tokens: int, first_send_ns: float,
                               last_end_ns: float, gpus: int | None) -> float | None:
    """InferenceX AgentX throughput per GPU: (input + output tokens) / (last end - first
    send) / GPUs; None when the window is empty or the GPU count is unknown."""
    span = last_end_ns - first_send_ns
    if not gpus or not span > 0:
        return None
    return (input_tokens + output_tokens) / (span / NS) / gpus


def _attr(name: str) -> Formula:
    def f(x: Inputs) -> np.ndarray:
        return np.asarray(getattr(x.m, name), dtype=np.float64)

    f.__name__ = name
    return f


METRICS: tuple[Metric, ...] = (
    Metric("ttft", "TTFT", "ms", "request", "ok", True, False, "f - s", _attr("ttft"), (50.0, 90.0, 99.0)),
    Metric("ttft_intended", "TTFT from intended", "ms", "request", "ok", False, False, "f - S",
           _attr("ttft_intended")),
    Metric("ttst", "time to second token", "ms", "request", "ok", False, False,
           "send to the arrival of the second output token", time_to_second_token),
    Metric("tpot", "TPOT", "ms", "request", "ok_exact", True, False, "(c_m - c_1) / (N - k_1)",
           _attr("tpot"), (50.0, 90.0)),
    Metric("itl", "ITL (per token)", "ms", "token", "ok_exact", True, False,
           "each gap c_j - c_(j-1) as k_j samples of gap / k_j", None, (99.0,)),
    Metric("chunk_gap", "chunk gap", "ms", "chunk", "ok", True, False, "each c_j - c_(j-1) once"),
    Metric("e2e", "E2E", "ms", "request", "ok", True, False, "e - s", _attr("e2e"), (90.0,)),
    Metric("e2e_intended", "E2E from intended", "ms", "request", "ok", False, False, "e - S",
           _attr("e2e_intended")),
    Metric("e2e_per_token", "E2E per output token", "ms", "request", "ok", False, False,
           "E2E / N (AgentX North Star = 1 / its P90; linear percentiles)", e2e_per_token,
           percentile_method="linear"),
    Metric("agentx_itl", "AgentX ITL (per request)", "ms", "request", "ok", False, False,
           "(E2E - TTFT) / (N - 1) (AgentX interactivity = 1 / its P90; linear percentiles)",
           agentx_itl, (90.0,), percentile_method="linear"),
    Metric("schedule_lag", "schedule lag", "ms", "request", "all", True, False, "s0 - S",
           _attr("schedule_lag"), (99.0,)),
    Metric("connect", "connect (new connections)", "ms", "request", "all", False, False,
           "s - s0 where a new connection was opened", _attr("connect")),
)
"""Every latency-table statistic, in the report's order."""

BY_KEY = {m.key: m for m in METRICS}
REQUEST_METRICS = tuple(m for m in METRICS if m.per == "request")
LIVE = tuple(m.key for m in METRICS if m.live)

SPEEDS: tuple[tuple[str, str, str, str], ...] = (
    ("p90_tps", "P90 TPS", "tpot", "speed 90% of requests reach or beat: 1 / P90 of TPOT"),
    ("median_tps", "median TPS", "tpot", "1 / P50 of TPOT"),
    ("interactivity", "interactivity", "e2e_per_token",
     "InferenceX AgentX North Star: 1 / P90 of E2E per output token (linear percentile)"),
    ("agentx_interactivity", "AgentX interactivity", "agentx_itl",
     "InferenceX AgentX: 1 / P90 of (E2E - TTFT) / (N - 1) (linear percentile)"),
)
"""Speeds (tok/s, higher is better) derived from a time's percentile: (key, label, time
metric, reading)."""


def speed_at(s: Summary, p: float) -> float | None:
    """1 / (the P-th percentile of a per-token time in ns), in tokens per second."""
    v = s.values.get(p)
    return None if v is None or v <= 0 else NS / v


def speeds(latency: dict[str, Summary]) -> dict[str, float | None]:
    """Every entry of ``SPEEDS`` from a run's latency summaries."""
    pct = {"p90_tps": 90.0, "median_tps": 50.0, "interactivity": 90.0, "agentx_interactivity": 90.0}
    return {key: speed_at(latency[src], pct[key]) if src in latency else None
            for key, _, src, _ in SPEEDS}


def headline_figures(latency: dict[str, Summary]) -> dict[str, float | None]:
    """The ``headline`` percentiles of every entry, in ms, keyed ``<key>_p<P>_ms``."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        for p in m.headline:
            v = latency[m.key].values.get(p) if m.key in latency else None
            out[f"{m.key}_p{p:g}_ms"] = None if v is None else v / 1e6
    return out
