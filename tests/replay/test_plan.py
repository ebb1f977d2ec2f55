"""The pure plan: hash ids, implied cache hits, clones, sharding."""

from __future__ import annotations

import pytest

from agent_replay.errors import InputError
from agent_replay.replay.plan import PlanOptions, build_plan
from tests.replay.helpers import MS, chain_rows, trace_table


def test_implied_cached_follows_shared_prefix_blocks():
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 40,
            "output_tokens": 1,
            "hash_ids": [1, 2, 3],
        },
        {
            "session_id": "a",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 10 * MS,
            "input_tokens": 60,
            "output_tokens": 1,
            "hash_ids": [1, 2, 3, 4],
        },
        {
            "session_id": "b",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 20 * MS,
            "input_tokens": 30,
            "output_tokens": 1,
            "hash_ids": [1, 9],
        },
        {
            "session_id": "c",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 30 * MS,
            "input_tokens": 20,
            "output_tokens": 1,
            "hash_ids": [1, 2],
        },
    ]
    plan = build_plan(trace_table(rows), 16, PlanOptions())
    got = {
        (q.session_id, q.request_index): q.implied_cached for s in plan.sessions for q in s.requests
    }
    # a/0 cached blocks 1, 2 in full but only 8 tokens of block 3 (no full server block):
    # a/1 hits 1, 2 = 32. b: block 1 = 16. c (20 tokens): 16 + 4 matched, but the last
    # prompt token is always computed: (20 - 1) // 16 * 16 = 16.
    assert got == {("a", 0): 0, ("a", 1): 32, ("b", 0): 16, ("c", 0): 16}


def test_clones_do_not_share_blocks_with_originals():
    rows = chain_rows(2, 2)
    plan = build_plan(trace_table(rows), 16, PlanOptions(sessions_multiplier=2))
    clones = [q for s in plan.sessions for q in s.requests if q.clone == 1]
    roots = [q for q in clones if q.request_index == 0]
    assert all(q.implied_cached == 0 for q in roots)  # nothing of a clone was seen before it
    assert all(q.implied_cached > 0 for q in clones if q.request_index == 1)  # its own parent


def test_rows_without_hash_ids_get_unique_blocks_or_parent_prefix():
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 50,
            "output_tokens": 1,
        },
        {
            "session_id": "a",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 10 * MS,
            "input_tokens": 80,
            "output_tokens": 1,
            "cached_tokens": 40,
        },
        {
            "session_id": "a",
            "request_index": 2,
            "parent_index": 1,
            "arrival_ns": 20 * MS,
            "input_tokens": 90,
            "output_tokens": 1,
        },
    ]
    plan = build_plan(trace_table(rows), 16, PlanOptions())
    q = plan.sessions[0].requests
    assert [len(x.hash_ids) for x in q] == [4, 5, 6]
    assert q[1].hash_ids[:2] == q[0].hash_ids[:2]  # 40 cached tokens -> 2 full blocks shared
    assert q[1].hash_ids[2] not in q[0].hash_ids
    assert not set(q[2].hash_ids) & set(q[1].hash_ids)  # no cached_tokens: nothing shared
    assert all(h < 0 for x in q for h in x.hash_ids)  # synthesized ids are negative
    assert q[1].implied_cached == 32


def test_short_hash_lists_are_extended():
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 50,
            "output_tokens": 1,
            "hash_ids": [7],
        }
    ]
    q = build_plan(trace_table(rows), 16, PlanOptions()).sessions[0].requests[0]
    assert q.hash_ids[0] == 7 and len(q.hash_ids) == 4


def test_shards_partition_sessions_evenly_over_time():
    # 40 sessions starting 100 ms apart, twice (clones): 80 sessions, 27/27/26 per shard, and
    # each shard's sessions start every third session of the whole run.
    rows = chain_rows(40, 1)
    plan = build_plan(trace_table(rows), 16, PlanOptions(sessions_multiplier=2))
    parts = [plan.shard(i, 3) for i in range(3)]
    keys = [s.key for p in parts for s in p.sessions]
    assert sorted(keys) == sorted(s.key for s in plan.sessions)
    assert [len(p.sessions) for p in parts] == [27, 27, 26]
    starts = [s.start_ns for s in plan.sessions]
    assert starts == sorted(starts)
    for i, p in enumerate(parts):
        assert [s.start_ns for s in p.sessions] == starts[i::3]
    again = build_plan(trace_table(rows), 16, PlanOptions(sessions_multiplier=2))
    assert [s.key for s in again.shard(1, 3).sessions] == [s.key for s in parts[1].sessions]


@pytest.mark.parametrize(
    "opts",
    [
        PlanOptions(speedup=0),
        PlanOptions(sessions_multiplier=0),
        PlanOptions(max_sessions=0),
        PlanOptions(duration_s=-1),
    ],
)
def test_bad_options_are_input_errors(opts):
    with pytest.raises(InputError):
        build_plan(trace_table(chain_rows(1, 1)), 16, opts)
