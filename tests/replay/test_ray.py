"""Ray backend on a real two-node Ray cluster on loopback (ray.cluster_utils.Cluster: a
head and a worker node, one CPU each), against the simulated engine in its own process.

* A local run and a Ray run of the same trace agree on counts, and each measures what the
  engine wrote (its ground truth) within 5%: P50/P90 TPOT, ITL P50 and mean.
* The actor on the other node ships its part files back; both shards' rows are there.
* Killing an actor mid-run: the run finishes, and the sessions it left are listed.
* Killing the driver mid-run: the actor on its node writes its rows and run.json, and no
  actor of the run is left on the cluster.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Ray binds and advertises the loopback address only (no other interface is used).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from agent_replay.engines.sim import SimProcess, SimProfile  # noqa: E402
from agent_replay.replay.config import RunConfig  # noqa: E402
from agent_replay.replay.plan import PlanOptions, build_plan  # noqa: E402
from agent_replay.replay.run import run  # noqa: E402
from agent_replay.traces.io import read_trace, write_trace  # noqa: E402
from agent_replay.traces.schema import TraceMeta  # noqa: E402

# timing: the Ray-vs-local parity test is a real-clock accuracy test and shares the Ray
# cluster fixture with the others: the whole module goes with it (one cluster start).
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timing]
MS = 1_000_000
STEP_NS = 4 * MS


def _trace(path: Path, sessions: int, per_session: int, output_tokens: int, think_ms: int) -> str:
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
        )
    }
    for s in range(sessions):
        for r in range(per_session):
            cols["session_id"].append(f"s{s}")
            cols["request_index"].append(r)
            cols["parent_index"].append(r - 1)
            cols["arrival_ns"].append(s * 37 * MS + r * (think_ms + 200) * MS)
            cols["think_ns"].append(think_ms * MS if r else None)
            cols["input_tokens"].append(64 + 16 * r)
            cols["output_tokens"].append(output_tokens)
    schema = pa.schema(
        [
            ("session_id", pa.string()),
            ("request_index", pa.int32()),
            ("parent_index", pa.int32()),
            ("arrival_ns", pa.int64()),
            ("think_ns", pa.int64()),
            ("input_tokens", pa.int32()),
            ("output_tokens", pa.int32()),
        ]
    )
    write_trace(pa.table(cols, schema=schema), path, TraceMeta(block_size=16))
    return str(path)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "object_store_memory": 80 * 1024 * 1024,
        },
    )
    c.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * 1024 * 1024)
    ray.init(address=c.address, log_to_driver=False, namespace="agent-replay")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Decode steps of 4 ms whatever the batch, fast prefill, no early end of sequence."""
    base = SimProfile.load("fast").to_dict()
    base.update(
        name="ray-test",
        decode_base_ns=STEP_NS,
        decode_per_seq_ns=0,
        decode_per_ctx_token_ns=0.0,
        eos_prob=0.0,
        prefill_tokens_per_s=1e6,
    )
    path = tmp_path_factory.mktemp("sim") / "ray-test.json"
    path.write_text(json.dumps(base))
    return str(path)


@pytest.fixture(scope="module")
def sim(profile: str) -> Iterator[SimProcess]:
    with SimProcess(profile) as s:
        yield s


def _rows(out: Path) -> pa.Table:
    return pq.read_table(out / "requests")


def _keys(t: pa.Table) -> list[tuple[str, int]]:
    return sorted(
        zip(t.column("session_id").to_pylist(), t.column("request_index").to_pylist(), strict=True)
    )


def _tpot_itl(chunk_ns: list[int], chunk_tokens: list[int]) -> tuple[float | None, np.ndarray]:
    """A request's TPOT and its per-token ITL samples (a gap counts once per token it
    brought, at gap / tokens), from its chunks' times and token counts."""
    c, k = np.asarray(chunk_ns), np.asarray(chunk_tokens)
    if len(c) < 2:
        return None, np.empty(0)
    return (c[-1] - c[0]) / (k.sum() - k[0]), np.repeat(np.diff(c) / k[1:], k[1:])


