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
per-request inter-token latency), the North Star = 1 / P90 of E2E / N (InferenceX's
default axis; its E2E counts from the send, a new connection's connect time inside, as
AIPerf's does), both with
linear-interpolation percentiles (``percentile_method``) over the measured ok requests of
parents and subagents pooled (InferenceX ``utils/agentic/aggregation``:
``request_metrics.py``, ``aggregation_common.percentile``); total tokens per GPU =
(input, cached included, + output tokens) / (last end - first send) / GPUs
(``total_tokens_per_s_per_gpu``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    cdf: bool = False
    """Drawn as a CDF: the report's latency CDF plot (``analysis.plots``) and a chart of the
    HTML pages (``analysis.html_charts``)."""
    compared: tuple[float, ...] = ()
    """Percentiles ``compare`` tests between two runs: a bootstrap interval and a verdict
    each (a speed's time is tested as the speed: ``Speed.compared``)."""


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
    """(e - s0) / N: the time per output token over the whole request, counted from the send
    with the time spent opening a new connection inside, as AIPerf's E2E counts it
    (InferenceX AgentX's North Star is 1 / its P90)."""
    e2e = x.m.e2e + np.nan_to_num(x.m.connect)
    n = x.m.output_tokens.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 1, e2e / np.maximum(n, 1), np.nan)


def agentx_itl(x: Inputs) -> np.ndarray:
    """(E2E - TTFT) / (N - 1): AIPerf's per-request inter-token latency, whose P90 InferenceX
    AgentX inverts into interactivity (NaN with fewer than 2 output tokens)."""
    n = x.m.output_tokens.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 2, (x.m.e2e - x.m.ttft) / np.maximum(n - 1, 1), np.nan)


def total_tokens_per_s_per_gpu(
    input_tokens: int,
    output_tokens: int,
    first_send_ns: float,
    last_end_ns: float,
    gpus: int | None,
) -> float | None:
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
    Metric(
        key="ttft",
        label="TTFT",
        unit="ms",
        per="request",
        rows="ok",
        live=True,
        higher_is_better=False,
        doc="f - s",
        formula=_attr("ttft"),
        headline=(50.0, 90.0, 99.0),
        cdf=True,
        compared=(90.0, 50.0),
    ),
    Metric(
        key="ttft_intended",
        label="TTFT from intended",
        unit="ms",
        per="request",
        rows="ok",
        live=False,
        higher_is_better=False,
        doc="f - S",
        formula=_attr("ttft_intended"),
    ),
    Metric(
        key="ttst",
        label="time to second token",
        unit="ms",
        per="request",
        rows="ok",
        live=False,
        higher_is_better=False,
        doc="send to the arrival of the second output token",
        formula=time_to_second_token,
    ),
    Metric(
        key="tpot",
        label="TPOT",
        unit="ms",
        per="request",
        rows="ok_exact",
        live=True,
        higher_is_better=False,
        doc="(c_m - c_1) / (N - k_1)",
        formula=_attr("tpot"),
        headline=(50.0, 90.0),
        cdf=True,
    ),
    Metric(
        key="itl",
        label="ITL (per token)",
        unit="ms",
        per="token",
        rows="ok_exact",
        live=True,
        higher_is_better=False,
        doc="each gap c_j - c_(j-1) as k_j samples of gap / k_j",
        headline=(99.0,),
        cdf=True,
    ),
    Metric(
        key="chunk_gap",
        label="chunk gap",
        unit="ms",
        per="chunk",
        rows="ok",
        live=True,
        higher_is_better=False,
        doc="each c_j - c_(j-1) once",
    ),
    Metric(
        key="e2e",
        label="E2E",
        unit="ms",
        per="request",
        rows="ok",
        live=True,
        higher_is_better=False,
        doc="e - s",
        formula=_attr("e2e"),
        headline=(90.0,),
        cdf=True,
    ),
    Metric(
        key="e2e_intended",
        label="E2E from intended",
        unit="ms",
        per="request",
        rows="ok",
        live=False,
        higher_is_better=False,
        doc="e - S",
        formula=_attr("e2e_intended"),
    ),
    Metric(
        key="e2e_per_token",
        label="E2E per output token",
        unit="ms",
        per="request",
        rows="ok",
        live=False,
        higher_is_better=False,
        doc="(e - s0) / N, connect inside (AgentX North Star = 1 / its P90; linear percentiles)",
        formula=e2e_per_token,
        percentile_method="linear",
    ),
    Metric(
        key="agentx_itl",
        label="AgentX ITL (per request)",
        unit="ms",
        per="request",
        rows="ok",
        live=False,
        higher_is_better=False,
        doc="(E2E - TTFT) / (N - 1) (AgentX interactivity = 1 / its P90; linear percentiles)",
        formula=agentx_itl,
        headline=(90.0,),
        percentile_method="linear",
    ),
    Metric(
        key="schedule_lag",
        label="schedule lag",
        unit="ms",
        per="request",
        rows="all",
        live=True,
        higher_is_better=False,
        doc="s0 - S",
        formula=_attr("schedule_lag"),
        headline=(99.0,),
    ),
    Metric(
        key="connect",
        label="connect (new connections)",
        unit="ms",
        per="request",
        rows="all",
        live=False,
        higher_is_better=False,
        doc="s - s0 where a new connection was opened",
        formula=_attr("connect"),
    ),
)
"""Every latency-table statistic, in the report's order."""

