"""The AgentX validity verdict of a run (AIPerf ``common/scenario``: ``submission_outcome``
and the scenario's duration floor, failure threshold and metric coverage): pure functions
of the result rows and the run's facts; ``replay.runrecord`` gathers the facts and writes
the verdict to run.json."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_OVERFLOW_FRACTION = 0.01


@dataclass(frozen=True)
class OverflowRule:
    """How a failed response is recognised as a context-length overflow: one of
    ``markers`` (lower case) in its error text, case-insensitive; ``status``: only responses
    with this HTTP status (None: any failed response, an error event in a stream too);
    ``nested``: the markers are also looked for in the body's JSON ``error.message``, its
    escapes undone."""

    name: str
    markers: tuple[str, ...]
    status: int | None
    nested: bool
    doc: str

    def __call__(self, http_status: int | None, error: str | None) -> bool:
        if not error or (self.status is not None and http_status != self.status):
            return False
        text = error.lower()
        if any(m in text for m in self.markers):
            return True
        nested = _error_message(error) if self.nested else None
        return nested is not None and any(m in nested.lower() for m in self.markers)


def _error_message(error: str) -> str | None:
    """The OpenAI-style ``error.message`` (or a string ``error``) of the JSON body in an
    error text (``HTTP 400: {...}``), or None."""
    i = error.find("{")
    if i < 0:
        return None
    try:
        body = json.loads(error[i:])
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        msg = err.get("message")
        return msg if isinstance(msg, str) else None
    return err if isinstance(err, str) else None


OVERFLOW_RULES: dict[str, OverflowRule] = {
    r.name: r
    for r in (
        OverflowRule(
            "aiperf",
            ("context length", "maximum context", "context_length_exceeded", "prompt is too long"),
            None,
            True,
            "AIPerf 0.13's list (Environment.AGENTX.CONTEXT_OVERFLOW_SUBSTRINGS), on "
            "any failed response, in its text and its JSON error.message "
            "(common/scenario/context_overflow.py)",
        ),
        OverflowRule(
            "agent-replay",
            (
                "maximum model length",
                "maximum context length",
                "context length",
                "too long",
                "prompt is too long",
            ),
            400,
            False,
            "ours, on HTTP 400 only: also vLLM's engine-side 'longer than the maximum "
            "model length' and other 'too long' messages",
        ),
    )
}
"""The overflow rules ``--overflow-rule`` names; AgentX runs use ``aiperf`` by default."""
DEFAULT_OVERFLOW_RULE = "aiperf"


def is_overflow(
    http_status: int | None, error: str | None, rule: str = DEFAULT_OVERFLOW_RULE
) -> bool:
    """Whether a response is a context-length overflow under the named rule."""
    return OVERFLOW_RULES[rule](http_status, error)


@dataclass(frozen=True)
class ValidityRules:
    """What makes an AgentX run valid (AIPerf ``common/scenario``: ``submission_outcome``
    and the scenario's coverage and duration floors). None: the rule is not applied."""

    min_duration_s: float | None = None
    failure_threshold: float | None = None
    metric_coverage: float | None = None
    max_overflow_fraction: float = MAX_OVERFLOW_FRACTION
    overflow_rule: str = DEFAULT_OVERFLOW_RULE


@dataclass
class ValidityInput:
    """Per-run facts the rules need, gathered from the result rows."""

    responses: int = 0
    failed: int = 0
    overflows: int = 0
    cancelled: int = 0
    interrupted: bool = False
    measured_s: float = 0.0
    expected_s: float | None = None
    last_first_token_s: float | None = None  # from the first measured send
    last_itl_end_s: float | None = None
    reasons: list[str] = field(default_factory=list)


def coverage_ratio(last_s: float | None, expected_s: float | None) -> float | None:
    """AIPerf's profile metric duration coverage: how far into the expected profiling
    window the last observation of a metric lies (0 when none)."""
    if not expected_s:
        return None
    return 0.0 if last_s is None else last_s / expected_s


def _overflows(rows: Iterable[tuple[bool, int | None, str | None]], rule: str) -> tuple[int, int]:
    """Responses (warm-up excluded) and how many of them overflowed the context."""
    n = over = 0
    for warm, status, error in rows:
        if not warm:
            n += 1
            over += is_overflow(status, error, rule)
    return n, over


def _coverage_short(
    needed: float | None, ttft_cov: float | None, itl_cov: float | None
) -> float | None:
    """The better of the two coverages when both are known and below ``needed``; else None."""
    if needed is None or ttft_cov is None or itl_cov is None:
        return None
    best = max(ttft_cov, itl_cov)
    return best if best < needed else None


def _run_reasons(rules: ValidityRules, f: ValidityInput) -> list[str]:
    """An interrupted run, or one measured for less than the minimum."""
    reasons = []
    if f.interrupted or f.cancelled:
        reasons.append(f"the run was interrupted ({f.cancelled:,} requests cancelled)")
    if rules.min_duration_s is not None and f.measured_s < rules.min_duration_s:
        reasons.append(
            f"measured {f.measured_s:,.0f} s, below the minimum of {rules.min_duration_s:,.0f} s"
        )
    return reasons


def agentx_validity(
    rows: Iterable[tuple[bool, int | None, str | None]],
    rules: ValidityRules | None = None,
    facts: ValidityInput | None = None,
) -> dict[str, Any]:
    """From (warmup, http_status, error) of every result row, and the run's facts: the
    AgentX verdict. Invalid when, warm-up excluded: more than ``max_overflow_fraction`` of
    the responses overflowed the context; any request was cancelled or the run was
    interrupted; the measured time is below ``min_duration_s``; more than
    ``failure_threshold`` of the requests failed; neither the last first token nor the last
    streamed token lies ``metric_coverage`` of the way into the expected duration."""
    rules = rules or ValidityRules()
    f = facts or ValidityInput()
    n, over = _overflows(rows, rules.overflow_rule)
    frac = over / n if n else 0.0
    reasons: list[str] = []
    if frac > rules.max_overflow_fraction:
        reasons.append(
            f"{over:,} of {n:,} responses ({frac:.1%}) overflowed the context "
            f"(AgentX allows {rules.max_overflow_fraction:.0%})"
        )
    reasons += _run_reasons(rules, f)
    fail_frac = f.failed / n if n else 0.0
    if rules.failure_threshold is not None and fail_frac > rules.failure_threshold:
        reasons.append(
            f"{f.failed:,} of {n:,} requests ({fail_frac:.1%}) failed (threshold "
            f"{rules.failure_threshold:.0%})"
        )
    ttft_cov = coverage_ratio(f.last_first_token_s, f.expected_s)
    itl_cov = coverage_ratio(f.last_itl_end_s, f.expected_s)
    short = _coverage_short(rules.metric_coverage, ttft_cov, itl_cov)
    if short is not None:
        reasons.append(
            f"metrics cover {short:.1%} of the {f.expected_s:,.0f} s "
            f"window (needs {rules.metric_coverage:.0%})"
        )
    out: dict[str, Any] = {
        "responses": n,
        "context_overflows": over,
        "overflow_fraction": frac,
        "failed": f.failed,
        "failure_fraction": fail_frac,
        "cancelled": f.cancelled,
        "interrupted": f.interrupted,
        "measured_s": f.measured_s,
        "ttft_coverage": ttft_cov,
        "itl_coverage": itl_cov,
        "rules": {
            "min_duration_s": rules.min_duration_s,
            "failure_threshold": rules.failure_threshold,
            "metric_coverage": rules.metric_coverage,
            "max_overflow_fraction": rules.max_overflow_fraction,
            "overflow_rule": rules.overflow_rule,
        },
        "valid": not reasons,
    }
    if reasons:
        out["invalid_reason"] = "; ".join(reasons)
        out["invalid_reasons"] = reasons
    return out
