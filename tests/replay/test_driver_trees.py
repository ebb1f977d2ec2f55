"""Replay of agent trees under the fake clock: dependencies, parallel branches, joins,
background branches, the think-time cap and session rebasing."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from agent_replay.replay.clock import FakeClock
from agent_replay.replay.driver import Driver
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlanOptions, build_plan
from tests.replay.helpers import MS, FakeTransport, trace_table

T0 = 5_000 * MS


def tree_rows(session: str = "s", start_ns: int = 0) -> list[dict[str, Any]]:
    """main 0 spawns x (1, 3) and y (2, 4) in parallel; main 5 joins both; z (6) spawned by
    main 5 is never joined (background); main 7 follows main 5."""
    spec = [  # (agent, depends_on, think ms, arrival ms)
        ("main", [], None, 0),
        ("x", [0], 10, 30),
        ("y", [0], 20, 40),
        ("x", [1], 30, 90),
        ("y", [2], 5, 70),
        ("main", [0, 3, 4], 40, 200),
        ("z", [5], 10, 260),
        ("main", [5], 15, 270),
    ]
    rows = []
    for i, (agent, deps, think, at) in enumerate(spec):
        rows.append(
            {
                "session_id": session,
                "request_index": i,
                "parent_index": -1,
                "arrival_ns": start_ns + at * MS,
                "think_ns": None if think is None else think * MS,
                "input_tokens": 32,
                "output_tokens": 4,
                "agent_id": agent,
                "depends_on": deps,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> pa.Table:
    t = trace_table(rows)
    t = t.append_column("agent_id", pa.array([r["agent_id"] for r in rows], pa.string()))
    return t.append_column(
        "depends_on", pa.array([r["depends_on"] for r in rows], pa.list_(pa.int32()))
    )


def replay(
    rows: list[dict[str, Any]],
    mode: str = "session",
    service: dict[int, int] | None = None,
    **opts: Any,
) -> tuple[dict[int, RequestRecord], Driver]:
    plan = build_plan(table(rows), 16, PlanOptions(**opts))
    clock = FakeClock(start_ns=T0 - 2_000 * MS)
    transport = FakeTransport(clock, 50 * MS)
    if service:  # per request_index service time
        base_send = transport.send

        async def send(prepared: Any, rec: RequestRecord) -> None:
            transport.service_ns = service.get(rec.request_index, 50 * MS)
            await base_send(prepared, rec)

        transport.send = send  # type: ignore[method-assign]
    recs: list[RequestRecord] = []
    driver = Driver(
        plan,
        transport,
        clock,
        mode=mode,
        t0_ns=T0,
        on_record=recs.append,
        concurrency=4 if mode == "max-rate" else None,
    )
    clock.run(driver.run())
    return {r.request_index: r for r in recs}, driver


def test_session_timing_waits_for_every_dependency() -> None:
    # x's first turn takes 300 ms: the join (5) waits for it although y finished long before
    by, _ = replay(tree_rows(), service={1: 300 * MS})
    assert len(by) == 8
    for i, r in by.items():
        deps = tree_rows()[i]["depends_on"]
        assert r.agent_id == tree_rows()[i]["agent_id"] and r.depends_on == deps
        if not deps:
            assert r.parent_end_ns is None and r.intended_ns == T0
            continue
        latest = max(by[d].end_ns for d in deps)  # type: ignore[type-var]
        assert r.parent_end_ns == latest
        assert r.intended_ns == latest + r.think_ns  # type: ignore[operator]
        assert r.sent_ns is not None and r.sent_ns >= latest
    # x and y run in parallel: y's first turn starts while x's is in flight
    assert by[2].sent_ns < by[1].end_ns  # type: ignore[operator]
    # the join starts after both branches' last turns
    assert by[5].sent_ns > max(by[3].end_ns, by[4].end_ns)  # type: ignore[type-var,operator]
    # background z runs on while main 7 goes: 7 does not wait for z
    assert by[7].sent_ns < by[6].end_ns  # type: ignore[operator]


def test_max_rate_respects_dependencies() -> None:
    by, _ = replay(tree_rows(), mode="max-rate")
    for i, r in by.items():
        for d in tree_rows()[i]["depends_on"]:
            assert r.sent_ns >= by[d].end_ns  # type: ignore[operator]


def test_absolute_timing_sends_early_and_the_results_count_it() -> None:
    from agent_replay.analysis.runstats import early_sends
    from agent_replay.replay.results import records_to_table

    by, _ = replay(tree_rows(), mode="absolute", service={1: 300 * MS})
    for r in by.values():
        assert r.intended_ns == T0 + tree_rows()[r.request_index]["arrival_ns"]
    t = records_to_table(list(by.values()), T0)
    early = early_sends(t)
    assert early is not None
    got = {int(i) for i, e in zip(t.column("request_index").to_pylist(), early, strict=True) if e}
    # by hand (ms from t0, 50 ms service, 300 for request 1): 0 ends 50, so 1 (30) and 2 (40)
    # go early; 3 (90) before 1 ends (330); 4 (70) before 2 ends (90); 5 (200) after 3 (140)
    # and 4 (120); 6 (260) and 7 (270) after 5 (250).
    want = {
        i
        for i, row in enumerate(tree_rows())
        for d in row["depends_on"]
        if by[i].sent_ns < by[d].end_ns
    }  # type: ignore[operator]
    assert got == want == {1, 2, 3, 4}
    # and the report's fidelity row says 4, not 0
    from agent_replay.analysis.runstats import accumulate

    assert accumulate([t]).finish().fidelity["sent_before_parent_end"] == 4


async def test_max_think_caps_and_rebase_starts_sessions_at_zero() -> None:
    rows = tree_rows("a") + tree_rows("b", start_ns=3_600_000 * MS)
    plan = build_plan(table(rows), 16, PlanOptions(max_think_s=0.012, rebase_sessions=True))
    assert [s.start_ns for s in plan.sessions] == [0, 0]
    thinks = [q.think_ns for q in plan.sessions[0].requests]
    assert thinks == [0, 10 * MS, 12 * MS, 12 * MS, 5 * MS, 12 * MS, 10 * MS, 12 * MS]
    assert plan.sessions[1].requests[5].offset_ns == 200 * MS
