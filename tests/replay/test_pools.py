"""The worker-pool interface: ``start_pool`` picks this process for one worker, local
processes for more and Ray with ``--ray``; every kind has the members ``replay.run`` uses.
Nothing here starts a worker process or a Ray cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent_replay.replay.config import RunConfig
from agent_replay.replay.distributed import RayPool
from agent_replay.replay.feed import ProgressFeed
from agent_replay.replay.plan import Plan
from agent_replay.replay.pools import InProcessPool, LocalProcessPool, WorkerPool, start_pool
from agent_replay.replay.run import load_and_validate
from tests.replay.helpers import chain_rows, write_rows

MEMBERS = (
    "size",
    "start_delay_ns",
    "feeds_snapshots",
    "meters_host",
    "lost",
    "run",
    "arrived",
    "describe",
    "close",
)


@pytest.fixture()
def config(tmp_path: Path) -> RunConfig:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(3, 2))
    return RunConfig(trace=str(trace), target="http://127.0.0.1:9", output=str(tmp_path / "r"))


@pytest.fixture()
def plan(config: RunConfig) -> Plan:
    return load_and_validate(config)


def _has_the_interface(pool: Any) -> None:
    for name in MEMBERS:
        assert hasattr(pool, name), name
    assert isinstance(pool.size, int) and isinstance(pool.start_delay_ns, int)
    assert isinstance(pool.feeds_snapshots, bool) and isinstance(pool.meters_host, bool)


def test_one_worker_runs_in_this_process(config: RunConfig, plan: Plan) -> None:
    pool: WorkerPool = start_pool(config, plan, 1)
    assert isinstance(pool, InProcessPool)
    _has_the_interface(pool)
    assert (pool.size, pool.feeds_snapshots, pool.meters_host) == (1, False, True)
    assert pool.lost == [] and pool.describe() == {} and pool.arrived() == []


def test_more_workers_run_in_local_processes(
    config: RunConfig, plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []

    def fake_start(
        cls: type[LocalProcessPool],
        cfg: RunConfig,
        n: int,
        whole: Plan | None = None,
        warn: Any = None,
    ) -> LocalProcessPool:
        started.append(n)
        assert whole is plan
        return cls(cfg, 0)  # no process: the pool's bookkeeping only

    monkeypatch.setattr(LocalProcessPool, "start", classmethod(fake_start))
    pool = start_pool(config, plan, 3)
    assert isinstance(pool, LocalProcessPool) and started == [3]
    _has_the_interface(pool)
    assert (pool.feeds_snapshots, pool.meters_host) == (False, True)
    assert pool.lost == [] and pool.describe() == {}
    # With no worker, run returns at once: what arrived, nothing.
    assert pool.run(replace(config, t0_ns=0), ProgressFeed(None)) == pool.arrived() == []
    pool.close()


def test_ray_is_picked_by_its_option(
    config: RunConfig, plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_start(
        cls: type[RayPool],
        cfg: RunConfig,
        p: Plan,
        address: str | None = None,
        actors_per_node: int = 1,
        ship: str = "auto",
        warn: Any = None,
    ) -> RayPool:
        seen.update(address=address, actors_per_node=actors_per_node, warn=warn)
        return cls(
            ray=None, slots=[], driver_node="n0", output=Path(cfg.output or "."), plan=p, warn=warn
        )

    monkeypatch.setattr(RayPool, "start", classmethod(fake_start))
    cfg = replace(config, ray="local", ray_actors_per_node=2)
    pool = start_pool(cfg, plan, 1, warn=print)
    assert isinstance(pool, RayPool) and seen == {
        "address": "local",
        "actors_per_node": 2,
        "warn": print,
    }
    _has_the_interface(pool)
    assert (pool.size, pool.feeds_snapshots, pool.meters_host) == (0, True, False)
    assert pool.describe() == {
        "ray": {"actors": [], "parts_received": 0, "bytes_received": 0, "lost": []}
    }
    assert pool.arrived() == []


def test_a_worker_without_a_report_is_counted_from_its_part_files(tmp_path: Path) -> None:
    from agent_replay.replay.pools import summary_from_parts
    from agent_replay.replay.results import ResultWriter
    from tests.replay.test_results_writer import _rec

    w = ResultWriter(tmp_path, 0, worker=1)
    recs = [_rec(i, 0) for i in range(5)]
    for r in recs[3:]:
        r.fail("cancelled", "cancelled by the run's stop")
    for r in recs:
        w.add(r)
    w.flush()
    w.add(_rec(9, 0))  # a second part
    w.close()
    other = ResultWriter(tmp_path, 0, worker=0)  # another shard's rows are not counted
    other.add(_rec(7, 0))
    other.close()
    (tmp_path / "requests" / ".part-001-00002.parquet.tmp").write_bytes(b"PAR1 cut")
    s = summary_from_parts(tmp_path, 1, planned=12)
    assert (s.shard, s.total, s.sent, s.done, s.ok) == (1, 12, 6, 6, 4)
    assert s.errors == {"cancelled": 2} and s.interrupted


def test_workers_whose_parent_died_record_the_run_as_interrupted(
    tmp_path: Path, config: RunConfig
) -> None:
    """Each worker, on its way out, merges its own summary and counts the others from their
    part files; the last one out writes totals from every summary."""
    import json

    from agent_replay.replay.pools import record_orphaned
    from agent_replay.replay.results import ResultWriter
    from agent_replay.replay.worker import WorkerSummary
    from tests.replay.test_results_writer import _rec

    out = Path(config.output or "")
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"status": "running", "writer": {"pid": 4242}}))
    plan = load_and_validate(config)  # 3 sessions of 2 requests: shards of 4 and 2
    w0, w1 = ResultWriter(out, 0, worker=0), ResultWriter(out, 0, worker=1)
    for i in range(3):
        w0.add(_rec(i, 0))
    cut = _rec(5, 0)
    cut.fail("cancelled", "cancelled by the run's stop")
    w1.add(_rec(4, 0))
    w1.add(cut)
    w0.close()
    w1.close()
    (out / "requests" / ".part-001-00009.parquet.tmp").write_bytes(b"PAR1 cut")
    s0 = WorkerSummary(shard=0, total=4, sent=3, done=3, ok=3, chunks=30, interrupted=True)
    assert record_orphaned(out, config, plan, 0, 2, s0)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted"
    assert meta["parent_died"]["counted_from_rows"] == [1]
    assert meta["error"] == (
        "the run's process (pid 4242) died while its workers ran; they "
        "stopped, wrote their rows and this record (workers 1 counted "
        "from their part files)"
    )
    s = meta["summary"]
    assert (s["total"], s["sent"], s["ok"], s["cancelled"], s["chunks"]) == (6, 5, 4, 1, 30)
    assert (out / "requests" / ".part-001-00009.parquet.tmp").exists()  # worker 1 may write
    s1 = WorkerSummary(
        shard=1, total=2, sent=2, done=2, ok=1, errors={"cancelled": 1}, chunks=7, interrupted=True
    )
    assert record_orphaned(out, config, plan, 1, 2, s1)
    meta = json.loads((out / "run.json").read_text())
    assert meta["parent_died"]["counted_from_rows"] == []
    assert meta["summary"]["chunks"] == 37 and meta["summary"]["ok"] == 4
    assert not (out / "requests" / ".part-001-00009.parquet.tmp").exists()
    assert meta["error"].endswith("wrote their rows and this record")


def test_a_run_that_recorded_its_end_is_left_alone(tmp_path: Path, config: RunConfig) -> None:
    import json

    from agent_replay.replay.pools import record_orphaned
    from agent_replay.replay.worker import WorkerSummary

    out = Path(config.output or "")
    out.mkdir()
    assert not record_orphaned(out, config, None, 0, 2, WorkerSummary(shard=0))  # no run.json
    (out / "run.json").write_text(json.dumps({"status": "ok"}))
    assert not record_orphaned(out, config, None, 0, 2, WorkerSummary(shard=0))
    assert json.loads((out / "run.json").read_text()) == {"status": "ok"}