BY_KEY = {m.key: m for m in METRICS}
REQUEST_METRICS = tuple(m for m in METRICS if m.per == "request")
LIVE = tuple(m.key for m in METRICS if m.live)


@dataclass(frozen=True, slots=True)
class Speed:
    """A speed (tok/s, higher is better) read from a time's percentile: 1 / the
    ``percentile``-th percentile of the ``source`` metric."""

    key: str
    label: str
    source: str
    percentile: float
    doc: str
    compared: bool = False
    """Tested by ``compare`` between two runs (a bootstrap interval), which also stands for
    the source percentile (one test per statistic)."""
    arms: bool = False
    """Tested by ``compare`` between replicate arms (a run-level interval)."""
    test_label: str | None = None
    axis_label: str | None = None
    """An x axis of the frontier (what a user feels), under this label."""


SPEEDS: tuple[Speed, ...] = (
    Speed(
        key="p90_tps",
        label="P90 TPS",
        source="tpot",
        percentile=90.0,
        doc="speed 90% of requests reach or beat: 1 / P90 of TPOT",
        compared=True,
        arms=True,
        test_label="P90 TPS (= 1 / P90 TPOT)",
        axis_label="per-user P90 TPS (tok/s)",
    ),
    Speed(
        key="median_tps",
        label="median TPS",
        source="tpot",
        percentile=50.0,
        doc="1 / P50 of TPOT",
        compared=True,
        arms=True,
        test_label="median TPS (= 1 / median TPOT)",
    ),
    Speed(
        key="north_star",
        label="North Star",
        source="e2e_per_token",
        percentile=90.0,
        doc="InferenceX AgentX North Star: 1 / P90 of E2E per output token, from the send "
        "(linear percentile)",
        arms=True,
        test_label="North Star",
        axis_label="North Star: 1 / P90 E2E per output token (tok/s/user)",
    ),
    Speed(
        key="agentx_interactivity",
        label="AgentX interactivity",
        source="agentx_itl",
        percentile=90.0,
        doc="InferenceX AgentX: 1 / P90 of (E2E - TTFT) / (N - 1) (linear percentile)",
        axis_label="AgentX interactivity: 1 / P90 (E2E - TTFT) / (N - 1) (tok/s/user)",
    ),
)
"""The speeds, in the report's order."""
AGENTX_HEADLINE = ("north_star", "agentx_interactivity", "p90_tps")
"""The speeds an AgentX run leads with, in order: InferenceX's default axis, InferenceX's
interactivity, our own P90 TPS."""


