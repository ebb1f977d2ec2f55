"""The report of one results folder: ``build_report`` (a library call, no printing) and the
data it returns. Renderers live in ``analysis.render``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from agent_replay.analysis.definitions import (
    AGENTX_HEADLINE,
    REQUEST_METRICS,
    SPEEDS,
    speeds,
)
from agent_replay.analysis.gpu_energy import gpu_section
from agent_replay.analysis.hist import Summary
from agent_replay.analysis.results import (
    iter_request_batches,
    read_gpu_telemetry,
    read_run_record,
    read_server_metrics,
)
from agent_replay.analysis.runstats import (
    COLUMNS,
    PER_TOKEN_METRICS,
    Accumulator,
    Prices,
    RunStats,
    Slo,
)
from agent_replay.analysis.server_metrics import summarize as summarize_server_metrics
from agent_replay.errors import InputError
from agent_replay.runmeta import RunMeta, writer_state

ERROR_RATE_WARN = 0.01


@dataclass(slots=True)
class Report:
    results_dir: str
    meta: RunMeta
    stats: RunStats
    headline: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    server: Mapping[str, Any] | None = None
    cold_start: str | None = None
    """Why the run's start may be cold (``analysis.coldstart``), None when it does not look so."""
    gpu: Mapping[str, Any] | None = None
    """agent_replay.analysis.gpu_energy figures when the run has GPU telemetry."""
    gpu_samples: pa.Table | None = None


def parse_slo(text: str | None) -> Slo | None:
    """``ttft=2s,tpot=50ms,e2e=30`` (bare numbers are milliseconds) -> Slo in ns: any
    per-request metric of the definitions table (``ttst=1s``, ``e2e_per_token=40ms``...)."""
    if not text:
        return None
    known = [d.key for d in REQUEST_METRICS]
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in known:
            raise InputError(
                f"--slo: {part.strip()!r}: expected METRIC=DURATION, METRIC one of "
                f"{', '.join(known)} (e.g. ttft=2s,tpot=50ms)"
            )
        out[key] = _slo_duration_ns(key, raw)
    return Slo.of(out)


SLO_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def _slo_duration_ns(key: str, raw: str) -> float:
    """An SLO bound (``500ms``, ``2s``; a bare number is milliseconds) in ns, positive."""
    raw = raw.strip().lower()
    unit = next((u for u in ("ns", "us", "ms", "s") if raw.endswith(u)), "")
    try:
        value = float(raw[: len(raw) - len(unit)] if unit else raw)
    except ValueError:
        raise InputError(f"--slo: {key}: {raw!r} is not a duration (e.g. 500ms, 2s)") from None
    if value <= 0:
        raise InputError(f"--slo: {key} must be positive")
    return value * SLO_UNITS[unit or "ms"]


def _server_summary(table: pa.Table | None) -> Mapping[str, Any] | None:
    return None if table is None else summarize_server_metrics(table)


def headline(tps: Summary, inexact: int = 0) -> dict[str, Any]:
    """The P90 TPS line; ``inexact``: ok requests left out of it because their tokens per
    chunk are not exact."""
    p90, p50 = tps.values.get(90.0), tps.values.get(50.0)
    if p90 is not None:
        value = f"{p90:,.1f} tok/s (90% of requests at least this fast)"
    elif inexact:
        value = (
            f"n/a ({inexact:,} requests had inexact token counts per chunk, and no "
            "request with exact counts produced two or more tokens)"
        )
    else:
        value = "n/a (no request produced two or more tokens)"
    return {
        "p90_tps": p90,
        "median_tps": p50,
        "count": tps.count,
        "reliable": tps.reliable.get(90.0, False),
        "text": (
            "per-user decode speed, P90: "
            + value
            + (f"; median {p50:,.1f} tok/s" if p50 is not None else "")
            + (
                ""
                if tps.reliable.get(90.0, False) or p90 is None
                else f" [only {tps.count} requests: too few for P90]"
            )
            + (
                f" [leaves out {inexact:,} requests with inexact token counts]"
                if inexact and p90 is not None
                else ""
            )
        ),
    }


