"""Large valid traces made with numpy alone (seconds for a million rows), for the memory
and time bounds of ``traces inspect`` and of a run's plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta


def subagent_session(n: int) -> pa.Table:
    """One session of ``n`` subagents: main turns 0..n (request indices 0..n) and subagent
    k (request n+1+k, agent ``a{k}``) spawned by main turn k and joined by main turn k+1
    (which depends on main turn k and on it)."""
    main = np.arange(n + 1, dtype=np.int32)
    sub = np.arange(n, dtype=np.int32)
    # depends_on: main turn 0 []; main turn k+1 [k, n+1+k]; subagent k [k]
    main_deps = [np.zeros(0, np.int32)] + [np.array([k, n + 1 + k], np.int32) for k in range(n)]
    lengths = np.concatenate(([0], np.full(n, 2), np.ones(n))).astype(np.int32)
    values = np.concatenate([np.concatenate(main_deps), sub])
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    req = np.concatenate([main, n + 1 + sub])
    arrival = np.concatenate(
        [main.astype(np.int64) * 2_000_000, sub.astype(np.int64) * 2_000_000 + 1_000_000]
    )
    agents = pa.DictionaryArray.from_arrays(
        pa.array(np.concatenate([np.zeros(n + 1, np.int32), sub + 1])),
        pa.array(["main"] + [f"a{k}" for k in range(n)]),
    )
    rows = 2 * n + 1
    return pa.table(
        {
            "session_id": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(rows, np.int32)), pa.array(["tree"])
            ),
            "request_index": pa.array(req, pa.int32()),
            "parent_index": pa.array(np.concatenate([main - 1, sub]), pa.int32()),
            "arrival_ns": pa.array(arrival),
            "input_tokens": pa.array(np.full(rows, 64), pa.int32()),
            "output_tokens": pa.array(np.full(rows, 4), pa.int32()),
            "agent_id": agents,
            "depends_on": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32())),
        }
    )


def write_subagent_session(path: Path, n: int) -> Path:
    return write_trace(
        subagent_session(n), path, TraceMeta(block_size=16, schema_version=2), force=True
    )
