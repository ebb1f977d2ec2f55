"""Counters that merge by declared rules (``analysis.counters``): the rules on hand-made
values, and the worker, run and live summaries merged by them."""

from __future__ import annotations

from dataclasses import dataclass

from agent_replay.analysis.counters import (
    Counters,
    add,
    counter,
    keyed,
    keyed_lists,
    largest,
    merge_all,
)
from agent_replay.analysis.live import LiveStats
from agent_replay.replay.runrecord import RunSummary
from agent_replay.replay.worker import GC_MERGE, WorkerSummary


def test_rules() -> None:
    assert keyed({"http": 2}, {"http": 1, "timeout": 3}) == {"http": 3, "timeout": 3}
    assert keyed_lists({0: [5, 1]}, {0: [2, 2], 1: [1, 1]}) == {0: [7, 3], 1: [1, 1]}
    assert largest(2.5, 1.0) == 2.5 and add(b"ab", b"c") == b"abc"
    assert GC_MERGE(
        {"gc_young_collections": 3, "gc_pause_max_ns": 7},
        {"gc_young_collections": 2, "gc_pause_max_ns": 5},
    ) == {"gc_young_collections": 5, "gc_pause_max_ns": 7}


def test_workers_merge_into_the_run_summary() -> None:
    a = WorkerSummary(
        0,
        total=10,
        sent=9,
        ok=7,
        errors={"http": 2},
        wall_s=3.0,
        cpu_s=1.0,
        output_tokens=70,
        gc={"gc_young_collections": 1, "gc_pause_max_ns": 9},
    )
    b = WorkerSummary(
        1,
        total=5,
        sent=5,
        ok=4,
        errors={"http": 1, "timeout": 1},
        wall_s=4.0,
        cpu_s=0.5,
        output_tokens=40,
        gc={"gc_young_collections": 2, "gc_pause_max_ns": 4},
    )
    s = RunSummary(output="o")
    merge_all(s, [a, b])
    assert (s.total, s.sent, s.ok, s.output_tokens) == (15, 14, 11, 110)
    assert s.errors == {"http": 3, "timeout": 1} and s.failed == 4
    assert (s.wall_s, s.cpu_s) == (4.0, 1.5)
    assert s.gc == {"gc_young_collections": 3, "gc_pause_max_ns": 9}
    both = WorkerSummary(9)
    merge_all(both, [a, b])
    assert both.shard == 9 and both.aborted is False and both.sent == 14  # shard is no count


def test_a_new_count_is_one_declared_field() -> None:
    @dataclass
    class More(WorkerSummary):
        retries: int = counter(0)
        slowest_ms: float = counter(0.0, largest)

    m = More(0)
    merge_all(m, [More(1, retries=2, slowest_ms=5.0), More(2, retries=1, slowest_ms=9.0)])
    assert (m.retries, m.slowest_ms) == (3, 9.0)
    assert set(More.merges()) - set(WorkerSummary.merges()) == {"retries", "slowest_ms"}


def test_live_stats_merge_by_their_declared_rules() -> None:
    a, b = LiveStats(), LiveStats()
    a.ok, a.errors, a.throughput, a.elapsed_ns, a.cpu_percent = (
        2,
        {"http": 1},
        {3: [10, 1]},
        5,
        [50.0],
    )
    b.ok, b.errors, b.throughput, b.elapsed_ns, b.cpu_percent = (
        1,
        {"http": 2},
        {3: [4, 2], 4: [1, 1]},
        9,
        [20.0],
    )
    a.merge(b)
    assert (a.ok, a.errors, a.elapsed_ns, a.cpu_percent) == (3, {"http": 3}, 9, [50.0, 20.0])
    assert a.throughput == {3: [14, 3], 4: [1, 1]}
    assert isinstance(a, Counters) and "throughput" in LiveStats.merges()