def speed_at(s: Summary, p: float) -> float | None:
    """1 / (the P-th percentile of a per-token time in ns), in tokens per second."""
    v = s.values.get(p)
    return None if v is None or v <= 0 else NS / v


def speeds(latency: dict[str, Summary]) -> dict[str, float | None]:
    """Every entry of ``SPEEDS`` from a run's latency summaries."""
    return {
        sp.key: speed_at(latency[sp.source], sp.percentile) if sp.source in latency else None
        for sp in SPEEDS
    }


@dataclass(frozen=True, slots=True)
class Stat:
    """One statistic ``compare`` tests between two runs: the ``percentile`` of the
    ``source`` metric's per-request values, as a speed (``reciprocal``: 1 / the time) or a
    time."""

    key: str
    label: str
    source: str
    percentile: float
    higher_is_better: bool
    reciprocal: bool


def _compared_stats() -> tuple[Stat, ...]:
    out = [
        Stat(
            key=sp.key,
            label=sp.test_label or sp.label,
            source=sp.source,
            percentile=sp.percentile,
            higher_is_better=True,
            reciprocal=True,
        )
        for sp in SPEEDS
        if sp.compared
    ]
    for m in METRICS:
        for p in m.compared:
            name = "median" if p == 50 else f"P{p:g}"
            out.append(
                Stat(
                    key=f"{m.key}_p{p:g}",
                    label=f"{name} {m.label}",
                    source=m.key,
                    percentile=p,
                    higher_is_better=m.higher_is_better,
                    reciprocal=False,
                )
            )
    return tuple(out)


COMPARED: tuple[Stat, ...] = _compared_stats()
"""The statistics ``compare`` tests between two runs, the headline first: the speeds and
percentiles marked ``compared``."""
CDF_KEYS: tuple[str, ...] = tuple(m.key for m in METRICS if m.cdf)
"""The metrics drawn as CDFs (report plot, HTML pages)."""


def headline_figures(latency: dict[str, Summary]) -> dict[str, float | None]:
    """The ``headline`` percentiles of every entry, in ms, keyed ``<key>_p<P>_ms``."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        for p in m.headline:
            v = latency[m.key].values.get(p) if m.key in latency else None
            out[f"{m.key}_p{p:g}_ms"] = None if v is None else v / 1e6
    return out


# ---- run-level figures: one number per run


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a run-level figure is computed from: the run's statistics
    (``analysis.runstats.RunStats``), the GPUs serving it and their price, and the report's
    GPU block (``analysis.gpu_energy``; None without telemetry)."""

    stats: Any
    gpus: int = 1
    usd_per_gpu_hour: float | None = None
    gpu: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Figure:
    """One number per run: a column of the sweep's index, a term of ``sweep --slo``, a line
    of compare's tables, an axis of the frontier."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    doc: str
    value: Callable[[RunInputs], float | None] | None = None
    """None: a speed or a percentile of the metrics above (``speeds``, ``headline_figures``)."""
    axis: str | None = None
    """A frontier axis: ``x`` (what a user feels), ``y`` (throughput), ``y2`` (the second
    y-axis, energy)."""
    axis_label: str | None = None
    compare: bool = False
    """Shown per arm when ``compare`` gets replicate runs."""
    tested: bool = False
    """Tested between arms (one verdict each, Holm-corrected with the others)."""
    test_label: str | None = None
    needs: str | None = None
    """What the figure needs besides the rows (None where it is missing): ``gpu``
    telemetry, an ``slo``, ``prices``, a GPU-hour ``price``."""


def _secs(x: RunInputs) -> float | None:
    d = x.stats.duration_ns
    return d / NS if d else None


def _rate(tokens: Callable[[Any], int]) -> Callable[[RunInputs], float | None]:
    def f(x: RunInputs) -> float | None:
        s = _secs(x)
        return tokens(x.stats) / s if s else None

    return f


def _per_gpu(rate: Callable[[RunInputs], float | None]) -> Callable[[RunInputs], float | None]:
    def f(x: RunInputs) -> float | None:
        v = rate(x)
        return None if v is None else v / x.gpus

    return f


def _usd_per_m(rate: Callable[[RunInputs], float | None]) -> Callable[[RunInputs], float | None]:
    """USD per million tokens: the deployment's USD per hour / tokens per hour x 1e6."""

    def f(x: RunInputs) -> float | None:
        v = rate(x)
        if x.usd_per_gpu_hour is None or not v:
            return None
        return x.usd_per_gpu_hour * x.gpus / (v * 3600) * 1e6

    return f


