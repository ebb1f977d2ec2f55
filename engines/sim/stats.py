"""Counters and histograms of the simulated engine, as plain values (no Prometheus here).

Names and bucket bounds follow vLLM's /metrics; ``metrics.py`` renders them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def one_two_five(limit: int) -> tuple[float, ...]:
    """vLLM's 1, 2, 5, 10, 20, 50, ... buckets up to ``limit``."""
    out: list[float] = []
    mag = 1
    while True:
        for m in (1, 2, 5):
            v = m * mag
            if v > limit:
                return tuple(out)
            out.append(float(v))
        mag *= 10


LATE_WRITE_NS = 1_000_000


def schedule_warning(stats: SimStats) -> str | None:
    """A line for the operator when more than 1% of the steps wrote their last chunk more
    than 1 ms after the step's deadline (the engine did not keep its own schedule)."""
    n, late = stats.written_steps, stats.late_steps
    if not n or late * 100 <= n:
        return None
    return (
        f"{late} of {n} steps ({late / n:.0%}) wrote their last chunk more than "
        f"{LATE_WRITE_NS / 1e6:g} ms after the step's deadline (worst "
        f"{stats.max_write_lag_ns / 1e6:.1f} ms): the host was busy, or one process "
        "serves too many streams; try --workers N or fewer concurrent streams"
    )


class Hist:
    """A cumulative-bucket histogram: ``counts[i]`` counts values <= ``bounds[i]``
    (non-cumulative in storage, cumulated when rendered); the last slot is +Inf."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out: list[int] = []
        acc = 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


@dataclass
class SimStats:
    """Everything /metrics reports, updated by the engine core."""

    max_model_len: int = 32768
    num_spec_positions: int = 0
    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    request_success: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0)
    )
    admission_rejections: int = 0
    schedule_rebases: int = 0
    steps: int = 0
    written_steps: int = 0
    """Steps whose chunks were written to streams (the server counts them)."""
    late_steps: int = 0
    """Of those, steps whose last write ended more than ``LATE_WRITE_NS`` after the deadline."""
    max_write_lag_ns: int = 0
    hists: dict[str, Hist] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spec_accepted_per_pos = [0] * self.num_spec_positions
        tokens = one_two_five(self.max_model_len)
        self.hists = {
            "time_to_first_token_seconds": Hist(TTFT_BUCKETS),
            "inter_token_latency_seconds": Hist(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Hist(ITL_BUCKETS),
            "e2e_request_latency_seconds": Hist(LATENCY_BUCKETS),
            "request_queue_time_seconds": Hist(LATENCY_BUCKETS),
            "request_inference_time_seconds": Hist(LATENCY_BUCKETS),
            "request_prefill_time_seconds": Hist(LATENCY_BUCKETS),
            "request_decode_time_seconds": Hist(LATENCY_BUCKETS),
            "request_prompt_tokens": Hist(tokens),
            "request_generation_tokens": Hist(tokens),
            "request_params_max_tokens": Hist(tokens),
            "request_max_num_generation_tokens": Hist(tokens),
            "request_params_n": Hist((1.0, 2.0, 5.0, 10.0, 20.0)),
            "request_num_preemptions": Hist(tokens),
            "request_prefill_kv_computed_tokens": Hist(tokens),
            "iteration_tokens_total": Hist(ITERATION_TOKENS_BUCKETS),
        }
