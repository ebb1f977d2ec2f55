"""``agent-replay run`` under faults: every request the engine finished has a row, or the
run says how many do not (exit 5); a signal to the parent, a worker or the group, or the
parent's death, ends it without a hang, an orphan, a traceback or a half-written part
taken as whole, with run.json's totals equal to the rows on disk.

Each test replays a small trace on the simulated engine with its ground truth on
(tests/faults/runprobe.py) and compares the rows with the requests the engine finished.
A full disk is a real tmpfs filled by a file (root only, as in CI)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.faults import runprobe as rp
from tests.replay.helpers import MS, chain_rows, write_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 360 requests over about 5 s: the first part file lands about 1 s in
    return write_rows(
        tmp_path_factory.mktemp("trace") / "t.parquet",
        chain_rows(30, 12, gap_ns=60 * MS, think_ns=250 * MS, output_tokens=6),
    )


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("a tmpfs (a disk that fills up) needs root")


def _clean(o: rp.Outcome) -> None:
    """What every outcome must show: an end, no traceback, no process left, no .tmp, no
    space reserve left in the results folder."""
    assert not o.hang, o.stderr
    assert "Traceback" not in o.stderr, o.stderr
    assert o.orphans == 0
    assert o.tmp_left == 0
    assert not o.reserve_left


def _rows_match(o: rp.Outcome) -> None:
    """run.json's totals are the rows on disk; no request the engine finished lacks one."""
    assert o.missing == 0, (o.finished, o.rows)
    assert o.reported_rows() == o.rows, (o.summary, o.rows)


@pytest.mark.timing  # the disk is full for 1.2 s: a loaded host can write no part in it
def test_disk_full_mid_run_then_freed_loses_no_row(trace: Path, tmp_path: Path) -> None:
    _root()
    o = rp.probe(
        "freed", trace, tmp_path, rp.after_first_part(rp.disk_full(1.2)), workers=2, tmpfs="4m"
    )
    print(o.row())
    _clean(o)
    assert o.rc == 0 and o.status == "ok", o.stdout + o.stderr
    assert o.finished == 360 and o.rows == 360
    _rows_match(o)
    assert "WARNING: cannot write part files (No space left on device)" in o.stderr
    assert "writing again" in o.stderr


def test_disk_full_at_the_end_then_freed_during_the_last_retries(
    trace: Path, tmp_path: Path
) -> None:
    """Full once 250 of the 360 rows are on disk, freed 3.5 s later, about when the replay
    ends: the worker's last writes succeed within --write-retry."""
    _root()
    o = rp.probe(
        "freed at the end",
        trace,
        tmp_path,
        rp.after_rows(250, rp.disk_full(3.5)),
        tmpfs="4m",
        extra=("--write-retry", "30"),
    )
    print(o.row())
    _clean(o)
    assert o.rc == 0 and o.status == "ok", o.stdout + o.stderr
    assert o.finished == 360 and o.rows == 360 and o.unwritten == 0
    _rows_match(o)


def test_disk_full_to_the_end_counts_the_rows_lost(trace: Path, tmp_path: Path) -> None:
    _root()
    o = rp.probe(
        "never freed",
        trace,
        tmp_path,
        rp.after_first_part(rp.disk_full(None)),
        tmpfs="4m",
        extra=("--write-retry", "1"),
    )
    print(o.row())
    _clean(o)
    assert o.rc == 5 and o.status == "incomplete", o.stdout + o.stderr
    lost = o.finished - o.rows
    assert lost > 0 and o.unwritten == lost
    assert o.reported_rows() == o.rows
    assert f"{lost} WITHOUT A ROW" in o.last_line
    assert f"{lost} recorded requests have no row" in o.stderr
    assert "No space left on device" in o.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_before_the_start_sends_nothing(
    trace: Path, tmp_path: Path, workers: int
) -> None:
    _root()
    o = rp.probe(
        "full before",
        trace,
        tmp_path,
        None,
        workers=workers,
        tmpfs="4m",
        fill_first=True,
        timeout_s=30,
    )
    _clean(o)
    assert o.rc == 5, o.stderr
    assert o.received == 0 and o.rows == 0
    lines = [x for x in o.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("agent-replay: error: ") and "No space left on device" in lines[-1]


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(rp.to_parent(signal.SIGINT), id="SIGINT-parent"),
        pytest.param(rp.to_group(signal.SIGTERM), id="SIGTERM-group"),
        pytest.param(rp.to_worker(signal.SIGTERM), id="SIGTERM-worker"),
    ],
)
def test_a_stop_keeps_every_finished_row(trace: Path, tmp_path: Path, fault: rp.Fault) -> None:
    o = rp.probe("stop", trace, tmp_path, rp.after_first_part(fault), workers=2)
    print(o.row())
    _clean(o)
    assert o.rc == 130 and o.status == "interrupted", o.stdout + o.stderr
    assert o.after_fault_s is not None and o.after_fault_s < 10  # passed on, not ignored
    _rows_match(o)
    meta = json.loads((tmp_path / "res" / "run.json").read_text())
    assert meta["summary"]["failed"] == 0  # in flight at the stop: cancelled, not failed


