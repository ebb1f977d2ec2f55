"""The one self-check policy: saturation, host contention and stalls, with fitting advice."""

from __future__ import annotations

import pytest

from agent_replay.analysis.selfcheck import LAG_P99_NS, Assessment, Machine, assess

MS = 1_000_000
QUIET = Machine(cpus=2, busy_cores=0.4, steal=0.0, ours_cores=0.07)


def _a(
    sched: float | None = None,
    loop: float | None = None,
    cpu: float = 0.07,
    machine: Machine | None = QUIET,
    n: int = 500,
    mode: str = "session",
) -> Assessment:
    return assess(
        schedule_lag_p99_ns=sched,
        schedule_lag_n=n,
        loop_lag_p99_ns=loop,
        loop_lag_n=n,
        cpu_fraction=cpu,
        machine=machine,
        mode=mode,
    )


def test_quiet() -> None:
    a = _a(1 * MS, 2 * MS)
    assert (a.kind, a.line, a.bottleneck) == ("ok", None, False)
    assert _a(LAG_P99_NS, LAG_P99_NS).kind == "ok"  # the bound itself passes


def test_demo_case_low_cpu_is_never_told_to_add_workers() -> None:
    # a first demo on a quiet 2-core machine: loop lag p99 18 ms at 7% CPU
    a = _a(loop=18 * MS)
    assert a.kind == "stall" and not a.bottleneck
    assert "event-loop lag p99 18.0 ms" in a.line and "7% of a core" in a.line  # type: ignore[operator]
    assert "more --workers would not help" in a.line and "use more --workers" not in a.line  # type: ignore[operator]


@pytest.mark.parametrize("machine", [Machine(2, 1.9, 0.0, 0.07), Machine(8, 1.0, 0.12, 0.1)])
def test_contention_from_other_processes_or_steal(machine: Machine) -> None:
    a = _a(sched=12 * MS, machine=machine)
    assert a.kind == "contention" and a.contention and not a.bottleneck
    assert "host contention" in a.line and "--cpus" in a.line  # type: ignore[operator]


def test_saturation_wins_over_contention_and_cpu_alone_counts() -> None:
    a = _a(sched=12 * MS, cpu=0.9, machine=Machine(2, 1.95, 0.0, 0.9))
    assert a.kind == "saturated" and a.bottleneck and "use more --workers" in a.line  # type: ignore[operator]
    assert _a(cpu=0.97).kind == "saturated"
    assert _a(cpu=0.88).kind == "ok"  # busy but no lag: not a verdict


def test_counts_and_mode() -> None:
    assert _a(sched=50 * MS, n=99).kind == "ok"
    assert _a(sched=50 * MS, mode="max-rate").kind == "ok"
    assert _a(loop=50 * MS, mode="max-rate").kind == "stall"
