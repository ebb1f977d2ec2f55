"""Flattened agents in weka traces (calls recorded in another agent's stream, told apart by
their hash ids as AIPerf 0.13.0's weka loader tells them), on hand-made traces whose
chains are worked out in the comments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_replay.replay.agentx import capped_times, stream_rules
from agent_replay.replay.plan import PlanOptions, build_plan
from agent_replay.traces.importers import import_paths
from agent_replay.traces.importers.weka_chains import ChainCall, detect

S = 1_000_000_000


def call(
    t: float, ids: list[int], *, api: float = 2.0, out: int = 100, model: str = "m"
) -> dict[str, Any]:
    return {
        "t": t,
        "type": "n",
        "model": model,
        "in": 64 * len(ids) + 10,
        "out": out,
        "hash_ids": ids,
        "input_types": ["text"],
        "output_types": ["text"],
        "stop": "end_turn",
        "api_time": api,
    }


def flattened_trace() -> dict[str, Any]:
    """[0] a title call (hash ids shared with nobody, 10 output tokens): set aside, then back
    on the main chain. [1] founds the main chain. [2] shares 2 of [1]'s 3 blocks: a fork (B).
    [3] extends B. [4] extends [1], the longer state B forked from: B is another agent
    (fa:000). [5] shares one block with [4]'s tail: a fork (C); [6] extends C. [4] is still
    the main chain's last call and C starts after it ended: C is the main agent continuing
    after a context edit (a seam), not an agent. AIPerf 0.13.0's ``_split_off_preamble`` and
    ``detect_agent_chains`` give the same chains on this trace and on each variant below."""
    return {
        "id": "fl",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            call(0.0, [100], api=0.5, out=10),
            call(1.0, [1, 2, 3]),  # ends 3
            call(10.0, [1, 2, 7]),  # ends 12
            call(20.0, [1, 2, 7, 8]),  # ends 22: B's end
            call(30.0, [1, 2, 3, 4]),  # ends 32
            call(40.0, [1, 5], api=1.0),
            call(50.0, [1, 5, 6], api=1.0),
        ],
    }


def chain_calls(trace: dict[str, Any]) -> list[ChainCall]:
    return [
        ChainCall(
            i, r["t"], r["t"] + r["api_time"], r["model"], tuple(r["hash_ids"]), r["in"], r["out"]
        )
        for i, r in enumerate(trace["requests"])
    ]


def test_detect_splits_the_fork_keeps_the_seam_and_the_title_call() -> None:
    assert detect(chain_calls(flattened_trace())) == ([0, 1, 4, 5, 6], [[2, 3]])


def test_a_fork_on_another_model_or_before_the_tail_ended_is_an_agent() -> None:
    tr = flattened_trace()
    tr["requests"][5]["model"] = tr["requests"][6]["model"] = "small"
    assert detect(chain_calls(tr)) == ([0, 1, 4], [[2, 3], [5, 6]])
    tr = flattened_trace()
    tr["requests"][4]["api_time"] = 10.5  # [4] ends at 40.5, after C's first call
    assert detect(chain_calls(tr)) == ([0, 1, 4], [[2, 3], [5, 6]])


def test_without_a_shared_prefix_nothing_splits() -> None:
    tr = flattened_trace()
    tr["requests"][2]["hash_ids"] = [1, 2, 3, 9]  # extends [1]
    tr["requests"][3]["hash_ids"] = [1, 2, 3, 9, 8]
    tr["requests"][4]["hash_ids"] = [1, 2, 3, 9, 8, 4]
    assert detect(chain_calls(tr)) == ([0, 1, 2, 3, 4, 5, 6], [])


def test_imported_as_a_subagent_spawned_and_joined_by_the_main_stream(tmp_path: Path) -> None:
    src = tmp_path / "fl.json"
    src.write_text(json.dumps(flattened_trace()))
    res = import_paths([src])
    rows = sorted(res.table.to_pylist(), key=lambda r: r["request_index"])
    assert [r["agent_id"] for r in rows] == [
        "main",
        "main",
        "fa:000",
        "fa:000",
        "main",
        "main",
        "main",
    ]
    assert [r["depends_on"] for r in rows] == [[], [0], [1], [2], [1, 3], [4], [5]]
    # end-to-start from the latest dependency: [2] 10 - 3, [4] 30 - 22 (B's end)
    assert [r["think_ns"] for r in rows][2:5] == [7 * S, 8 * S, 8 * S]
    assert res.meta.extra["weka"][0]["flattened"] == {"fa:000": 2}
    assert any("1 flattened agents" in n and "fl fa:000 (2 calls)" in n for n in res.notes)
    # AgentX replay: [2] goes the moment [1] ends (its branch starts at its own t); [4]
    # joins: B outlives [1], so [4] goes when B ends, else 30 - (1 + 2) s after [1]
    plan = build_plan(res.table, 64, PlanOptions())
    reqs = plan.sessions[0].requests
    rules = stream_rules(reqs, *capped_times(reqs, None))
    assert (rules[2].kind, rules[2].delay_ns) == ("child", 0)
    assert (rules[4].kind, rules[4].delay_ns) == ("join", 27 * S)


def test_inside_a_subagent_a_flattened_agent_shares_its_branch(tmp_path: Path) -> None:
    """Subagent x (spawned at 5 off main [0], 30 s long, joined by main [2] at 40) holds
    the same calls as the top level above, relative to its spawn: its fork becomes
    x:fa:000, spawned off [0] and joined by [2] like x."""
    inner = flattened_trace()["requests"]
    tr = {
        "id": "nx",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "requests": [
            call(0.0, [900, 901]),
            {
                "t": 5.0,
                "type": "subagent",
                "agent_id": "x",
                "duration_ms": 55000,
                "requests": inner,
            },
            call(70.0, [900, 901, 902]),
        ],
    }
    src = tmp_path / "nx.json"
    src.write_text(json.dumps(tr))
    res = import_paths([src])
    rows = sorted(res.table.to_pylist(), key=lambda r: r["request_index"])
    agents = [r["agent_id"] for r in rows]
    assert agents == ["main", "x", "x", "x:fa:000", "x:fa:000", "x", "x", "x", "main"]
    assert rows[1]["depends_on"] == [0] and rows[3]["depends_on"] == [0]
    assert rows[8]["depends_on"] == [0, 4, 7]
    assert res.meta.extra["weka"][0]["subagents"] == 1


def test_aiperf_interval_waits_not_implied_are_counted(tmp_path: Path) -> None:
    """A main call [3] at 15 inside B's life ([2] 10-12, [4] 20-22): AIPerf also holds [3]
    until [2] ended and [4] until [3] ended (the latest call of the other stream that ended
    before it started); neither is a dependency here, nor implied by one. [5] waits for [4]
    there and here (B's join)."""
    tr = flattened_trace()
    tr["requests"].insert(3, call(15.0, [1, 2, 3, 5]))
    assert detect(chain_calls(tr)) == ([0, 1, 3, 5, 6, 7], [[2, 4]])
    src = tmp_path / "bar.json"
    src.write_text(json.dumps(tr))
    res = import_paths([src])
    rows = sorted(res.table.to_pylist(), key=lambda r: r["request_index"])
    assert [r["depends_on"] for r in rows][2:6] == [[1], [1], [2], [3, 4]]
    assert [n for n in res.notes if "interval barriers" in n] == [
        "2 calls of streams with flattened agents also wait for another of those streams' calls "
        "that ended before they started in the recording (AIPerf's interval barriers): "
        "--timing agentx applies them, other timings do not"
    ]
    # --timing agentx holds them back: [3] for [2], [4] for [3] (and [5] for [4], its join)
    reqs = build_plan(res.table, 64, PlanOptions()).sessions[0].requests
    barrier = [r.barrier for r in stream_rules(reqs, *capped_times(reqs, None))]
    assert barrier[2:6] == [(1,), (2,), (3,), (4,)]
    src.write_text(json.dumps(flattened_trace()))
    assert not [n for n in import_paths([src]).notes if "interval barriers" in n]