def _against_truth(rows: pa.Table, truth: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What the client measured over what the engine wrote, on the same requests: each
    request's TPOT (median and P90 of the ratio) and the run's per-token ITL (the ratio of
    medians and of means)."""
    ratios, ours, engine = [], [], []
    for rid, c, k in zip(
        rows.column("request_id").to_pylist(),
        rows.column("chunk_ns").to_pylist(),
        rows.column("chunk_tokens").to_pylist(),
        strict=True,
    ):
        t = truth[rid]
        tpot, itl = _tpot_itl(c, k)
        true_tpot, true_itl = _tpot_itl(t["chunk_ns"], t["chunk_tokens"])
        assert tpot is not None and true_tpot is not None
        ratios.append(tpot / true_tpot)
        ours.append(itl)
        engine.append(true_itl)
    a, b = np.concatenate(ours), np.concatenate(engine)
    return {
        "tpot_p50": float(np.percentile(ratios, 50)),
        "tpot_p90": float(np.percentile(ratios, 90)),
        "itl_p50": float(np.percentile(a, 50) / np.percentile(b, 50)),
        "itl_mean": float(a.mean() / b.mean()),
    }


def test_ray_run_matches_a_local_run(cluster: Any, profile: str, tmp_path: Path) -> None:
    trace = _trace(
        tmp_path / "t.parquet", sessions=8, per_session=4, output_tokens=100, think_ms=60
    )
    gt = tmp_path / "truth.parquet"
    with SimProcess(profile, ground_truth=gt) as sim:
        common = dict(trace=trace, target=sim.url, progress=False, scrape_interval_s=0.0)
        local = run(RunConfig(output=str(tmp_path / "local"), salt=1, **common), progress=None)  # type: ignore[arg-type]
        dist = run(
            RunConfig(output=str(tmp_path / "ray"), salt=2, ray="auto", **common), progress=None
        )  # type: ignore[arg-type]

    assert local.total == dist.total == 32
    assert local.ok == dist.ok == 32 and not dist.errors
    assert local.output_tokens == dist.output_tokens == 32 * 100
    assert local.chunks == dist.chunks
    lt, rt = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert _keys(lt) == _keys(rt)
    meta = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert meta["status"] == "ok"
    actors = meta["ray"]["actors"]
    assert len(actors) == 2 and len({a["node_id"] for a in actors}) == 2
    assert sorted(set(rt.column("worker").to_pylist())) == [0, 1]
    # the actor on the worker node sent its part files back over Ray
    assert any(a["ships_parts"] for a in actors) and meta["ray"]["parts_received"] >= 1
    assert meta["ray"]["lost"] == []
    # Each run against what the engine wrote for its own requests (its ground truth), not
    # one run against the other: on a loaded 2-core machine the engine, on the same cores,
    # misses some of its 4 ms steps and catches up, differently in each run (ITL P50 4.0
    # against 3.0 ms in one pair of runs), and both clients must see exactly that.
    truth = {str(r["request_id"]): r for r in pq.read_table(gt).to_pylist()}
    assert len(truth) == 64 and set(truth) >= set(lt.column("request_id").to_pylist()) | set(
        rt.column("request_id").to_pylist()
    )
    report = {"local": _against_truth(lt, truth), "ray": _against_truth(rt, truth)}
    print(json.dumps(report))
    # With one core held busy both stay within 1.2%. With both cores busy the actor's loop
    # falls a step behind at times and reads two steps' chunks as one (the kernel merges
    # them in the socket's queue, under one receive time): Ray's ITL 5-7% low, which its
    # run's self-check reports as a loop stall.
    for name, r in report.items():
        for key, ratio in r.items():
            assert abs(ratio - 1) <= 0.05, (name, key, report)


def test_killed_actor_reports_its_sessions(cluster: Any, sim: SimProcess, tmp_path: Path) -> None:
    trace = _trace(
        tmp_path / "long.parquet", sessions=6, per_session=12, output_tokens=30, think_ms=150
    )
    out = tmp_path / "killed"
    cfg = RunConfig(
        trace=trace,
        target=sim.url,
        output=str(out),
        progress=False,
        scrape_interval_s=0.0,
        salt=3,
        ray="auto",
        run_id="killtest",
    )
    result: dict[str, Any] = {}
    lines: list[str] = []
    th = threading.Thread(target=lambda: result.setdefault("s", run(cfg, progress=lines.append)))
    th.start()
    deadline = time.monotonic() + 60
    actor = None
    while time.monotonic() < deadline and actor is None:
        try:
            actor = ray.get_actor("agent-replay-killtest-0", namespace="agent-replay")
        except ValueError:
            time.sleep(0.2)
    assert actor is not None
    while time.monotonic() < deadline and not (out / "run.json").exists():
        time.sleep(0.1)
    time.sleep(2.5)  # the run is under way: some requests of shard 0 are done
    ray.kill(actor, no_restart=True)
    th.join(120)
    assert not th.is_alive()
    s = result["s"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial"
    lost = meta["ray"]["lost"]
    assert [x["shard"] for x in lost] == [0]
    table, tm = read_trace(trace)
    plan = build_plan(table, tm.block_size, PlanOptions())
    shard0 = {x.key: len(x.requests) for x in plan.shard(0, 2).sessions}
    rows = _rows(out)
    got: dict[str, int] = {}
    for sid, w in zip(
        rows.column("session_id").to_pylist(), rows.column("worker").to_pylist(), strict=True
    ):
        if w == 0:
            got[sid] = got.get(sid, 0) + 1
    expected = [
        {"session": k, "planned": n, "recorded": got.get(k, 0)}
        for k, n in shard0.items()
        if got.get(k, 0) < n
    ]
    by_key = lambda x: x["session"]  # noqa: E731
    assert expected and sorted(lost[0]["sessions"], key=by_key) == sorted(expected, key=by_key)
    # shard 1 finished everything
    assert (
        rows.filter(pa.compute.equal(rows.column("worker"), 1)).num_rows
        == plan.shard(1, 2).n_requests
    )
    missing = sum(e["planned"] - e["recorded"] for e in expected)
    assert s.errors.get("actor_lost") == missing
    assert s.total == plan.n_requests
    assert any("shard 0" in w and "died" in w for w in s.warnings)
    # partial: exit code 1 and one last line with the count and where the results are
    assert s.partial and s.exit_code == 1
    assert s.lost_sessions == len(expected) and s.lost_requests == missing
    assert lines[-1] == s.partial_line()
    assert f"{len(expected)} sessions ({missing} requests)" in lines[-1] and str(out) in lines[-1]


def test_ray_run_feeds_the_dashboard(
    cluster: Any, sim: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ray pool's merged live statistics reach the dashboard (complete snapshots: the
    dashboard is not asked to read the part files)."""
    import agent_replay.analysis.dashboard
    from agent_replay.analysis.live import LiveStats

    updates: list[bytes] = []

    class Recorder:
        def __init__(
            self,
            total: int,
            title: str = "",
            server_gauges_url: str | None = None,
            results_dir: str | None = None,
            shared_gauges: object = None,
            gpu_gauges: object = None,
            planned_ns: object = None,
        ) -> None:
            self.total = total
            assert results_dir is None

        def start(self) -> None:
            pass

        def update(self, encoded: bytes) -> bool:
            updates.append(encoded)
            return True

        def stop(self) -> None:
            pass

    monkeypatch.setattr(agent_replay.analysis.dashboard, "DashboardProcess", Recorder)
    trace = _trace(tmp_path / "t.parquet", sessions=4, per_session=3, output_tokens=20, think_ms=50)
    s = run(
        RunConfig(
            trace=trace,
            target=sim.url,
            output=str(tmp_path / "dash"),
            progress=True,
            scrape_interval_s=0.0,
            salt=5,
            ray="auto",
        ),
        progress=lambda line: None,
    )
    assert s.ok == 12 and not s.partial and s.exit_code == 0
    assert updates, "the dashboard got no snapshot from the Ray pool"
    last = LiveStats.decode(updates[-1])
    assert last.ok == 12  # both shards' snapshots, merged


def test_killed_driver_leaves_no_actor_and_an_interrupted_run(cluster: Any, tmp_path: Path) -> None:
    """``--ray=ADDRESS``, the driver (its own process) killed outright mid-run: the actor on
    its node (detached) stops, writes its rows and run.json ``interrupted`` and ends; the
    one on the other node, which hands its parts over, is Ray's to end with its owner.
    Nothing of the run is left on the cluster, and run.json's totals are the rows on disk."""
    import signal

    from tests.faults import runprobe as rp
    from tests.replay.helpers import MS as HMS
    from tests.replay.helpers import chain_rows, write_rows

    trace = write_rows(
        tmp_path / "t.parquet",
        chain_rows(30, 12, gap_ns=60 * HMS, think_ns=250 * HMS, output_tokens=6),
    )
    ended: list[float] = []

    def kill_and_wait(run: rp.Run) -> None:
        """The kill, then until no actor is left (they are not the driver's children: the
        probe would not wait for them)."""
        rp.to_parent(signal.SIGKILL)(run)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ray.util.list_named_actors(all_namespaces=True):
            time.sleep(0.1)
        assert run.fault_at is not None
        ended.append(time.monotonic() - run.fault_at)

    o = rp.probe(
        "kill -9 driver",
        trace,
        tmp_path / "w",
        rp.after_first_part(kill_and_wait),
        extra=(f"--ray={cluster.address}",),
        timeout_s=120,
    )
    print(o.row(), ended)
    assert ray.util.list_named_actors(all_namespaces=True) == []
    assert o.rc == -signal.SIGKILL and not o.hang and "Traceback" not in o.stderr
    assert o.tmp_left == 0 and not o.reserve_left and o.orphans == 0
    assert o.status == "interrupted", o.stderr
    assert o.reported_rows() == o.rows > 0
    meta = json.loads((tmp_path / "w" / "res" / "run.json").read_text())
    assert meta["summary"]["total"] == 360
    block = meta["parent_died"]
    # the actor that wrote in place recorded its own summary; the other shard is counted
    # from the parts it handed over before its owner died
    assert len(block["shards"]) == 1 and len(block["counted_from_rows"]) == 1