def failure_rate(x: RunInputs) -> float | None:
    """Failed / attempted (non-warm-up) requests; None when none was attempted."""
    r = x.stats.requests
    n = r["ok"] + r["failed"]
    return r["failed"] / n if n else None


def agentx_tokens_per_gpu(x: RunInputs) -> float | None:
    """InferenceX AgentX total tokens per GPU (``total_tokens_per_s_per_gpu``) over the ok
    requests' first send to last end."""
    first, last = x.stats.extra.get("send_window_ns") or (0.0, 0.0)
    return total_tokens_per_s_per_gpu(
        x.stats.tokens["input"], x.stats.tokens["output"], first, last, x.gpus
    )


def _goodput(name: str) -> Callable[[RunInputs], float | None]:
    def f(x: RunInputs) -> float | None:
        v = (x.stats.goodput or {}).get(name)
        return None if v is None else float(v)

    return f


def _gpu(name: str) -> Callable[[RunInputs], float | None]:
    def f(x: RunInputs) -> float | None:
        v = (x.gpu or {}).get(name)
        return None if v is None else float(v)

    return f


_output = _rate(lambda st: st.tokens["output"])
_total = _rate(lambda st: st.tokens["output"] + st.tokens["input"])

RUN_FIGURES: tuple[Figure, ...] = (
    Figure(
        "requests_ok",
        "requests ok",
        "requests",
        True,
        "successful non-warm-up requests",
        lambda x: x.stats.requests["ok"],
    ),
    Figure(
        "requests_failed",
        "requests failed",
        "requests",
        False,
        "failed non-warm-up requests",
        lambda x: x.stats.requests["failed"],
    ),
    Figure(
        "duration_s",
        "duration",
        "s",
        False,
        "first intended send to last byte of the counted requests",
        _secs,
    ),
    Figure(
        "output_tps",
        "output tok/s",
        "tok/s",
        True,
        "output tokens / duration",
        _output,
        compare=True,
        tested=True,
    ),
    Figure("total_tps", "total tok/s", "tok/s", True, "(input + output tokens) / duration", _total),
    Figure(
        "output_tps_per_gpu",
        "output tok/s per GPU",
        "tok/s/GPU",
        True,
        "output tok/s / GPUs",
        _per_gpu(_output),
        axis="y",
    ),
    Figure(
        "total_tps_per_gpu",
        "total tok/s per GPU",
        "tok/s/GPU",
        True,
        "total tok/s / GPUs",
        _per_gpu(_total),
        axis="y",
    ),
    Figure(
        "usd_per_m_output",
        "USD per M output tokens",
        "USD",
        False,
        "USD per GPU-hour x GPUs / output tokens per hour x 1e6",
        _usd_per_m(_output),
        needs="price",
    ),
    Figure(
        "usd_per_m_total",
        "USD per M tokens",
        "USD",
        False,
        "USD per GPU-hour x GPUs / total tokens per hour x 1e6",
        _usd_per_m(_total),
        needs="price",
    ),
    Figure(
        "revenue_per_gpu_hour",
        "revenue per GPU-hour",
        "USD",
        True,
        "at the given prices (``analysis.runstats.economics``)",
        lambda x: (x.stats.economics or {}).get("usd_per_gpu_hour"),
        needs="prices",
    ),
    Figure(
        "energy_j",
        "GPU energy",
        "J",
        False,
        "GPU energy over the measured window",
        _gpu("energy_j"),
        needs="gpu",
    ),
    Figure(
        "mean_power_w",
        "mean GPU power",
        "W",
        False,
        "energy / window",
        _gpu("mean_power_w"),
        needs="gpu",
    ),
    Figure(
        "j_per_output_token",
        "energy per output token",
        "J/token",
        False,
        "GPU energy / output tokens",
        _gpu("j_per_output_token"),
        axis="y2",
        axis_label="J per output token",
        needs="gpu",
    ),
    Figure(
        "j_per_request",
        "energy per request",
        "J",
        False,
        "GPU energy / ok requests",
        _gpu("j_per_request"),
        needs="gpu",
    ),
    Figure(
        "output_tokens_per_s_per_kw",
        "output tok/s per kW",
        "tok/s/kW",
        True,
        "output tok/s / mean power",
        _gpu("output_tokens_per_s_per_kw"),
        needs="gpu",
    ),
    Figure(
        "failure_rate",
        "failure rate",
        "fraction",
        False,
        "failed / (ok + failed) non-warm-up requests",
        failure_rate,
    ),
    Figure(
        "goodput_rps",
        "goodput",
        "req/s",
        True,
        "requests meeting every per-request objective / duration (needs an SLO)",
        _goodput("requests_per_s"),
        needs="slo",
    ),
    Figure(
        "goodput_fraction",
        "goodput fraction",
        "fraction",
        True,
        "requests meeting every per-request objective / attempted (needs an SLO)",
        _goodput("fraction"),
        needs="slo",
    ),
    Figure(
        "agentx_tps_per_gpu",
        "AgentX total tok/s per GPU",
        "tok/s/GPU",
        True,
        "(input + output tokens) / (last end - first send) / GPUs (InferenceX AgentX)",
        agentx_tokens_per_gpu,
    ),
)
"""Every run-level figure computed from a run's statistics, in the index's order."""

