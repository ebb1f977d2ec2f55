"""The end-of-run summary printed by ``run`` and ``demo``. The load generator's own
warnings come first: a run whose client was the bottleneck says so on its first line."""

from __future__ import annotations

from typing import TextIO

from agent_replay.replay.runrecord import RunSummary


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f} ms"


def render_summary(s: RunSummary, out: TextIO) -> None:
    for w in s.warnings:
        print(f"WARNING: {w}", file=out)
    sc = s.self_check
    state = {"interrupted": "INTERRUPTED: partial results",
             "aborted": "ABORTED (--abort-after-failures): partial results",
             "partial": "PARTIAL: workers were lost",
             "incomplete": "INCOMPLETE: rows lost",
             "failed": f"FAILED (over {s.max_failure_rate:.0%} of the requests failed)"
             }.get(s.status, "done")
    cancelled = f", {s.cancelled} cancelled by the stop" if s.cancelled else ""
    unwritten = f", {s.unwritten} WITHOUT A ROW (not written)" if s.unwritten else ""
    print(f"{state}: {s.ok} ok, {s.failed} failed{cancelled}{unwritten}, {s.skipped} not sent (past "
          f"--duration), of {s.total} planned requests in {s.wall_s:.1f} s", file=out)
    if s.errors:
        print("  failures: " + ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())), file=out)
    inexact = (f"; {s.inexact:,} with inexact tokens per chunk (no token ids or continuous usage)"
               if s.inexact else "")
    print(f"  output tokens {s.output_tokens:,} in {s.chunks:,} chunks; token-count mismatches vs "
          f"trace: {s.mismatches}{inexact}", file=out)
    print(f"  load generator: schedule lag p50 {_ms(sc.schedule_lag_p50_ns)}, p99 "
          f"{_ms(sc.schedule_lag_p99_ns)}, max {_ms(sc.schedule_lag_max_ns)}; loop lag p99 "
          f"{_ms(sc.loop_lag_p99_ns)}; CPU {sc.cpu_fraction * 100:.0f}% of a core", file=out)
    line = _headline(s.output)
    if line:
        print(f"  {line}", file=out)
    print(f"  results: {s.output}  (full report: agent-replay report {s.output})", file=out)


def _headline(results: str) -> str | None:
    """The report's headline (P90 per-user decode speed), when the analysis can read the run."""
    try:
        from agent_replay.analysis.report import build_report

        return str(build_report(results).headline["text"])
    except Exception:  # the summary must not fail a finished run
        return None