def agentx_headline(latency: Mapping[str, Summary], base: dict[str, Any]) -> dict[str, Any]:
    """An AgentX run's headline: InferenceX's North Star first (its default axis), then
    AgentX interactivity and our P90 TPS (``definitions.AGENTX_HEADLINE``), each read from
    the one definition (``definitions.speeds``); ``base``: the P90 TPS headline it extends."""
    sp = speeds(dict(latency))
    by_key = {x.key: x for x in SPEEDS}
    parts = []
    for key in AGENTX_HEADLINE:
        v = sp.get(key)
        s = latency.get(by_key[key].source)
        few = v is not None and s is not None and not s.reliable.get(by_key[key].percentile, False)
        parts.append(
            f"{'our ' if key == 'p90_tps' else ''}{by_key[key].label} "
            + ("n/a" if v is None else f"{v:,.1f} tok/s/user")
            + (f" [only {s.count} requests: too few for P90]" if few and s is not None else "")
        )
    return (
        base
        | {k: sp.get(k) for k in AGENTX_HEADLINE}
        | {
            "lead": "north_star",
            "text": f"AgentX {parts[0]} (1 / P90 of E2E per output token); {'; '.join(parts[1:])}",
        }
    )


def inexact_warning(n: int, ok: int, without_usage: int = 0) -> str:
    """The warning line for ``n`` of ``ok`` requests with inexact tokens per chunk."""
    text = (
        f"warning: {n:,} of {ok:,} successful requests had inexact token counts per chunk "
        "(the server sent neither token ids nor continuous usage, e.g. --no-vllm-extras "
        "against a server that is not vLLM): TTFT, E2E, chunk gap and throughput include "
        f"them; {', '.join(PER_TOKEN_METRICS)} leave them out."
    )
    if without_usage:
        text += (
            f" {without_usage:,} of them sent no usage either: their output tokens are "
            "counted as content chunks (a lower bound) and not compared with the trace."
        )
    return text


def self_check(meta: RunMeta | Mapping[str, Any], stats: RunStats) -> Any:
    """The self-check policy's verdict for this run (``analysis.selfcheck``): run.json's loop
    lag, CPU and host figures with the schedule lag of the rows; for a run.json written
    before the policy kept its figures, its recorded bottleneck flag."""
    from agent_replay.analysis.selfcheck import Assessment, assess_meta

    meta = RunMeta.of(meta)
    lag = stats.latency["schedule_lag"]
    a = assess_meta(meta, lag.values.get(99.0), lag.count)
    legacy = meta.self_check is None or meta.self_check.kind is None
    if a is None or (legacy and meta.load_generator_bottleneck):
        if meta.load_generator_bottleneck:
            why = meta.load_generator_warning or "its own lag or CPU limited the load"
            return Assessment("saturated", f"load generator saturated: {why}")
        return Assessment("ok", None)
    return a


def running_line(meta: RunMeta) -> str:
    """The warning for a run.json that still says ``running``: the run is under way, or
    its process is gone (killed before it could write its end), or it cannot be told."""
    w = meta.writer or {}
    who = f"pid {w.get('pid')} on {w.get('host')}" if w.get("pid") else "not recorded"
    state = writer_state(meta)
    if state == "gone":
        return (
            f"WARNING: run.json says running, but the process that ran it ({who}) is "
            "gone: it was killed before it could write its end; the totals in run.json "
            "are not final and the numbers cover the rows written before that."
        )
    if state == "alive":
        return (
            f"WARNING: this run is still running ({who}); its numbers cover the rows "
            "written so far."
        )
    return (
        f"WARNING: run.json says running and its process ({who}) cannot be checked from "
        "here: the run is either still under way or was killed; its numbers cover the "
        "rows written so far."
    )


