"""The shard actor's own logic, driven directly (no Ray needed): a shard that gets the trace
as bytes, writes to its staging folder, hands every part file over exactly once through
``poll``, and builds live statistics that agree with the rows it handed over."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.live import LiveStats
from agent_replay.engines.sim import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.distributed.actor import ShardActor
from agent_replay.replay.messages import ActorPoll
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

MS = 1_000_000


def _trace(path: Path) -> Path:
    n = 6
    schema = pa.schema(
        [
            ("session_id", pa.string()),
            ("request_index", pa.int32()),
            ("parent_index", pa.int32()),
            ("arrival_ns", pa.int64()),
            ("input_tokens", pa.int32()),
            ("output_tokens", pa.int32()),
        ]
    )
    t = pa.table(
        {
            "session_id": [f"s{i // 2}" for i in range(n)],
            "request_index": [i % 2 for i in range(n)],
            "parent_index": [i % 2 - 1 for i in range(n)],
            "arrival_ns": [i * 20 * MS for i in range(n)],
            "input_tokens": [32] * n,
            "output_tokens": [12] * n,
        },
        schema=schema,
    )
    return write_trace(t, path, TraceMeta(block_size=16))


def _poll_until_done(actor: ShardActor) -> list[ActorPoll]:
    msgs = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = actor.poll()
        msgs.append(msg)
        if msg.done:
            return msgs
        time.sleep(0.1)
    raise AssertionError("the shard did not finish")


@pytest.mark.slow
def test_shipping_shard_hands_over_every_part_once(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.parquet")
    with SimProcess("fast") as sim:
        config = RunConfig(
            trace=str(tmp_path / "not-on-this-node.parquet"),
            target=sim.url,
            output=str(tmp_path / "driver-out"),
            model="sim-fast",
            salt=0,
            progress=False,
        )
        actor = ShardActor()
        n = actor.prepare(config, 0, 1, True, [("t.parquet", trace.read_bytes())])
        assert n == 6
        now = time.monotonic_ns()
        actor.start(now + 50 * MS, time.time_ns() + 50 * MS, same_clock=False)
        msgs = _poll_until_done(actor)
    final = msgs[-1]
    assert final.error is None and final.summary is not None
    assert final.summary.ok == 6
    parts = [p for m in msgs for p in m.parts]
    names = [name for name, _ in parts]
    assert names and len(names) == len(set(names)) and all(x.startswith("part-000-") for x in names)
    rows = pa.concat_tables([pq.read_table(pa.BufferReader(data)) for _, data in parts])
    assert rows.num_rows == 6
    assert [sum(x) for x in rows.column("chunk_tokens").to_pylist()] == [12] * 6
    # nothing is written into the driver's folder by a shipping actor, and the staging
    # folder is gone after close
    assert not (tmp_path / "driver-out").exists()
    live = LiveStats.decode(final.snapshot)
    assert live.ok == 6 and live.output_tokens == 72
    assert live.hists["ttft"].count == 6
    assert live.hists["schedule_lag"].count == 6
    staging = actor._staging
    assert staging is not None and staging.exists()
    actor.close()
    assert not staging.exists()
    assert actor.poll().parts == []  # handed over once only
    # driving the class outside Ray never starts a Ray instance
    assert actor.info()["node_id"] == "local"
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
