"""The results folder's lock: one writer; a worker process that got the lock holds it after
its parent let go; ``force`` moves earlier results aside and never deletes them; a dead
writer never blocks, also where the file system has no ``flock``."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_replay.errors import InputError, OutputExistsError
from agent_replay.replay import folderlock
from agent_replay.replay.folderlock import LOCK_NAME, Shared, acquire, held, refuse_if_busy
from agent_replay.runmeta import writer_identity


def _hold(lock: Shared | None, go: Any) -> None:
    go.wait(30)


def test_a_second_writer_is_refused_even_with_force(tmp_path: Path) -> None:
    out = tmp_path / "res"
    lock = acquire(out, False)
    try:
        assert held(out) is lock
        assert (out / "requests").is_dir()
        who = json.loads((out / LOCK_NAME).read_text())
        assert who["pid"] == writer_identity()["pid"]
        for force in (False, True):
            with pytest.raises(
                InputError,
                match=r"another run is writing its results here "
                rf"\(pid {who['pid']} on {who['host']}, since ",
            ):
                acquire(out, force)
        with pytest.raises(InputError, match="another run is writing"):
            refuse_if_busy(out)
        assert (out / "requests").is_dir()
    finally:
        lock.release()
    assert held(out) is None
    refuse_if_busy(out)  # free now
    refuse_if_busy(tmp_path / "nowhere")
    acquire(out, False).release()  # the check took no lock of its own


def test_a_worker_keeps_the_lock_after_its_parent_let_go(tmp_path: Path) -> None:
    out = tmp_path / "res"
    lock = acquire(out, False)
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    p = ctx.Process(target=_hold, args=(lock.share(), go))
    p.start()
    lock.release()  # the parent's descriptor is closed: the worker's still holds the lock
    try:
        with pytest.raises(InputError, match="another run is writing"):
            acquire(out, True)
    finally:
        go.set()
        p.join(30)
    again = acquire(out, True)  # the worker is gone: the lock is free
    again.release()


def test_force_moves_a_finished_folder_aside(tmp_path: Path) -> None:
    out = tmp_path / "res"
    acquire(out, False).release()
    (out / "run.json").write_text('{"status": "ok"}')
    (out / "requests" / "part-000-00000.parquet").write_bytes(b"rows")
    with pytest.raises(OutputExistsError):
        acquire(out, False)
    lock = acquire(out, True)
    lock.release()
    assert lock.moved_to is not None and lock.moved_to.parent == tmp_path
    assert lock.moved_to.name.startswith("res.replaced-")
    assert (lock.moved_to / "requests" / "part-000-00000.parquet").read_bytes() == b"rows"
    assert json.loads((lock.moved_to / "run.json").read_text()) == {"status": "ok"}
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "requests"]
    assert list((out / "requests").iterdir()) == []
    second = acquire(out, True)  # an empty folder: nothing to move
    second.release()
    assert second.moved_to is None


def test_a_folder_that_is_not_results_is_left_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(InputError):
            acquire(out, force)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_without_flock_the_recorded_writer_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folderlock, "_try_lock", lambda fd: None)
    out = tmp_path / "res"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ident = writer_identity(live.pid)
    try:
        (out / LOCK_NAME).write_text(json.dumps(ident))
        with pytest.raises(InputError, match=f"pid {live.pid}"):
            acquire(out, True)
    finally:
        live.kill()
        live.wait()
    (out / LOCK_NAME).write_text(json.dumps(ident))  # now a dead writer
    lock = acquire(out, True)
    lock.release()
    assert lock.stale is not None and lock.stale["pid"] == live.pid