def _warnings(meta: RunMeta, stats: RunStats) -> list[str]:
    out = _status_warnings(meta, stats) + _recorded_warnings(meta)
    dropped = {k: s.dropped for k, s in stats.latency.items() if s.dropped}
    if dropped:
        out.append(
            "warning: samples out of histogram range were dropped: "
            + ", ".join(f"{k} {v}" for k, v in dropped.items())
        )
    counted = stats.requests["ok"] + stats.requests["failed"]
    if counted and stats.requests["failed"] / counted > ERROR_RATE_WARN:
        out.append(
            f"warning: {stats.requests['failed']} of {counted} requests failed "
            f"({100 * stats.requests['failed'] / counted:.1f}%); latency statistics "
            "cover successful requests only."
        )
    if stats.inexact["requests"]:
        out.append(
            inexact_warning(
                stats.inexact["requests"], stats.requests["ok"], stats.inexact["without_usage"]
            )
        )
    mism = stats.fidelity["output_mismatches"]
    if mism:
        out.append(
            f"warning: {mism} requests returned a different number of output tokens "
            "than the trace asked for (does the server honour ignore_eos/min_tokens?)."
        )
    return out


def _status_warnings(meta: RunMeta, stats: RunStats) -> list[str]:
    """The run's status when it did not end well, and the self-check's line."""
    out: list[str] = []
    status = meta.status
    if status == "running":
        out.append(running_line(meta))
    elif status not in (None, "ok", "complete"):  # "complete": folders written before "ok"
        why = f": {meta.error}" if meta.error else ""
        out.append(
            f"WARNING: this run ended with status {status}{why}; its numbers cover "
            "what completed before that."
        )
    check = self_check(meta, stats)
    if check.bottleneck:
        out.append(f"WARNING: {check.line}; this run's numbers understate the server.")
    elif check.line:
        out.append(f"warning: {check.line}.")
    return out


def _recorded_warnings(meta: RunMeta) -> list[str]:
    """The warnings run.json records, but the self-check (said once, by ``_status_warnings``)
    and token-count mismatches (their own line)."""
    skip = {meta.self_check.line if meta.self_check else None, meta.load_generator_warning}
    return [
        f"warning: {w}"
        for w in meta.warnings
        if not (w in skip or "not served with the trace's token counts" in w or _old_self_check(w))
    ]


def _old_self_check(w: str) -> bool:
    """A self-check line of a run.json written before the one policy (its three forms)."""
    return w.startswith(("schedule lag p99 ", "event-loop lag p99 ", "load generator CPU "))


def build_report(
    results_dir: str | os.PathLike[str],
    *,
    slo: Slo | None = None,
    gpus: int | None = None,
    prices: Prices | None = None,
) -> Report:
    """Read a results folder and compute everything the report shows."""
    if gpus is not None and gpus <= 0:
        raise InputError("--gpus must be a positive integer")
    meta = read_run_record(results_dir)
    if gpus is None:
        gpus = meta.gpus
    acc = Accumulator()
    for batch in iter_request_batches(results_dir, COLUMNS):
        acc.add(batch)
    stats = acc.finish(slo=slo, prices=prices, gpus=gpus)
    server = _server_summary(read_server_metrics(results_dir))
    from agent_replay.analysis.coldstart import cold_start

    cold = cold_start(meta, stats.per_request, results_dir, warmup_rows=stats.requests["warmup"])
    warnings = _warnings(meta, stats) + ([f"warning: cold start: {cold}."] if cold else [])
    samples = read_gpu_telemetry(results_dir)
    head = headline(stats.tps, stats.inexact["requests"])
    if meta.agentx is not None or meta.options.get("timing") == "agentx":
        head = agentx_headline(stats.latency, head)
    return Report(
        results_dir=str(results_dir),
        meta=meta,
        stats=stats,
        headline=head,
        warnings=warnings,
        server=server,
        cold_start=cold,
        gpu=gpu_section(results_dir, meta, stats, samples),
        gpu_samples=samples,
    )
