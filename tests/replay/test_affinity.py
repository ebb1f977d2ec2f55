"""--cpus: CPU lists, one CPU per physical core, and workers pinned in a real run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.engines.sim import SimProcess
from agent_replay.errors import InputError
from agent_replay.replay.affinity import (
    allowed_cpus,
    helper_thread,
    kept_affinity,
    one_per_core,
    parse_cpu_list,
    pin_loop_thread,
    worker_cpus,
)
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import run
from tests.replay.helpers import MS, chain_rows, write_rows

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0,2,4-6") == [0, 2, 4, 5, 6]
    assert parse_cpu_list("7,3") == [7, 3]  # the order is the workers'
    for bad, msg in (
        ("1,,2", "empty item"),
        ("a", "not a CPU number"),
        ("5-3", "bad range"),
        ("1,1", "listed twice"),
        ("-1", "not a CPU number"),
    ):
        with pytest.raises(InputError, match=msg):
            parse_cpu_list(bad)


def _fake_sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, lst in siblings.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(lst + "\n")
    return root


def test_one_per_core_drops_hyperthread_siblings(tmp_path: Path) -> None:
    # 4 cores x 2 threads, numbered as Linux on x86 does: cpu k and k+4 share a core
    sysfs = _fake_sysfs(tmp_path, {k: f"{k % 4},{k % 4 + 4}" for k in range(8)})
    assert one_per_core(range(8), sysfs) == [0, 1, 2, 3]
    assert one_per_core([1, 5, 6], sysfs) == [1, 6]
    # numbered in pairs (cpu 2k and 2k+1 share a core)
    sysfs2 = _fake_sysfs(tmp_path / "b", {k: f"{k - k % 2}-{k - k % 2 + 1}" for k in range(8)})
    assert one_per_core(range(8), sysfs2) == [0, 2, 4, 6]
    # no topology files: every CPU is its own core
    assert one_per_core([0, 1, 2], tmp_path / "none") == [0, 1, 2]


@linux
def test_worker_cpus_checks_what_is_allowed(tmp_path: Path) -> None:
    allowed = allowed_cpus()
    assert worker_cpus(str(allowed[0]), 1) == [allowed[0]]
    with pytest.raises(InputError, match="lists 1 CPUs for 2 workers"):
        worker_cpus(str(allowed[0]), 2)
    with pytest.raises(InputError, match=f"CPU {max(allowed) + 1} is not available"):
        worker_cpus(str(max(allowed) + 1), 1)
    sysfs = _fake_sysfs(tmp_path, {c: str(c) for c in allowed})
    assert worker_cpus("auto", len(allowed), sysfs) == allowed
    with pytest.raises(InputError, match="physical cores available"):
        worker_cpus("auto", len(allowed) + 1, sysfs)


@linux
def test_kept_affinity_restores_the_callers_cpus() -> None:
    before = os.sched_getaffinity(0)
    with kept_affinity():
        os.sched_setaffinity(0, {min(before)})
        assert os.sched_getaffinity(0) == {min(before)}
    assert os.sched_getaffinity(0) == before


def test_cpus_with_ray_is_refused() -> None:
    with pytest.raises(InputError, match="does not apply with --ray"):
        RunConfig(trace="t.parquet", target="http://127.0.0.1:1", cpus="0", ray="local").check()
    with pytest.raises(InputError, match="not a CPU number"):
        RunConfig(trace="t.parquet", target="http://127.0.0.1:1", cpus="zero").check()


@linux
@pytest.mark.parametrize("workers", [1, 2])
def test_workers_run_on_their_cpus(tmp_path: Path, workers: int) -> None:
    allowed = allowed_cpus()
    if len(allowed) < workers:
        pytest.skip(f"needs {workers} CPUs")
    cpus = allowed[-workers:][::-1]  # listed backwards: worker 0 gets the last CPU
    trace = write_rows(tmp_path / "t.parquet", chain_rows(8, 2, gap_ns=10 * MS, output_tokens=4))
    out = tmp_path / "res"
    before = os.sched_getaffinity(0)
    with SimProcess("fast", cpus=allowed[:1]) as sim:
        sim_mask = os.sched_getaffinity(sim.proc.pid)
        s = run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(out),
                workers=workers,
                cpus=",".join(map(str, cpus)),
                scrape_interval_s=0,
            ),
            progress=None,
        )
    assert sim_mask == {allowed[0]}
    assert s.ok == 16 and s.failed == 0
    assert [w.cpus for w in sorted(s.workers, key=lambda w: w.shard)] == [[c] for c in cpus]
    assert all(w.fd_table > 64 for w in s.workers)  # each grew its fd table before the run
    meta = read_run_record(out)
    assert meta.extra["worker_cpus"] == [[c] for c in cpus]
    assert meta.option("cpus") == ",".join(map(str, cpus))
    assert meta.option("worker_cpus") == cpus
    assert os.sched_getaffinity(0) == before  # the caller's own CPUs are given back


@linux
def test_cli_refuses_more_workers_than_listed_cpus(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(4, 1, gap_ns=MS, output_tokens=2))
    with SimProcess("fast") as sim:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "--workers",
                "2",
                "--cpus",
                str(allowed_cpus()[0]),
                "-o",
                str(tmp_path / "r"),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parents[2],
        )
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].endswith("--cpus lists 1 CPUs for 2 workers")
    assert not (tmp_path / "r" / "requests").exists()


@linux
def test_helper_threads_leave_the_loop_threads_cpu() -> None:
    from concurrent.futures import ThreadPoolExecutor

    allowed = allowed_cpus()
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs")
    with kept_affinity():
        pin_loop_thread([allowed[-1]], 0)
        assert os.sched_getaffinity(0) == {allowed[-1]}
        # a thread started now inherits the loop's CPU, until it calls helper_thread
        with ThreadPoolExecutor(1, initializer=helper_thread) as pool:
            assert pool.submit(os.sched_getaffinity, 0).result() == set(allowed[:-1])
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(os.sched_getaffinity, 0).result() == {allowed[-1]}
    assert os.sched_getaffinity(0) == set(allowed)
    with ThreadPoolExecutor(1, initializer=helper_thread) as pool:  # not pinned: a no-op
        assert pool.submit(os.sched_getaffinity, 0).result() == set(allowed)
