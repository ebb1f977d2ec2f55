"""The end-of-run summary printed by ``run`` and ``demo``. The load generator's own
warnings come first: a run whose client was the bottleneck says so on its first line."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from agent_replay.replay.runrecord import RunSummary

if TYPE_CHECKING:
    from agent_replay.analysis.report import Report


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f} ms"


def status_line(s: RunSummary) -> str:
    """What the end line opens with: every condition of the run (``RunSummary.conditions``),
    each with its cause, the most serious first; ``done`` when there is none."""
    sent = max(1, s.sent - s.cancelled)
    labels = {
        "interrupted": "INTERRUPTED: partial results",
        "aborted": (
            "ABORTED: partial results"
            if s.abort_reason
            else "ABORTED (--abort-after-failures): partial results"
        ),
        "partial": "PARTIAL: workers were lost",
        "incomplete": "INCOMPLETE: rows lost",
        "failed": (
            f"FAILED ({s.failed:,} of {sent:,} sent requests failed, over {s.max_failure_rate:.0%})"
        ),
        "invalid": f"INVALID (AgentX rule): {s.invalid_reason}",
    }
    return "; ".join(labels[c] for c in s.conditions) or "done"


def _not_played(s: RunSummary) -> str:
    """The requests not played to their end: cancelled, not sent (interrupted or stopped),
    past the duration."""
    if s.interrupted:
        unsent = max(0, s.total - s.sent - s.skipped)
        return (
            f"{s.cancelled} cancelled in flight by the interrupt, {unsent} not sent "
            f"(interrupted), {s.skipped} not sent (past --duration)"
        )
    cancelled = f"{s.cancelled} cancelled by the stop, " if s.cancelled else ""
    stopped = max(0, s.total - s.sent - s.skipped) if s.aborted else 0
    return (
        f"{cancelled}{f'{stopped} not sent (stopped), ' if stopped else ''}"
        f"{s.skipped} not sent (past --duration)"
    )


def render_summary(
    s: RunSummary, out: TextIO, *, report: Report | None = None, html_line: str | None = None
) -> None:
    """``report``: the run's report when the caller has built it (else built here for the
    headline); ``html_line``: where the HTML report is, or how to get one."""
    if s.abort_reason:
        print(f"error: {s.abort_reason}", file=out)
    for w in s.warnings:
        print(f"WARNING: {w}", file=out)
    sc = s.self_check
    state = status_line(s)
    cut = _not_played(s)
    unwritten = f", {s.unwritten} WITHOUT A ROW (not written)" if s.unwritten else ""
    print(
        f"{state}: {s.ok} ok, {s.failed} failed{unwritten}, {cut}, of {s.total} planned requests in "
        f"{s.wall_s:.1f} s",
        file=out,
    )
    if s.errors:
        print("  failures: " + ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())), file=out)
    inexact = (
        f"; {s.inexact:,} with inexact tokens per chunk (no token ids or continuous usage)"
        if s.inexact
        else ""
    )
    print(
        f"  output tokens {s.output_tokens:,} in {s.chunks:,} chunks; token-count mismatches vs "
        f"trace: {s.mismatches}{inexact}",
        file=out,
    )
    print(
        f"  load generator: schedule lag p50 {_ms(sc.schedule_lag_p50_ns)}, p99 "
        f"{_ms(sc.schedule_lag_p99_ns)}, max {_ms(sc.schedule_lag_max_ns)}; loop lag p99 "
        f"{_ms(sc.loop_lag_p99_ns)}; CPU {sc.cpu_fraction * 100:.0f}% of a core",
        file=out,
    )
    rep = report if report is not None else load_report(s.output)
    if rep is not None:
        print(f"  {rep.headline['text']}", file=out)
    print(f"  results: {s.output}  (full report: agent-replay report {s.output})", file=out)
    if html_line:
        print(f"  {html_line}", file=out)


def load_report(results: str) -> Report | None:
    """The run's report (for its headline), or None when the analysis cannot read the run."""
    try:
        from agent_replay.analysis.report import build_report

        return build_report(results)
    except Exception:  # the summary must not fail a finished run
        return None
