"""A run reads what it can send: with ``--duration``, only the sessions that start within
it; the target is probed before the plan is built."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from agent_replay.replay.config import RunConfig
from agent_replay.replay.plan import build_plan
from agent_replay.replay.source import read_replayed
from agent_replay.traces.failed import drop_failed
from agent_replay.traces.io import read_trace, write_trace
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.select import sessions_starting_before
from tests.faults import hostile
from tests.replay.helpers import chain_rows, trace_table

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


def _trace(tmp_path: Path) -> Path:
    # 40 sessions starting 0, 100, 200, ... ms; s0's first request and all of s1's fail,
    # so s1 has no start and s0 starts at its second request (300 ms)
    rows = chain_rows(40, 3)
    table = trace_table(rows)
    errors: list[str | None] = [None] * len(rows)
    errors[0] = errors[3] = errors[4] = errors[5] = "upstream: HTTP 500"
    table = table.append_column("error", pa.array(errors, pa.string()))
    return write_trace(table, tmp_path / "t.parquet", TraceMeta(block_size=16))


def test_sessions_starting_before_by_hand(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    # the first start (s2, 200 ms) is 0; s0 at 100 ms, s3 at 100 ms, s4 at 200 ms of replay
    assert sessions_starting_before(trace, 0.15, 1.0, skip_failed=True) == {"s0", "s2", "s3"}
    # x2: s5 (300 ms after s2) comes at 150 ms, s6 at 200 ms
    assert sessions_starting_before(trace, 0.15, 2.0, skip_failed=True) == {
        "s0",
        "s2",
        "s3",
        "s4",
        "s5",
    }
    # failed rows kept: s0 (0 ms) and s1 (100 ms) start first
    assert sessions_starting_before(trace, 0.15, 1.0, skip_failed=False) == {"s0", "s1"}
    assert sessions_starting_before(trace, 10.0, 1.0, skip_failed=True) is None


@pytest.mark.parametrize(
    ("opts", "read_all"),
    [
        ({"duration_s": 0.45}, False),
        ({"duration_s": 0.45, "speedup": 3.0}, False),
        ({"duration_s": 0.45, "max_sessions": 2}, False),
        ({"duration_s": 0.45, "include_failed": True}, False),
        ({"duration_s": 0.45, "rate": 2.0}, True),
        ({"duration_s": 0.45, "sessions_multiplier": 2}, True),
        ({"duration_s": 0.45, "timing": "agentx", "concurrency": 2}, True),
    ],
)
def test_a_duration_plan_from_the_rows_read_is_the_whole_trace_plan(
    tmp_path: Path, opts: dict[str, object], read_all: bool
) -> None:
    trace = _trace(tmp_path)
    whole, _ = read_trace(trace)
    cfg = RunConfig(trace=str(trace), target="http://127.0.0.1:9", **opts)  # type: ignore[arg-type]
    part, _, numbers = read_replayed(cfg)
    assert (part.num_rows == whole.num_rows) == read_all
    assert np.array_equal(
        part.column("request_index").to_numpy(), whole.column("request_index").to_numpy()[numbers]
    )

    def plan_of(t: pa.Table) -> list[tuple[str, int, int, list[int]]]:
        if not cfg.include_failed:
            t = drop_failed(t)[0]
        p = build_plan(t, 16, cfg.plan_options())
        return [
            (s.session_id, s.clone, s.start_ns, [q.offset_ns for q in s.requests])
            for s in p.sessions
        ]

    assert plan_of(part) == plan_of(whole)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.slow
def test_a_duration_run_of_a_many_row_trace_reads_and_probes_first(tmp_path: Path) -> None:
    """3M rows in 300K sessions, session k starting at k us: a 0.01 s run reads the 100K
    rows of the first 10K sessions. In a process capped at 1 GiB it fails on the target
    (exit 3); reading and validating the whole trace there failed on its memory budget."""
    trace = hostile.many_rows(tmp_path / "t.parquet", 3_000_000, 300_000)
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "run",
            str(trace),
            "--target",
            "http://127.0.0.1:9",
            "--duration",
            "0.01",
            "-o",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        preexec_fn=_capped,
    )
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr
    assert r.returncode == 3 and "127.0.0.1:9" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 120
