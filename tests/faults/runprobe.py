"""Drive ``agent-replay run`` through a fault and count what it left: the probe behind
tests/faults/test_run_rows.py and benchmarks/bench_run_faults.py.

A scenario starts the simulated engine with its ground truth on (every request it got,
and whether it finished the stream), starts ``run`` in a session of its own (so a signal
can go to its whole process group), applies one fault (a full disk: a small tmpfs filled
by a filler file; a signal to the parent, a worker or the group; ``kill -9`` of the parent)
and then counts: request rows readable in ``requests/part-*.parquet``, requests the engine
finished that have no row, ``.tmp`` leftovers, run.json's status and summary, the final
line, the exit code, a traceback on stderr, child processes left alive, and a hang (the
run killed after ``timeout_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agent_replay.engines.sim.process import SimProcess

ROOT = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> set[int]:
    """Every process whose ancestry leads to ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started(pid: int) -> tuple[int, int]:
    """``pid`` with its start time (clock ticks after boot): a process, even once its pid
    is reused."""
    st = _stat(pid)
    return pid, int(st[19]) if st is not None else -1


def alive(proc: tuple[int, int]) -> bool:
    """Whether the process ``started`` gave is still running (not a zombie)."""
    st = _stat(proc[0])
    return st is not None and st[0] != "Z" and int(st[19]) == proc[1]


