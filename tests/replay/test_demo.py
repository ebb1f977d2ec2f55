"""``agent-replay demo``: the bundled sample on the simulated engine, end to end."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.replay.demo import demo, sample_trace, synthetic_trace
from agent_replay.replay.plan import PlanOptions, build_plan
from agent_replay.traces.io import read_trace
from agent_replay.traces.validate import validate_or_raise


@pytest.mark.slow
def test_demo_runs_the_sample(tmp_path: Path) -> None:
    assert sample_trace() is not None
    out = tmp_path / "demo"
    s = demo(output=str(out), speedup=20, progress=None)
    assert s.total > 0 and s.ok == s.total and s.failed == 0 and s.mismatches == 0
    meta = read_run_record(out)
    assert meta.status == "ok" and meta.salt == 0
    assert pq.read_table(out / "requests").num_rows == s.total


def test_synthetic_fallback_trace_is_valid(tmp_path: Path) -> None:
    path = synthetic_trace(tmp_path / "demo.parquet")
    table, meta = read_trace(path)
    validate_or_raise(table, meta, path)
    plan = build_plan(table, meta.block_size, PlanOptions())
    assert len(plan.sessions) == 8 and plan.n_requests == 48
    # later turns extend the earlier prompt: the trace implies prefix-cache hits
    assert sum(q.implied_cached for s in plan.sessions for q in s.requests) > 0
