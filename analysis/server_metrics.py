"""What the server itself says about a run: deltas of vLLM's ``/metrics`` over the run.

``summarize(table)`` takes ``SERVER_METRICS_SCHEMA`` rows (every scrape of the run) and
returns plain numbers: prefix-cache hit rate, speculative-decoding acceptance (length, rate,
per position), KV-cache usage and running/waiting requests (mean and max over scrapes),
preemptions, prompt/generation token deltas, finished requests by reason, and the server's
own latency histograms (TTFT, TPOT, ITL, E2E, queue) as bucket deltas with percentiles.

Counters and histograms are differenced from the first to the last scrape, per series,
counting a drop as a restart (the new value is the increase). Series that differ only in
the ``engine`` label (one per data-parallel engine) and ``model_name`` are summed.

A percentile from buckets is only known to bucket resolution: each comes as ``lo``/``hi``
(the bucket's bounds) plus ``est``, the linear interpolation inside the bucket that
Prometheus' ``histogram_quantile`` uses; ``hi`` is ``None`` in the ``+Inf`` bucket.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from typing import Any

import pyarrow as pa

SUMMED_LABELS = ("engine", "model_name")

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
QUANTILES = (0.5, 0.9, 0.99)

Key = tuple[str, tuple[tuple[str, str], ...]]


def _group(
    labels: dict[str, str], drop: tuple[str, ...] = SUMMED_LABELS
) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _increase(values: list[float]) -> float:
    """Increase of a counter over consecutive samples, a drop counting as a restart."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total


class _Series:
    """Samples by series, in time order."""

    def __init__(self, table: pa.Table) -> None:
        t = table.column("t_ns").to_pylist()
        names = table.column("name").to_pylist()
        labels = table.column("labels").to_pylist()
        values = table.column("value").to_pylist()
        order = sorted(range(len(t)), key=t.__getitem__)
        self.times = sorted(set(t))
        self.by_series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        for i in order:
            self.by_series[(names[i], labels[i])].append((t[i], values[i]))

    def deltas(self, name: str, drop: tuple[str, ...] = SUMMED_LABELS) -> dict[Any, float]:
        """Counter increase per label group (``drop`` labels summed over)."""
        out: dict[Any, float] = defaultdict(float)
        for (n, lab), samples in self.by_series.items():
            if n == name:
                out[_group(json.loads(lab), drop)] += _increase([v for _, v in samples])
        return dict(out)

    def total(self, name: str) -> float | None:
        d = self.deltas(name, drop=("engine", "model_name"))
        return sum(d.values()) if d else None

    def gauge(self, name: str, combine: str) -> dict[str, float] | None:
        """Per scrape, sum (or mean) over series; then mean and max over scrapes."""
        per_t: dict[int, list[float]] = defaultdict(list)
        for (n, _lab), samples in self.by_series.items():
            if n == name:
                for t, v in samples:
                    per_t[t].append(v)
        if not per_t:
            return None
        vals = [sum(v) if combine == "sum" else sum(v) / len(v) for v in per_t.values()]
        peak = max(max(v) for v in per_t.values()) if combine == "mean" else max(vals)
        return {"mean": sum(vals) / len(vals), "max": peak, "samples": len(vals)}


def _buckets(series: _Series, name: str) -> dict[float, float]:
    """Histogram ``name``'s bucket deltas by upper bound, summed over the other labels."""
    buckets: dict[float, float] = defaultdict(float)
    for group, inc in series.deltas(name + "_bucket").items():
        le = dict(group).get("le")
        if le is not None:
            buckets[float(le)] += inc
    return buckets


def _ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``; None when either is unknown or the denominator is 0."""
    return num / den if den and num is not None else None


def histogram(series: _Series, name: str) -> dict[str, Any] | None:
    buckets = _buckets(series, name)
    count = series.total(name + "_count")
    total = series.total(name + "_sum")
    if not buckets or count is None:
        return None
    les = sorted(buckets)
    cum = [buckets[le] for le in les]
    out: dict[str, Any] = {
        "count": count,
        "sum": total,
        "mean": _ratio(total, count),
        "buckets": [[le if math.isfinite(le) else None, c] for le, c in zip(les, cum, strict=True)],
    }
    for q in QUANTILES:
        out[f"p{round(q * 100):d}"] = bucket_quantile(les, cum, q)
    return out


def bucket_quantile(les: list[float], cum: list[float], q: float) -> dict[str, Any] | None:
    """The bucket holding quantile ``q`` of cumulative counts ``cum`` at bounds ``les``."""
    if not cum or cum[-1] <= 0:
        return None
    rank = q * cum[-1]
    for i, c in enumerate(cum):
        if c >= rank:
            lo = les[i - 1] if i > 0 else 0.0
            below = cum[i - 1] if i > 0 else 0.0
            hi = les[i]
            if not math.isfinite(hi):
                return {"lo": lo, "hi": None, "est": lo}
            inside = c - below
            est = lo + (hi - lo) * ((rank - below) / inside if inside > 0 else 1.0)
            return {"lo": lo, "hi": hi, "est": est}
    return None


def _spec_decode(s: _Series) -> dict[str, Any] | None:
    """Speculative decoding's drafts, acceptance length and rate, and the acceptance per
    draft position; None when the server drafts nothing."""
    drafts = s.total("vllm:spec_decode_num_drafts_total")
    if drafts is None:
        return None
    draft_tokens = s.total("vllm:spec_decode_num_draft_tokens_total")
    accepted = s.total("vllm:spec_decode_num_accepted_tokens_total")
    per_pos = s.deltas("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    positions = sorted(per_pos, key=lambda g: int(dict(g).get("position", "0")))
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_length": (1 + (accepted or 0) / drafts) if drafts else None,
        "acceptance_rate": _ratio(accepted, draft_tokens),
        "per_position_acceptance": [per_pos[g] / drafts if drafts else None for g in positions],
    }


def summarize(table: pa.Table) -> dict[str, Any]:
    """Deltas and gauges of one run's ``/metrics`` samples (see the module docstring)."""
    s = _Series(table)
    if not s.times:
        return {"scrapes": 0}
    queries = s.total("vllm:prefix_cache_queries_total")
    hits = s.total("vllm:prefix_cache_hits_total")
    finished = {
        dict(g).get("finished_reason", "?"): v
        for g, v in s.deltas("vllm:request_success_total").items()
    }
    engines = {
        json.loads(lab).get("engine")
        for (n, lab) in s.by_series
        if n == "vllm:num_requests_running"
    }
    return {
        "scrapes": len(s.times),
        "duration_s": (s.times[-1] - s.times[0]) / 1e9,
        "engines": len(engines - {None}) or (1 if engines else 0),
        "prefix_cache": {"queries": queries, "hits": hits, "hit_rate": _ratio(hits, queries)},
        "prompt_tokens": s.total("vllm:prompt_tokens_total"),
        "generation_tokens": s.total("vllm:generation_tokens_total"),
        "preemptions": s.total("vllm:num_preemptions_total"),
        "requests_finished": finished,
        "spec_decode": _spec_decode(s),
        "kv_cache_usage": s.gauge("vllm:kv_cache_usage_perc", "mean"),
        "running": s.gauge("vllm:num_requests_running", "sum"),
        "waiting": s.gauge("vllm:num_requests_waiting", "sum"),
        "histograms": {key: histogram(s, name) for key, name in HISTOGRAMS.items()},
    }
