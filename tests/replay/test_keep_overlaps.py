"""``--speedup`` on session trees: the warning, and ``--keep-overlaps`` keeping the recorded
order (a request waits for what had ended before it started)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from agent_replay.replay.clock import FakeClock
from agent_replay.replay.driver import Driver
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlanOptions, build_plan, speedup_warning
from tests.replay.helpers import MS, FakeTransport, columns_table

S = 1_000 * MS
# main 0 (0-1 s) spawns x: x0 at 2 s ends 5 s; main 1 at 6 s depends on main 0 only (x ran
# in the background and had ended by then); think 5 s after main 0's end.
ROWS = [("main", 0, [], None, 1), ("x", 2, [0], 1, 3), ("main", 6, [0], 5, 1)]


def table() -> pa.Table:
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
            "end_ns",
            "agent_id",
            "depends_on",
        )
    }
    for i, (agent, t, deps, think, dur) in enumerate(ROWS):
        for k, v in (
            ("session_id", "s"),
            ("request_index", i),
            ("parent_index", -1),
            ("arrival_ns", t * S),
            ("think_ns", None if think is None else think * S),
            ("input_tokens", 32),
            ("output_tokens", 4),
            ("hash_ids", [i]),
            ("end_ns", dur * S),
            ("agent_id", agent),
            ("depends_on", deps),
        ):
            cols[k].append(v)
    return columns_table(cols)


def sends(opts: PlanOptions) -> dict[int, tuple[int, int]]:
    """request index -> (sent, end) with every request served in 3 s of fake time."""
    plan = build_plan(table(), 16, opts)
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    clock.run(
        Driver(plan, FakeTransport(clock, 3 * S), clock, t0_ns=0, on_record=recs.append).run()
    )
    return {r.request_index: (r.intended_ns, r.end_ns or 0) for r in recs}


def test_speedup_overlaps_what_the_recording_kept_apart_unless_told_not_to() -> None:
    # x10: main 0 at 0 ends 3 s (service is not sped up); x0 at 3 + 0.1, ends 6.1; main 1
    # at 3 + 0.5 = 3.5 s, while x0 runs: an overlap the recording did not have
    fast = sends(PlanOptions(speedup=10))
    assert fast[1] == (3_100 * MS, 6_100 * MS) and fast[2][0] == 3_500 * MS
    # kept: main 1 also waits for x0 (ended at 5 s < 6 s in the recording): 6.1 + 0.5
    kept = sends(PlanOptions(speedup=10, keep_overlaps=True))
    assert kept[1] == fast[1] and kept[2][0] == 6_600 * MS
    plan = build_plan(table(), 16, PlanOptions(speedup=10))
    w = speedup_warning(plan, PlanOptions(speedup=10))
    assert w is not None and "--keep-overlaps" in w
    assert speedup_warning(plan, PlanOptions(speedup=10, keep_overlaps=True)) is None
    assert speedup_warning(plan, PlanOptions()) is None