_COMPARED_PERCENTILES = {"ttft_p90_ms": True, "ttft_p99_ms": True, "tpot_p90_ms": False}
"""Headline percentiles compared between arms: key -> tested (TPOT P90 is P90 TPS's
reciprocal, so it is tested once, as P90 TPS)."""


def _figures() -> tuple[Figure, ...]:
    out = [
        Figure(
            sp.key,
            sp.label,
            "tok/s",
            True,
            sp.doc,
            axis="x" if sp.axis_label else None,
            axis_label=sp.axis_label,
            compare=sp.arms,
            tested=sp.arms,
            test_label=sp.test_label or (sp.label if sp.arms else None),
        )
        for sp in SPEEDS
    ]
    for m in METRICS:
        for p in m.headline:
            key = f"{m.key}_p{p:g}_ms"
            out.append(
                Figure(
                    key,
                    f"{m.label} P{p:g}",
                    "ms",
                    m.higher_is_better,
                    f"P{p:g} of {m.label}",
                    compare=key in _COMPARED_PERCENTILES,
                    tested=_COMPARED_PERCENTILES.get(key, False),
                )
            )
    return (*out, *RUN_FIGURES)


FIGURES: tuple[Figure, ...] = _figures()
"""Every figure of one run: the speeds, the headline percentiles and the run-level figures."""
FIGURES_BY_KEY = {f.key: f for f in FIGURES}


def run_figures(x: RunInputs) -> dict[str, float | None]:
    """Every figure of ``FIGURES`` for one run, keyed by figure."""
    st = x.stats
    out: dict[str, float | None] = {**speeds(st.latency), **headline_figures(st.latency)}
    for f in RUN_FIGURES:
        assert f.value is not None
        out[f.key] = f.value(x)
    return out
