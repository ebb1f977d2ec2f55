"""One worker of ``run --workers 2`` killed or stopped alone: it loses only what it held in
flight, and the whole run stops as it would on a stop of its own process.

- ``kill -9`` of one worker: every request the engine finished has a row (the worker's
  rows of the last second, not yet in a part file, are taken from its row journal); the
  parent notices the death within about a second, stops the other worker, ends the run
  ``interrupted`` (exit 130) with totals that are the rows on disk, and names the shard
  that was cut, in run.json and on stderr.
- SIGTERM to one worker: the other stops too, as promptly as on a SIGTERM to the parent.

The trace runs about 13 s; a worker left to replay its shard would end the run that long
after the fault."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.faults import runprobe as rp
from tests.replay.helpers import MS, chain_rows, write_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 1200 requests over about 13 s
    return write_rows(
        tmp_path_factory.mktemp("trace") / "t.parquet",
        chain_rows(30, 40, gap_ns=60 * MS, think_ns=250 * MS, output_tokens=6),
    )


def _clean(o: rp.Outcome, out: Path) -> None:
    assert not o.hang, o.stderr
    assert "Traceback" not in o.stderr, o.stderr
    assert o.orphans == 0
    assert o.tmp_left == 0
    assert not o.reserve_left
    assert not list((out / "requests").glob(".rows-*")), "a row journal was left"


IN_FLIGHT_S = 0.25
"""A request the engine finished this shortly before the kill was still in flight at the
worker (its last chunk not yet read): a loaded host's loop may be this late."""


def _last_chunk_before_kill(work: Path, o: rp.Outcome) -> dict[str, float]:
    """Requests the engine finished that have no row: how long before the kill the engine
    wrote their last chunk (the engine and the probe share CLOCK_MONOTONIC)."""
    assert o.fault_at is not None
    rows: set[str] = set()
    for f in (work / "res" / "requests").glob("part-*.parquet"):
        rows |= set(pq.read_table(f, columns=["request_id"]).column(0).to_pylist())
    gt = pq.read_table(work / "gt.parquet", columns=["request_id", "finish_reason", "chunk_ns"])
    out = {}
    for rid, fr, chunks in zip(*(gt.column(c).to_pylist() for c in gt.column_names), strict=True):
        if fr is not None and rid not in rows:
            if not chunks:  # no answer yet: in flight if the engine aborted it as its client left
                out[rid] = 0.0 if fr == "abort" else float("inf")
            else:
                out[rid] = round(o.fault_at - max(chunks) / 1e9, 3)
    return out


def test_kill_9_of_one_worker_loses_only_what_it_held_in_flight(
    trace: Path, tmp_path: Path
) -> None:
    o = rp.probe(
        "kill -9 worker",
        trace,
        tmp_path,
        rp.after_first_part(rp.to_worker(signal.SIGKILL), delay_s=0.6),
        workers=2,
    )
    print(rp.TABLE_HEAD)
    print(o.row())
    _clean(o, tmp_path / "res")
    # Finished by the engine without a row: only requests whose answer was on its way when
    # the worker died (its last chunk written at most IN_FLIGHT_S before the kill).
    late = _last_chunk_before_kill(tmp_path, o)
    print(f"finished by the engine without a row: {sorted(late.values())} s before the kill")
    assert len(late) == o.missing
    assert all(s < IN_FLIGHT_S for s in late.values()), late
    assert o.reported_rows() == o.rows, (o.summary, o.rows)
    assert 0 < o.rows < 1200
    assert o.status == "interrupted" and o.rc == 130, o.stdout + o.stderr
    assert o.after_fault_s is not None and o.after_fault_s < 10, o.after_fault_s
    meta = json.loads((tmp_path / "res" / "run.json").read_text())
    assert meta["summary"]["total"] == 1200
    cut = meta["workers_cut"]
    assert [c["shard"] for c in cut] == [0]
    assert cut[0]["signal"] == "SIGKILL"
    assert o.fault_at is not None
    noticed_s = cut[0]["noticed_monotonic_ns"] / 1e9 - o.fault_at  # the same clock
    print(f"death noticed {noticed_s:.3f} s after the kill")
    assert 0 <= noticed_s < 1.0, noticed_s
    print(cut, o.stderr.strip().splitlines()[-3:])
    assert "worker 0 (shard 0 of 2) died (SIGKILL)" in o.stderr, o.stderr
    assert cut[0]["rows"] > 0


def test_sigterm_to_one_worker_stops_the_run_as_on_the_parent(trace: Path, tmp_path: Path) -> None:
    parent = rp.probe(
        "SIGTERM parent",
        trace,
        tmp_path / "p",
        rp.after_first_part(rp.to_parent(signal.SIGTERM)),
        workers=2,
    )
    worker = rp.probe(
        "SIGTERM worker",
        trace,
        tmp_path / "w",
        rp.after_first_part(rp.to_worker(signal.SIGTERM)),
        workers=2,
    )
    print(rp.TABLE_HEAD)
    print(parent.row())
    print(worker.row())
    for o, sub in ((parent, "p"), (worker, "w")):
        _clean(o, tmp_path / sub / "res")
        assert o.status == "interrupted" and o.rc == 130, o.stdout + o.stderr
        assert o.missing == 0 and o.reported_rows() == o.rows
        assert o.after_fault_s is not None
    assert worker.after_fault_s is not None and parent.after_fault_s is not None
    # as prompt as the parent's stop, with a margin for a loaded host
    assert worker.after_fault_s < parent.after_fault_s + 3.0, (
        worker.after_fault_s,
        parent.after_fault_s,
    )
    assert worker.rows < 1200 * 0.8
    meta = json.loads((tmp_path / "w" / "res" / "run.json").read_text())
    assert meta["stopped_by_worker"] in (0, 1) and "workers_cut" not in meta
    assert "stopping the run" in worker.stderr
    assert "stopped_by_worker" not in json.loads((tmp_path / "p" / "res" / "run.json").read_text())
