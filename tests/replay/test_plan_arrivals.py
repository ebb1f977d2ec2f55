"""Arrival-rate and concurrent-session load as plan functions."""

from __future__ import annotations

import numpy as np
import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.errors import InputError
from agent_replay.replay.plan import PlanOptions, arrival_offsets, build_plan, concurrent_starts
from tests.replay.helpers import MS, chain_rows, trace_table


def test_constant_and_poisson_offsets() -> None:
    assert arrival_offsets(4, 2.0, "constant") == [0, 500 * MS, 1000 * MS, 1500 * MS]
    a = arrival_offsets(20_000, 4.0, "poisson", seed=3)
    assert (
        a
        == arrival_offsets(20_000, 4.0, "poisson", seed=3)
        != arrival_offsets(20_000, 4.0, "poisson", seed=4)
    )
    gaps = np.diff(a) / 1e9
    assert a[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: sd = mean
    assert concurrent_starts(4, 1.0) == [0, 250 * MS, 500 * MS, 750 * MS]


def test_plan_with_rate_moves_sessions_and_keeps_their_shape() -> None:
    t = trace_table(chain_rows(3, 3))
    base = build_plan(t, 16, PlanOptions())
    plan = build_plan(t, 16, PlanOptions(rate=10.0, arrival="constant"))
    assert [s.start_ns for s in plan.sessions] == [0, 100 * MS, 200 * MS]
    for b, s in zip(base.sessions, plan.sessions, strict=True):
        assert [q.offset_ns - s.start_ns for q in s.requests] == [
            q.offset_ns - b.start_ns for q in b.requests
        ]
        assert [q.think_ns for q in s.requests] == [q.think_ns for q in b.requests]


def test_plan_with_concurrent_sessions_clones_to_the_count() -> None:
    t = trace_table(chain_rows(3, 2))
    plan = build_plan(t, 16, PlanOptions(concurrent_sessions=7, ramp_s=0.7))
    assert len(plan.sessions) == 7
    assert [s.start_ns for s in plan.sessions] == [i * 100 * MS for i in range(7)]
    assert len({s.key for s in plan.sessions}) == 7  # clones have their own keys (disjoint prompts)
    assert len(build_plan(t, 16, PlanOptions(concurrent_sessions=2)).sessions) == 2


@pytest.mark.parametrize(
    "opts, msg",
    [
        (PlanOptions(rate=0), "--rate must be > 0"),
        (PlanOptions(rate=1, concurrent_sessions=2), "two load axes"),
        (PlanOptions(arrival="burst"), "--arrival must be one of"),
        (PlanOptions(concurrent_sessions=0), "--concurrent-sessions must be >= 1"),
    ],
)
def test_bad_options(opts: PlanOptions, msg: str) -> None:
    with pytest.raises(InputError, match=msg):
        opts.check()


@pytest.mark.slow
def test_run_with_a_constant_rate_sends_roots_on_the_grid(tmp_path) -> None:  # type: ignore[no-untyped-def]

    import pyarrow.parquet as pq

    from agent_replay.engines.sim import SimProcess
    from agent_replay.replay.cli import main
    from tests.replay.helpers import write_rows

    trace = write_rows(tmp_path / "t.parquet", chain_rows(5, 2, output_tokens=4))
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        rc = main(
            [
                "run",
                str(trace),
                "--target",
                sim.url,
                "--output",
                str(out),
                "--rate",
                "20",
                "--arrival",
                "constant",
                "--scrape-interval",
                "0",
                "--no-progress",
                "--salt",
                "0",
            ]
        )
    assert rc == 0
    meta = read_run_record(out)
    assert (meta.option("rate"), meta.option("arrival")) == (20.0, "constant")
    d = pq.read_table(out / "requests").to_pydict()
    roots = sorted(i for i, p in zip(d["intended_ns"], d["parent_index"], strict=True) if p < 0)
    assert np.diff(roots).tolist() == [50 * MS] * 4  # every 1/20 s