def mount_tmpfs(where: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``where`` (root only); False where it cannot be had."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    return r.returncode == 0


def umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one filler file; returns it."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (65536, 4096, 512, 1):  # to the last page
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\1" * size)
    return filler


@dataclass
class Run:
    """The run under test while its fault is applied."""

    proc: subprocess.Popen[str]
    out: Path
    disk: Path | None
    seen: set[tuple[int, int]] = field(default_factory=set)  # children seen while it ran (started)
    fault_at: float | None = None  # time.monotonic() when the fault was applied

    def watch(self) -> None:
        self.seen |= {started(p) for p in descendants(self.proc.pid)}

    def parts(self) -> list[Path]:
        d = self.out / "requests"
        return sorted(d.glob("part-*.parquet")) if d.is_dir() else []

    def wait_parts(self, n: int = 1, timeout_s: float = 60) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            self.watch()
            if len(self.parts()) >= n:
                return True
            time.sleep(0.05)
        return False

    def workers(self) -> list[int]:
        """The worker processes (spawned children running ``multiprocessing``)."""
        out = []
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"multiprocessing" in cmd and b"spawn_main" in cmd:
                    out.append(pid)
        return sorted(out)

    def signal_group(self, sig: int) -> None:
        self.fault_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


Fault = Callable[[Run], None]


@dataclass
class Outcome:
    name: str
    rc: int | None
    hang: bool
    rows: int
    finished: int  # requests whose stream the engine finished
    missing: int  # of those, without a row
    received: int  # requests the engine got
    tmp_left: int
    status: str | None
    summary: dict[str, Any]
    unwritten: int | None
    last_line: str
    traceback: bool
    orphans: int
    seconds: float
    after_fault_s: float | None  # from the fault to the run's exit
    reserve_left: bool  # the results folder's .space-reserve is still there
    stderr: str
    stdout: str
    pid: int = 0  # the run's process
    children: int = 0  # processes seen under it while it ran
    fault_at: float | None = None  # time.monotonic() when the fault was applied

    def reported_rows(self) -> int | None:
        """Rows the run says it has: ok + failed + cancelled, less any it says it lost."""
        s = self.summary
        if not s:
            return None
        return (
            int(s.get("ok", 0))
            + int(s.get("failed", 0))
            + int(s.get("cancelled", 0))
            - int(s.get("unwritten", 0) or 0)
        )

    def problems(self) -> list[str]:
        """What this outcome breaks of the contract (the test_run_rows.py checks that
        hold for every fault): a hang, a traceback, processes left, a ``.tmp`` part or the
        space reserve left, a run.json that still says running, totals that are not the
        rows on disk, requests the engine finished without a row the run does not
        report as unwritten."""
        out = []
        if self.hang:
            out.append("hang")
        if self.traceback:
            out.append("traceback")
        if self.orphans:
            out.append(f"{self.orphans} orphans")
        if self.tmp_left:
            out.append(f"{self.tmp_left} .tmp")
        if self.reserve_left:
            out.append("reserve left")
        if self.status == "running":
            out.append("run.json running")
        rep = self.reported_rows()
        if rep is not None and rep != self.rows:
            out.append(f"reported {rep} != {self.rows} rows")
        if self.missing > (self.unwritten or 0):
            out.append(f"{self.missing - (self.unwritten or 0)} finished, no row, unreported")
        return out

    def row(self) -> str:
        rep = self.reported_rows()
        return (
            f"| {self.name} | {self.finished} | {self.rows} | {self.missing} | "
            f"{'-' if rep is None else rep} | {self.unwritten if self.unwritten is not None else '-'} | "
            f"{self.status or '-'} | {'hang' if self.hang else self.rc} | "
            f"{'yes' if self.traceback else 'no'} | {self.orphans} | {self.tmp_left} | "
            f"{'-' if self.after_fault_s is None else f'{self.after_fault_s:.1f}'} | "
            f"{self.last_line[:70]} | {'; '.join(self.problems()) or 'none'} |"
        )


TABLE_HEAD = (
    "| scenario | finished by engine | rows | finished without row | rows reported "
    "| unwritten reported | run.json status | exit | traceback | orphans | .tmp left "
    "| exit s after fault | final line | problems |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def probe(
    name: str,
    trace: Path,
    work: Path,
    fault: Fault | None,
    *,
    workers: int = 1,
    tmpfs: str | None = None,
    fill_first: bool = False,
    repo: Path = ROOT,
    timeout_s: float = 60,
    extra: tuple[str, ...] = (),
) -> Outcome:
    """Run ``trace`` on the sim engine with ``fault`` applied; see the module docs.
    ``tmpfs``: put the results folder on a tmpfs of this size (root only: otherwise a
    plain folder); ``fill_first``: fill it before the run starts."""
    work.mkdir(parents=True, exist_ok=True)
    disk: Path | None = None
    if tmpfs is not None:
        disk = work / "disk"
        if not mount_tmpfs(disk, tmpfs):
            raise RuntimeError("a tmpfs needs root")
    out = (disk or work) / "res"
    gt = work / "gt.parquet"
    try:
        with SimProcess("fast", ground_truth=gt) as sim:
            if fill_first and disk is not None:
                fill(disk)
            env = {**os.environ, "PYTHONPATH": str(repo)}
            t0 = time.monotonic()
            proc = subprocess.Popen(
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
                    "--workers",
                    str(workers),
                    "--no-progress",
                    "--scrape-interval",
                    "0",
                    "--gpu-metrics",
                    "off",
                    *extra,
                ],
                cwd=repo,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            run = Run(proc, out, disk)
            outs: list[str] = []

            def read() -> None:
                o, e = proc.communicate()
                outs.extend([o, e])

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            if fault is not None:
                fault(run)
            deadline = time.monotonic() + timeout_s
            while reader.is_alive() and time.monotonic() < deadline:
                run.watch()
                reader.join(0.05)
            hang = reader.is_alive()
            ended = time.monotonic()
            if hang:
                run.signal_group(signal.SIGKILL)
                for child in run.seen:
                    if alive(child):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(child[0], signal.SIGKILL)
                reader.join(10)
            seconds = time.monotonic() - t0
            # children left: give them the time a stop takes, then count
            end = time.monotonic() + 15
            while time.monotonic() < end and any(alive(p) for p in run.seen):
                time.sleep(0.1)
            orphans = [p for p in run.seen if alive(p)]
            for p in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p[0], signal.SIGKILL)
        stdout, stderr = (outs + ["", ""])[:2]
        rows_ids: set[str] = set()
        for f in run.parts():
            rows_ids |= set(pq.read_table(f, columns=["request_id"]).column(0).to_pylist())
        tmp_left = (
            len(list((out / "requests").glob(".*.tmp"))) if (out / "requests").is_dir() else 0
        )
        truth = (
            pq.read_table(gt, columns=["request_id", "finish_reason"]).to_pydict()
            if gt.exists()
            else {"request_id": [], "finish_reason": []}
        )
        finished = {
            r
            for r, fr in zip(truth["request_id"], truth["finish_reason"], strict=True)
            if fr is not None
        }
        meta: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((out / "run.json").read_text())
        summary = meta.get("summary") or {}
        lines = [x for x in stdout.splitlines() if x.strip()]
        final = next((x for x in lines if "planned" in x), "")
        if not final and stderr.strip():
            final = stderr.strip().splitlines()[-1]
        return Outcome(
            name=name,
            rc=proc.returncode if not hang else None,
            hang=hang,
            rows=len(rows_ids),
            finished=len(finished),
            missing=len(finished - rows_ids),
            received=len(truth["request_id"]),
            tmp_left=tmp_left,
            status=meta.get("status"),
            summary=summary,
            unwritten=summary.get("unwritten"),
            last_line=final,
            traceback="Traceback" in stderr,
            orphans=len(orphans),
            seconds=seconds,
            after_fault_s=None if run.fault_at is None else ended - run.fault_at,
            reserve_left=(out / ".space-reserve").exists(),
            stderr=stderr,
            stdout=stdout,
            pid=proc.pid,
            children=len(run.seen),
            fault_at=run.fault_at,
        )
    finally:
        if disk is not None:
            umount(disk)