def test_kill_9_of_the_parent_leaves_workers_that_write_and_end(
    trace: Path, tmp_path: Path
) -> None:
    """The workers notice the parent's death, stop, write their rows, and the last one
    out records the run as interrupted with totals that are the rows on disk."""
    o = rp.probe(
        "kill -9", trace, tmp_path, rp.after_first_part(rp.to_parent(signal.SIGKILL)), workers=2
    )
    print(o.row())
    _clean(o)
    assert o.rc == -signal.SIGKILL
    assert 0 < o.rows < 360
    assert o.status == "interrupted", o.stderr
    assert "resource_tracker" not in o.stderr  # the semaphores' clean-up is not news
    _rows_match(o)  # at most the requests in flight at the kill have no row: the engine
    # did not finish them (it saw their connections close)
    meta = json.loads((tmp_path / "res" / "run.json").read_text())
    assert meta["summary"]["total"] == 360
    assert sorted(meta["parent_died"]["shards"]) == ["0", "1"]
    assert meta["parent_died"]["counted_from_rows"] == []
    assert meta["parent_died"]["process"]["pid"] == o.pid
    assert f"pid {o.pid}" in meta["error"]
    report = rp.report(tmp_path / "res")
    assert "ended with status interrupted: the run's process" in report, report


def test_kill_9_of_the_group_leaves_a_run_json_that_readers_call_dead(
    trace: Path, tmp_path: Path
) -> None:
    """Every process killed at once: nobody can write the end, so run.json still says
    running; ``report`` says its process is gone instead of presenting a run under way."""
    o = rp.probe(
        "kill -9 group",
        trace,
        tmp_path,
        rp.after_first_part(rp.to_group(signal.SIGKILL)),
        workers=2,
    )
    assert not o.hang and o.orphans == 0
    assert o.status == "running"
    report = rp.report(tmp_path / "res")
    assert f"run.json says running, but the process that ran it (pid {o.pid} on" in report, report


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_while_workers_start_is_one_line(trace: Path, tmp_path: Path, workers: int) -> None:
    """The group's SIGINT as soon as the worker processes exist (still importing), or,
    with one worker, right after the run's start."""
    fault = (
        rp.when_workers_start(rp.to_group(signal.SIGINT))
        if workers > 1
        else rp.early(rp.to_group(signal.SIGINT), 1.0)
    )
    o = rp.probe("Ctrl-C early", trace, tmp_path, fault, workers=workers, timeout_s=30)
    _clean(o)
    assert o.rc == 130, o.stderr
    assert o.missing == 0
    if (tmp_path / "res" / "run.json").exists():
        assert o.status == "interrupted" and o.reported_rows() == o.rows


@pytest.mark.ray
def test_kill_9_of_a_ray_local_driver_leaves_actors_that_write_and_end(
    trace: Path, tmp_path: Path
) -> None:
    """``--ray=local``: the driver killed outright, its actors (two, on its private Ray)
    stop, write their rows and run.json as a local worker does, and the private Ray ends:
    no process of the run is left."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    o = rp.probe(
        "kill -9 ray",
        trace,
        tmp_path,
        rp.after_first_part(rp.to_parent(signal.SIGKILL)),
        extra=("--ray=local", "--ray-actors-per-node", "2"),
        timeout_s=120,
    )
    print(o.row())
    _clean(o)
    assert o.rc == -signal.SIGKILL
    assert 0 < o.rows < 360
    assert o.status == "interrupted", o.stderr
    _rows_match(o)
    meta = json.loads((tmp_path / "res" / "run.json").read_text())
    assert meta["summary"]["total"] == 360
    assert sorted(meta["parent_died"]["shards"]) == ["0", "1"]  # each actor's own summary
    assert meta["parent_died"]["process"]["pid"] == o.pid
    assert o.children >= 5  # Ray's processes were seen: the keeper, GCS, raylet, 2 actors


@pytest.mark.ray
def test_sigterm_to_a_ray_driver_is_a_graceful_stop(trace: Path, tmp_path: Path) -> None:
    """``ray.init`` replaces the driver's SIGTERM handler with an exit; the run keeps its
    own, so SIGTERM stops a ``--ray`` run as Ctrl-C does."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    o = rp.probe(
        "SIGTERM ray",
        trace,
        tmp_path,
        rp.after_first_part(rp.to_parent(signal.SIGTERM)),
        extra=("--ray=local",),
        timeout_s=120,
    )
    print(o.row())
    _clean(o)
    assert o.rc == 130 and o.status == "interrupted", o.stdout + o.stderr
    _rows_match(o)
