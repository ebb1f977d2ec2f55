"""The load generator's self-check: which lags and CPU figures raise which warnings."""

from __future__ import annotations

from replay.selfmon import verdict

MS = 1_000_000


def test_quiet_run_has_no_warning() -> None:
    r = verdict([50_000] * 200, [300_000] * 500, 0.2)
    assert r.warnings == []
    assert r.schedule_lag_p99_ns == 50_000 and r.loop_lag_p99_ns == 300_000


def test_late_sends_loop_stalls_and_cpu_are_each_named() -> None:
    lags = [100_000] * 190 + [5 * MS] * 10  # 5% of sends 5 ms late: P99 = 5 ms
    loop = [1 * MS] * 480 + [9 * MS] * 20  # 4% of ticks 9 ms late: P99 = 9 ms
    r = verdict(lags, loop, 0.95)
    assert r.schedule_lag_p99_ns == 5 * MS and r.loop_lag_p99_ns == 9 * MS
    text = " | ".join(r.warnings)
    assert "schedule lag p99 5.0 ms > 2 ms" in text
    assert "event-loop lag p99 9.0 ms > 5 ms" in text
    assert "CPU 95% of a core" in text


def test_max_rate_waits_are_not_schedule_lag_warnings() -> None:
    assert verdict([5 * MS] * 200, [MS] * 200, 0.1, mode="max-rate").warnings == []


def test_too_few_samples_for_a_p99_raise_no_lag_warning() -> None:
    # 57 requests: their "P99" is the single latest one; no verdict on that
    r = verdict([50_000] * 56 + [3 * MS], [MS] * 50 + [20 * MS], 0.1)
    assert r.schedule_lag_p99_ns == 3 * MS
    assert r.warnings == []
