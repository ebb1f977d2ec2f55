"""AgentX's cache bust at the first user turn, in hash-block terms: the tools + system
prefix (``tool_tokens + system_tokens`` of a weka trace) stays shared between plays of a
session, every block from the first user turn on is the play's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProcess
from agent_replay.replay.agentx import cache_bust
from agent_replay.replay.config import RunConfig
from agent_replay.replay.plan import PlannedRequest
from agent_replay.replay.presets import AgentXSettings
from agent_replay.replay.run import load_and_validate, run
from agent_replay.traces.importers import import_paths
from agent_replay.traces.io import write_trace


def test_blocks_before_the_marker_stay_the_traces_own() -> None:
    q = PlannedRequest(
        session_id="s",
        clone=0,
        request_index=3,
        parent_index=2,
        parent=2,
        offset_ns=0,
        think_ns=0,
        input_tokens=256,
        output_tokens=4,
        hash_ids=[11, 12, 13, 14],
        api="completions",
        model=None,
        content=None,
        cached_tokens=None,
        shared_blocks=2,
    )
    a, b, a2 = cache_bust(q, 5), cache_bust(q, 6), cache_bust(q, 5)
    assert a.hash_ids[:2] == b.hash_ids[:2] == [11, 12]  # tools + system: shared
    assert not set(a.hash_ids[2:]) & set(b.hash_ids[2:])  # from the marker on: per play
    assert not set(a.hash_ids[2:]) & {11, 12, 13, 14}
    assert a.hash_ids == a2.hash_ids  # one id per trace id inside a play: sharing kept
    assert (a.clone, a.prompt_clone, a.blocks_clone, b.clone) == (5, 0, 0, 6)
    q.shared_blocks = 0  # no known prefix: the whole prompt is the play's own
    c = cache_bust(q, 5)
    assert c.hash_ids == [11, 12, 13, 14] and c.blocks_clone == 5


def weka_trace(tool: int, system: int) -> dict[str, Any]:
    def call(t: float, n_in: int, ids: list[int]) -> dict[str, Any]:
        return {
            "t": t,
            "type": "n",
            "model": "m",
            "in": n_in,
            "out": 4,
            "hash_ids": ids,
            "input_types": ["text"],
            "output_types": ["text"],
            "stop": "end_turn",
            "api_time": 0.05,
            "think_time": 0.01,
        }

    return {
        "id": "tx",
        "models": ["m"],
        "block_size": 64,
        "hash_id_scope": "local",
        "tool_tokens": tool,
        "system_tokens": system,
        "requests": [call(0.0, 256, [1, 2, 3, 4]), call(0.2, 320, [1, 2, 3, 4, 5])],
    }


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bust")
    (tmp / "tx.json").write_text(json.dumps(weka_trace(100, 40)))  # 140 tokens: 2 blocks of 64
    res = import_paths([tmp / "tx.json"], "weka")
    return write_trace(res.table, tmp / "tx.parquet", res.meta)


def test_the_import_records_the_prefix_and_the_plan_its_blocks(trace: Path) -> None:
    plan = load_and_validate(RunConfig(trace=str(trace), target="http://127.0.0.1:1"))
    assert [q.shared_blocks for q in plan.sessions[0].requests] == [2, 2]


@pytest.mark.slow
def test_a_recycled_play_hits_the_shared_prefix_only(trace: Path, tmp_path: Path) -> None:
    with SimProcess("fast") as sim:
        run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(tmp_path / "r"),
                salt=3,
                timing="agentx",
                concurrency=1,
                duration_s=2.0,
                scrape_interval_s=0,
                progress=False,
                agentx=AgentXSettings(start_min=0.0, start_max=0.0),
            ),
            progress=None,
        )
    rows = [
        r for r in pq.read_table(tmp_path / "r" / "requests").to_pylist() if r["status"] == "ok"
    ]
    first = sorted((r for r in rows if r["request_index"] == 0), key=lambda r: r["sent_ns"])
    assert len(first) >= 3
    # the first play starts cold; every later play finds the 2 shared blocks (128 tokens)
    # and nothing of the conversation of the plays before it
    assert [r["cached_tokens"] for r in first] == [0] + [128] * (len(first) - 1)
