"""The scheduler's timing modes under a fake autojump clock: no real sleeping."""

from __future__ import annotations

import time

import pytest

from agent_replay.replay.clock import FakeClock
from agent_replay.replay.driver import Driver
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlanOptions, build_plan
from tests.replay.helpers import MS, FakeTransport, chain_rows, trace_table

T0 = 5_000 * MS


def run_plan(rows, mode="session", service_ns=20 * MS, **opts):
    conc = opts.pop("concurrency", None)
    duration = opts.pop("duration_ns", None)
    warmup = opts.pop("warmup_ns", 0)
    plan = build_plan(trace_table(rows), 16, PlanOptions(**opts))
    clock = FakeClock(start_ns=T0 - 2_000 * MS)
    transport = FakeTransport(clock, service_ns)
    recs: list[RequestRecord] = []
    driver = Driver(
        plan,
        transport,
        clock,
        mode=mode,
        t0_ns=T0,
        on_record=recs.append,
        concurrency=conc,
        duration_ns=duration,
        warmup_ns=warmup,
    )
    return plan, driver, transport, recs, clock


def test_session_mode_waits_for_parent_then_think_time():
    rows = chain_rows(3, 4, think_ns=50 * MS)
    _plan, driver, _tr, recs, clock = run_plan(rows, service_ns=200 * MS)
    wall = time.monotonic()
    clock.run(driver.run())
    assert time.monotonic() - wall < 5  # 2+ s of fake time without sleeping it
    assert len(recs) == 12
    by = {(r.session_id, r.request_index): r for r in recs}
    for s in range(3):
        root = by[(f"s{s}", 0)]
        assert root.intended_ns == T0 + s * 100 * MS  # original offset
        assert root.sent_ns == root.intended_ns
        for r in range(1, 4):
            rec, parent = by[(f"s{s}", r)], by[(f"s{s}", r - 1)]
            assert rec.parent_end_ns == parent.end_ns == parent.sent_ns + 200 * MS
            # the parent took 200 ms, longer than the original 300 ms arrival gap implies:
            # the request follows the parent's completion in this run plus the think time
            assert rec.intended_ns == parent.end_ns + 50 * MS
            assert rec.sent_ns >= parent.end_ns + 50 * MS
            assert rec.think_ns == 50 * MS
    assert list(driver.schedule_lag) == [0] * 12


def test_absolute_mode_ignores_parents():
    rows = chain_rows(2, 3)
    _plan, driver, _tr, recs, clock = run_plan(rows, mode="absolute", service_ns=1_000 * MS)
    clock.run(driver.run())
    for r in recs:
        s = int(r.session_id[1:])
        assert r.intended_ns == T0 + s * 100 * MS + r.request_index * 300 * MS
        assert r.sent_ns == r.intended_ns
        assert r.parent_end_ns is None and r.think_ns is None
    # requests overlap their parents: the parent (1 s) has not finished when the child goes
    by = {(r.session_id, r.request_index): r for r in recs}
    assert by[("s0", 1)].sent_ns < by[("s0", 0)].end_ns


def test_speedup_scales_offsets_and_think():
    rows = chain_rows(2, 2, think_ns=400 * MS)
    _plan, driver, _tr, recs, clock = run_plan(rows, service_ns=10 * MS, speedup=4.0)
    clock.run(driver.run())
    by = {(r.session_id, r.request_index): r for r in recs}
    assert by[("s1", 0)].intended_ns == T0 + 25 * MS  # 100 ms / 4
    assert by[("s1", 1)].intended_ns == by[("s1", 0)].end_ns + 100 * MS  # 400 ms / 4


def test_null_think_is_gap_minus_parent_duration():
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 20,
            "output_tokens": 2,
            "end_ns": 70 * MS,
        },
        {
            "session_id": "a",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 100 * MS,
            "input_tokens": 20,
            "output_tokens": 2,
        },
        {
            "session_id": "a",
            "request_index": 2,
            "parent_index": 1,
            "arrival_ns": 150 * MS,
            "input_tokens": 20,
            "output_tokens": 2,
        },
    ]
    plan = build_plan(trace_table(rows), 16, PlanOptions())
    q = plan.sessions[0].requests
    assert q[1].think_ns == 30 * MS  # 100 - 0 - 70
    assert q[2].think_ns == 50 * MS  # parent's duration unknown: the whole gap


