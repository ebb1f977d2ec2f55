"""Two runs and one results folder: a second run into a folder that a live run is writing
is refused in one line, with or without ``--force``, and the live run's rows and run.json
are untouched; ``--force`` on a finished folder moves its results aside and says where;
a run killed outright (``kill -9`` of its whole group) does not block the next one.

Each probe replays a small trace on the simulated engine and counts the rows in the folder
by the run that wrote them (a request id starts with its run's id)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim.process import SimProcess
from tests.replay.helpers import MS, chain_rows, write_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ARGS = ("--workers", "2", "--no-progress", "--scrape-interval", "0", "--gpu-metrics", "off")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 360 requests over about 14 s: a second run started under load still finds it live
    return write_rows(
        tmp_path_factory.mktemp("trace") / "t.parquet",
        chain_rows(30, 12, gap_ns=60 * MS, think_ns=1000 * MS, output_tokens=6),
    )


def _start(trace: Path, url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
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
            *ARGS,
            *extra,
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_part(out: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not list((out / "requests").glob("part-*.parquet")):
        time.sleep(0.05)


def _rows_by_run(out: Path) -> Counter[str]:
    """Rows in ``out`` by the run id their request id starts with."""
    c: Counter[str] = Counter()
    for f in (out / "requests").glob("part-*.parquet"):
        for rid in pq.read_table(f, columns=["request_id"]).column(0).to_pylist():
            c[rid.split("-", 1)[0]] += 1
    return c


def _total(meta: dict[str, object]) -> int:
    s = meta["summary"]
    assert isinstance(s, dict)
    return int(s["ok"]) + int(s["failed"]) + int(s["cancelled"])


@pytest.mark.parametrize("force", [True, False], ids=["--force", "no-force"])
def test_a_second_run_into_a_live_folder_is_refused(
    trace: Path, tmp_path: Path, force: bool
) -> None:
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        a = _start(trace, sim.url, out)
        _wait_part(out)
        t = time.monotonic()
        b = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                str(trace),
                "--target",
                sim.url,
                "-o",
                str(out),
                *ARGS,
                *(("--force",) if force else ()),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        b_s = time.monotonic() - t
        a_out, a_err = a.communicate(timeout=120)
    meta = json.loads((out / "run.json").read_text())
    rows = _rows_by_run(out)
    b_lines = [x for x in b.stderr.splitlines() if x.strip()]
    print(
        f"| live folder {'--force' if force else ''} | B exit {b.returncode} in {b_s:.1f} s | "
        f"A exit {a.returncode} {meta['status']} | rows by run {dict(rows)} | "
        f"run.json total {_total(meta)} | B: {b_lines[-1] if b_lines else ''} |"
    )
    assert b.returncode == 2, b.stdout + b.stderr
    assert len(b_lines) == 1 and "another run is writing its results here" in b_lines[0]
    assert f"pid {a.pid} on " in b_lines[0]
    assert "Traceback" not in b.stderr
    assert a.returncode == 0 and meta["status"] == "ok", a_out + a_err
    assert rows == {meta["run_id"]: 360}  # A's rows, all of them, and only A's
    assert _total(meta) == 360
    assert not list(tmp_path.glob("res.replaced-*"))


def test_force_on_a_finished_folder_moves_it_aside(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        first = _start(trace, sim.url, out)
        first.communicate(timeout=120)
        old = json.loads((out / "run.json").read_text())
        second = _start(trace, sim.url, out, "--force")
        _, err = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err
    aside = list(tmp_path.glob("res.replaced-*"))
    assert len(aside) == 1
    assert f"--force: the earlier results in {out} were moved to {aside[0]}" in err
    assert json.loads((aside[0] / "run.json").read_text()) == old
    assert _rows_by_run(aside[0]) == {old["run_id"]: 360}
    new = json.loads((out / "run.json").read_text())
    assert _rows_by_run(out) == {new["run_id"]: 360}
    print(
        f"| finished folder --force | moved to {aside[0].name} | old rows "
        f"{sum(_rows_by_run(aside[0]).values())} | new rows {sum(_rows_by_run(out).values())} |"
    )


def test_a_run_killed_outright_does_not_block_the_next(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "res"
    with SimProcess("fast") as sim:
        a = _start(trace, sim.url, out)
        _wait_part(out)
        os.killpg(a.pid, signal.SIGKILL)  # every process of the run: nobody writes its end
        a.communicate(timeout=60)
        assert json.loads((out / "run.json").read_text())["status"] == "running"
        b = _start(trace, sim.url, out, "--force")
        _, err = b.communicate(timeout=120)
    assert b.returncode == 0, err
    assert len(list(tmp_path.glob("res.replaced-*"))) == 1
    assert json.loads((out / "run.json").read_text())["status"] == "ok"
