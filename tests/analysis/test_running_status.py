"""A run.json that still says ``running``: readers tell a run under way from one whose
process is gone (``runmeta.writer_state``, ``report.running_line``)."""

from __future__ import annotations

import os
import subprocess
import sys

from agent_replay.analysis.report import running_line
from agent_replay.runmeta import RunMeta, writer_identity, writer_state


def _meta(writer: dict[str, object] | None) -> RunMeta:
    return RunMeta.from_json({"status": "running", "writer": writer})


def test_this_process_is_alive_and_round_trips() -> None:
    ident = writer_identity()
    assert ident["pid"] == os.getpid()
    meta = _meta(ident)
    assert meta.writer == ident and meta.to_json()["writer"] == ident
    assert writer_state(meta) == "alive"
    assert running_line(meta).startswith(f"WARNING: this run is still running (pid {os.getpid()}")


def test_a_process_that_ended_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ident = writer_identity(proc.pid)
        assert writer_state(_meta(ident)) == "alive"
    finally:
        proc.kill()
        proc.wait()
    meta = _meta(ident)
    assert writer_state(meta) == "gone"
    line = running_line(meta)
    assert f"the process that ran it (pid {proc.pid} on {ident['host']}) is gone" in line


def test_a_reused_pid_is_not_the_writer() -> None:
    ident = writer_identity()
    if ident["start_ticks"] is None:  # no /proc: the pid alone is all there is
        return
    assert writer_state(_meta({**ident, "start_ticks": int(ident["start_ticks"]) + 1})) == "gone"


def test_another_host_or_no_writer_cannot_be_told() -> None:
    other = {**writer_identity(), "host": "not-" + str(writer_identity()["host"])}
    assert writer_state(_meta(other)) == "unknown"
    assert writer_state(_meta(None)) == "unknown"
    assert "cannot be checked from here" in running_line(_meta(other))
    assert "(not recorded)" in running_line(_meta(None))