def test_clones_are_staggered_and_run_independently():
    rows = chain_rows(4, 2)
    plan, driver, _tr, recs, clock = run_plan(rows, sessions_multiplier=3)
    assert len(plan.sessions) == 12
    clock.run(driver.run())
    assert len(recs) == 24
    keys = {(r.session_id, r.clone) for r in recs}
    assert keys == {(f"s{s}", c) for s in range(4) for c in range(3)}
    roots = {(r.session_id, r.clone): r.intended_ns for r in recs if r.request_index == 0}
    for s in range(4):
        base = roots[(f"s{s}", 0)]
        for c in (1, 2):
            shift = roots[(f"s{s}", c)] - base
            assert 0 <= shift < 100 * MS  # within the mean gap between session starts
    # deterministic: the same plan again gives the same stagger
    plan2 = build_plan(trace_table(rows), 16, PlanOptions(sessions_multiplier=3))
    assert [s.start_ns for s in plan2.sessions] == [s.start_ns for s in plan.sessions]


def test_simultaneous_arrivals_go_out_together():
    rows = [
        {
            "session_id": f"m{i}",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 3_000 * MS,
            "input_tokens": 10,
            "output_tokens": 1,
        }
        for i in range(28)
    ]
    rows.append(
        {
            "session_id": "first",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 10,
            "output_tokens": 1,
        }
    )
    _plan, driver, _tr, recs, clock = run_plan(rows, mode="absolute")
    clock.run(driver.run())
    sends = sorted(r.sent_ns for r in recs if r.session_id != "first")
    assert sends[0] == sends[-1] == T0 + 3_000 * MS


def test_max_rate_respects_concurrency_and_order():
    rows = chain_rows(10, 3)
    _plan, driver, tr, recs, clock = run_plan(
        rows, mode="max-rate", concurrency=4, service_ns=10 * MS
    )
    clock.run(driver.run())
    assert len(recs) == 30
    assert tr.max_in_flight == 4
    by = {(r.session_id, r.request_index): r for r in recs}
    for (sid, ri), r in by.items():
        if ri:
            assert r.sent_ns >= by[(sid, ri - 1)].end_ns  # causality holds in max-rate too
    # 30 requests x 10 ms over 4 slots: ceil(30 / 4) = 8 waves of 10 ms, no slot ever idle
    assert max(r.end_ns for r in recs) - T0 == 80 * MS


def test_duration_cuts_and_warmup_flags():
    rows = chain_rows(10, 1, gap_ns=100 * MS)
    _plan, driver, _tr, recs, clock = run_plan(
        rows, mode="absolute", duration_ns=450 * MS, warmup_ns=200 * MS
    )
    clock.run(driver.run())
    assert sorted(r.session_id for r in recs) == ["s0", "s1", "s2", "s3", "s4"]
    assert driver.skipped == 5
    assert {r.session_id for r in recs if r.warmup} == {"s0", "s1"}


def test_duration_in_session_mode_skips_descendants():
    rows = chain_rows(1, 5, think_ns=100 * MS)
    _plan, driver, _tr, recs, clock = run_plan(rows, duration_ns=250 * MS, service_ns=50 * MS)
    clock.run(driver.run())
    # 0 @0-50, 1 @150-200, 2 would go at 300 > 250: it and its descendants are not sent
    assert [r.request_index for r in recs] == [0, 1]
    assert driver.skipped == 3


def test_max_sessions_keeps_earliest():
    rows = chain_rows(6, 1)
    plan = build_plan(trace_table(rows), 16, PlanOptions(max_sessions=2))
    assert [s.session_id for s in plan.sessions] == ["s0", "s1"]


def test_fan_out_children_run_in_parallel_after_parent():
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "think_ns": None,
            "input_tokens": 10,
            "output_tokens": 1,
        },
        {
            "session_id": "a",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 0,
            "think_ns": 5 * MS,
            "input_tokens": 10,
            "output_tokens": 1,
        },
        {
            "session_id": "a",
            "request_index": 2,
            "parent_index": 0,
            "arrival_ns": 0,
            "think_ns": 7 * MS,
            "input_tokens": 10,
            "output_tokens": 1,
        },
        {
            "session_id": "a",
            "request_index": 3,
            "parent_index": 1,
            "arrival_ns": 0,
            "think_ns": 0,
            "input_tokens": 10,
            "output_tokens": 1,
        },
    ]
    _plan, driver, _tr, recs, clock = run_plan(rows, service_ns=100 * MS)
    clock.run(driver.run())
    by = {r.request_index: r for r in recs}
    assert by[1].sent_ns == by[0].end_ns + 5 * MS
    assert by[2].sent_ns == by[0].end_ns + 7 * MS
    assert by[3].sent_ns == by[1].end_ns
    assert by[2].sent_ns < by[1].end_ns  # siblings overlap


def test_prepare_error_aborts_the_run():
    rows = chain_rows(3, 2)
    _plan, driver, tr, _recs, clock = run_plan(rows)

    async def bad_prepare(q, rid, key):
        raise ValueError("cannot build")

    tr.prepare = bad_prepare  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="cannot build"):
        clock.run(driver.run())
