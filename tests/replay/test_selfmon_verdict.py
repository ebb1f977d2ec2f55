"""The load generator's self-check: which lags and CPU figures give which verdict (the
policy itself is ``analysis.selfcheck``; tests/analysis/test_selfcheck.py)."""

from __future__ import annotations

from agent_replay.analysis.selfcheck import Machine
from agent_replay.replay.selfmon import pct, verdict

MS = 1_000_000


def test_quiet_run_has_no_warning() -> None:
    r = verdict([50_000] * 200, [300_000] * 500, 0.2)
    assert r.warnings == [] and r.kind == "ok"
    assert r.schedule_lag_p99_ns == 50_000 and r.loop_lag_p99_ns == 300_000


def test_percentile_is_nearest_rank() -> None:
    # 200 samples 1..200: nearest rank ceil(0.99 x 200) = 198 (numpy 'higher' gives 199)
    assert pct(list(range(1, 201)), 99) == 198
    assert pct(list(range(1, 201)), 50) == 100 and pct([7], 99) == 7 and pct([], 50) is None


def test_saturated_load_generator_names_lags_and_cpu_once() -> None:
    lags = [100_000] * 190 + [6 * MS] * 10  # 5% of sends 6 ms late: P99 = 6 ms
    loop = [1 * MS] * 480 + [9 * MS] * 20  # 4% of ticks 9 ms late: P99 = 9 ms
    r = verdict(lags, loop, 0.95)
    assert r.schedule_lag_p99_ns == 6 * MS and r.loop_lag_p99_ns == 9 * MS
    assert r.kind == "saturated" and len(r.warnings) == 1
    assert "schedule lag p99 6.0 ms, event-loop lag p99 9.0 ms" in r.line  # type: ignore[operator]
    assert "CPU 95% of a core" in r.warnings[0] and "use more --workers" in r.warnings[0]


def test_contention_is_told_from_saturation() -> None:
    busy = Machine(cpus=2, busy_cores=1.9, steal=0.0, ours_cores=0.07)
    r = verdict([50_000] * 200, [1 * MS] * 480 + [18 * MS] * 20, 0.07, machine=busy)
    assert r.kind == "contention" and r.machine == {
        "cpus": 2,
        "busy_cores": 1.9,
        "steal": 0.0,
        "ours_cores": 0.07,
    }
    assert "more --workers would not help" in r.warnings[0] and "1.8 of 2 CPUs" in r.warnings[0]


def test_max_rate_waits_are_not_schedule_lag_warnings() -> None:
    assert verdict([6 * MS] * 200, [MS] * 200, 0.1, mode="max-rate").warnings == []


def test_too_few_samples_for_a_p99_raise_no_lag_warning() -> None:
    # 57 requests: their "P99" is the single latest one; no verdict on that
    r = verdict([50_000] * 56 + [6 * MS], [MS] * 50 + [20 * MS], 0.1)
    assert r.schedule_lag_p99_ns == 6 * MS
    assert r.warnings == []
