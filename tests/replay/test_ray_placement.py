"""The pure parts of the Ray backend: placement, t0 rebasing, lost-session accounting, and
the one-line error when ray is missing. No cluster needed."""

from __future__ import annotations

import sys

import pytest

from agent_replay.errors import InputError
from agent_replay.replay.distributed import (
    ActorSpec,
    NodeInfo,
    import_ray,
    lost_sessions,
    place,
    rebase_t0,
)
from agent_replay.replay.distributed.placement import alive_nodes
from agent_replay.replay.plan import Plan, PlannedRequest, PlannedSession


def test_place_deals_shards_round_robin_and_caps_cpus() -> None:
    nodes = [NodeInfo("a", "h1", 4.0), NodeInfo("b", "h2", 1.0)]
    specs = place(nodes, 2)
    assert specs == [
        ActorSpec(0, "a", "h1", 1.0),
        ActorSpec(1, "b", "h2", 0.5),
        ActorSpec(2, "a", "h1", 1.0),
        ActorSpec(3, "b", "h2", 0.5),
    ]


def test_place_rejects_bad_input() -> None:
    with pytest.raises(InputError, match="actors-per-node"):
        place([NodeInfo("a", "h", 1.0)], 0)
    with pytest.raises(InputError, match="no alive node"):
        place([], 1)


def test_alive_nodes_skips_dead_and_cpu_less_nodes() -> None:
    raw = [
        {"NodeID": "z", "NodeManagerAddress": "10.0.0.2", "Alive": True, "Resources": {"CPU": 8.0}},
        {
            "NodeID": "y",
            "NodeManagerAddress": "10.0.0.1",
            "Alive": False,
            "Resources": {"CPU": 8.0},
        },
        {"NodeID": "x", "NodeManagerAddress": "10.0.0.3", "Alive": True, "Resources": {"GPU": 1.0}},
        {"NodeID": "w", "NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {"CPU": 2.0}},
    ]
    assert alive_nodes(raw) == [NodeInfo("w", "10.0.0.1", 2.0), NodeInfo("z", "10.0.0.2", 8.0)]


def test_rebase_t0_keeps_the_distance_to_the_start() -> None:
    # the run starts 1.5 s after "now" on the wall clock; this host's monotonic clock reads 7 s
    assert (
        rebase_t0(
            t0_wall_ns=101_500_000_000, now_wall_ns=100_000_000_000, now_mono_ns=7_000_000_000
        )
        == 8_500_000_000
    )
    # a start already past gives a t0 in this host's past
    assert rebase_t0(5, 10, 100) == 95


def _session(sid: str, clone: int, n: int) -> PlannedSession:
    reqs = [
        PlannedRequest(
            sid, clone, i, i - 1, i - 1, 0, 0, 10, 5, [], "completions", None, None, None
        )
        for i in range(n)
    ]
    return PlannedSession(sid, clone, 0, reqs)


def test_lost_sessions_lists_every_incomplete_session() -> None:
    plan = Plan([_session("a", 0, 3), _session("b", 0, 2), _session("a", 1, 4)], 16)
    lost = lost_sessions(plan, {"a": 3, "b": 1, "zzz": 9}, shard=2, host="h", reason="killed")
    assert lost.planned_requests == 9
    assert lost.recorded_requests == 4
    assert lost.sessions == [
        {"session": "b", "planned": 2, "recorded": 1},
        {"session": "a#1", "planned": 4, "recorded": 0},
    ]
    js = lost.to_json()
    assert js["shard"] == 2 and js["reason"] == "killed"
    assert "shard 2" in lost.line() and "2 sessions" in lost.line() and "5 of 9" in lost.line()


def test_missing_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"pip install 'agent-replay\[ray\]'"):
        import_ray()
