"""The capacity answer's interval from the bracket's repeats."""

from __future__ import annotations

import pytest

from agent_replay.analysis.replicates import mean_ci
from agent_replay.replay.sweep.capacity import Capacity, crossing_interval, parse_slo


def _runs(col: str, values: list[float]) -> list[dict[str, float]]:
    return [{col: v} for v in values]


def test_crossing_by_hand() -> None:
    slo = parse_slo("p90_tps>=20")
    # no spread: margins +2 at 14 and -2 at 15 cross half way
    assert crossing_interval(
        _runs("p90_tps", [22.0] * 3), _runs("p90_tps", [18.0] * 3), 14, 15, slo
    ) == pytest.approx((14.5, 14.5, 14.5))
    # spread at both ends: the pessimistic crossing uses 14's low bound and 15's low bound
    a, b = [21.0, 22.0, 23.0], [17.0, 18.0, 19.0]
    ca, cb = mean_ci(a), mean_ci(b)
    assert ca.estimate and ca.low and ca.high and cb.estimate and cb.low and cb.high

    def cross(x: float, y: float) -> float:
        return 14 + (x - 20) / ((x - 20) - (y - 20))

    x, lo, hi = crossing_interval(_runs("p90_tps", a), _runs("p90_tps", b), 14, 15, slo) or (
        0,
        0,
        0,
    )
    assert x == pytest.approx(cross(ca.estimate, cb.estimate))
    assert lo == pytest.approx(cross(ca.low, cb.low))
    assert hi == pytest.approx(cross(ca.high, cb.high))
    assert lo < x < hi
    # an end whose interval straddles the bound: its pessimistic margin is below the other
    # end's, so that line never crosses; the interval reaches past the bracket, one bracket
    # width at most
    wide = crossing_interval(
        _runs("p90_tps", [19.0, 22.0, 25.0]), _runs("p90_tps", [19.5] * 3), 14, 15, slo
    )
    assert wide is not None and wide[1] == 13 and 14 < wide[0] < wide[2] < 15
    # a latency term: bound - value is the margin; the first term to cross sets the answer
    two = parse_slo("p90_tps>=20,ttft_p90<=100ms")
    lo_runs = [{"p90_tps": 22.0, "ttft_p90_ms": 90.0}] * 2
    hi_runs = [{"p90_tps": 18.0, "ttft_p90_ms": 130.0}] * 2
    # p90_tps crosses at 10 + 10 x 2 / 4 = 15, ttft at 10 + 10 x 10 / 40 = 12.5
    assert crossing_interval(lo_runs, hi_runs, 10, 20, two) == pytest.approx((12.5, 12.5, 12.5))
    # one run at an end: no interval
    assert crossing_interval(lo_runs[:1], hi_runs, 10, 20, two) is None


def test_capacity_line_reports_the_crossing() -> None:
    c = Capacity(
        "sim",
        1,
        capacity=14,
        first_fail=15,
        interval=(14, 14),
        spread=(14, 15),
        crossing=(14.5, 14.2, 14.9),
    )
    line = c.line("concurrent_sessions")
    assert (
        "the SLO is crossed at 14.5 (95% interval 14.2 to 14.9, from the bracket's repeats)" in line
    )
