"""Ctrl-C during a run: exit 130, every completed request kept in readable part files,
run.json says interrupted and the output says where the partial results are."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.results import read_run_record
from tests.replay.helpers import MS, chain_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_keeps_partial_results(tmp_path: Path, inherited: str) -> None:
    # "ignored": started by a parent that ignores SIGINT (a script's ``cmd &``), which the
    # run inherits; an explicit SIGINT still stops it
    # 40 sessions of 3 requests spread over 8 s: the interrupt lands in the middle
    trace = write_rows(tmp_path / "t.parquet", chain_rows(40, 3, gap_ns=200 * MS, output_tokens=4))
    out = tmp_path / "res"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio\nfrom tests.replay.fakeserver import FakeVllm, start\n"
            "async def go():\n    runner, url = await start(FakeVllm(step_s=0.01))\n"
            "    print(url, flush=True)\n    await asyncio.sleep(120)\nasyncio.run(go())\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                url,
                "-o",
                str(out),
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_ignore_sigint if inherited == "ignored" else None,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((out / "requests").glob("part-*.parquet")):
            time.sleep(0.1)
        time.sleep(0.5)
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert run.returncode == 130, stdout + stderr
    assert f"partial results (every completed request) are in {out}" in stderr
    # before: the report was written for seconds without a word; now the wait is said
    said = [x for x in stderr.splitlines() if x.startswith("interrupted: writing the report of")]
    assert len(said) == 1 and said[0].endswith("(report.html); Ctrl-C again to skip it")
    assert (out / "report.html").exists()
    assert "INTERRUPTED" in stdout
    assert read_run_record(out).status == "interrupted"
    rows = pq.read_table(out / "requests").to_pydict()
    n = len(rows["session_id"])
    assert 0 < n < 120
    ok = [i for i in range(n) if rows["status"][i] == "ok"]
    assert ok and all(sum(rows["chunk_tokens"][i]) == rows["expected_output_tokens"][i] for i in ok)
    assert set(rows["error_kind"]) <= {None, "cancelled"}
    assert not list((out / "requests").glob(".*.tmp"))