def report(out: Path, repo: Path = ROOT) -> str:
    """What ``agent-replay report`` prints for the results folder ``out``."""
    r = subprocess.run(
        [sys.executable, "-m", "agent_replay", "report", str(out)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout + r.stderr


# Faults ------------------------------------------------------------------------------


def after_rows(n: int, then: Fault) -> Fault:
    """``then`` once the part files hold at least ``n`` rows."""

    def fault(run: Run) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.proc.poll() is None:
            run.watch()
            rows = 0
            for f in run.parts():
                with contextlib.suppress(OSError, ValueError):
                    rows += pq.ParquetFile(f).metadata.num_rows
            if rows >= n:
                break
            time.sleep(0.05)
        then(run)

    return fault


def after_first_part(then: Fault, delay_s: float = 0.3) -> Fault:
    def fault(run: Run) -> None:
        if run.wait_parts():
            time.sleep(delay_s)
            run.watch()
            then(run)

    return fault


def disk_full(free_after_s: float | None) -> Fault:
    """Fill the disk; free it again after ``free_after_s`` (None: never)."""

    def fault(run: Run) -> None:
        assert run.disk is not None
        run.fault_at = time.monotonic()
        filler = fill(run.disk)
        if free_after_s is not None:
            end = time.monotonic() + free_after_s
            while time.monotonic() < end and run.proc.poll() is None:
                run.watch()
                time.sleep(0.05)
            filler.unlink()

    return fault


def to_parent(sig: int) -> Fault:
    def fault(run: Run) -> None:
        run.fault_at = time.monotonic()
        run.proc.send_signal(sig)

    return fault


def to_group(sig: int) -> Fault:
    def fault(run: Run) -> None:
        run.signal_group(sig)

    return fault


def to_worker(sig: int) -> Fault:
    def fault(run: Run) -> None:
        ws = run.workers()
        if ws:
            run.fault_at = time.monotonic()
            os.kill(ws[0], sig)

    return fault


def early(then: Fault, delay_s: float) -> Fault:
    """``then`` ``delay_s`` after the run started."""

    def fault(run: Run) -> None:
        end = time.monotonic() + delay_s
        while time.monotonic() < end:
            run.watch()
            time.sleep(0.01)
        then(run)

    return fault


def when_workers_start(then: Fault) -> Fault:
    """``then`` as soon as worker processes exist (they are still importing)."""

    def fault(run: Run) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and run.proc.poll() is None and not run.workers():
            time.sleep(0.01)
        run.watch()
        then(run)

    return fault
