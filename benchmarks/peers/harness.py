"""The measuring harness shared by the peer benchmarks: the simulated engine pinned to one
core with ground truth on, a client pinned to the other core, the client's CPU sampled over
its whole process tree, and the ground truth's own figures.

Method (the same for every client): the server records ``monotonic_ns`` when each request
arrived and right after each chunk was written. The window is the workload's: from the
arrival of the first of the client's N workload requests to the last chunk written; a
client's own extra requests before its workload (a warm-up; ``vllm bench serve`` sends a
single-prompt test run when ``--ready-check-timeout-sec`` is above 0, which is not its
default in 0.32) are left out of the window and of its chunks. A client's CPU is the CPU time of all its
processes, read from each process's CPU-time clock (nanoseconds, every thread, living and
ended) every ``CPU_PERIOD_S`` and interpolated to the window's two ends, so start-up
(imports, tokenizer loading, dataset building) and the work after the last chunk (metrics,
reports, result files) are not counted, and each end is off by at most one period of CPU.
CPU per chunk = that CPU / chunks the server wrote in the window. What a whole run costs
(start-up and the end included) is the client's ``wait4`` resource usage, kept beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench-model"


def cores() -> tuple[str, str]:
    """(server core, client core): 0 and 1 when the machine has two, else no pinning."""
    n = os.cpu_count() or 1
    return ("0", "1") if n >= 2 and shutil.which("taskset") else ("", "")


def pinned(core: str, cmd: Sequence[str]) -> list[str]:
    return (["taskset", "-c", core] if core else []) + list(cmd)


def write_profile(path: Path, interval_ms: float, spec_tokens: int = 0) -> Path:
    """A simulated engine that writes one chunk per stream every ``interval_ms`` whatever the
    batch (so the offered load is streams x 1000/interval chunks/s), with no early end of
    sequence; with ``spec_tokens``, an MTP-like acceptance so chunks carry 1..1+spec tokens."""
    sys.path.insert(0, str(ROOT))
    from agent_replay.engines.sim import SimProfile

    base = SimProfile.load("fast").to_dict()
    base.update(
        name=path.stem,
        model_name=MODEL,
        decode_base_ns=int(interval_ms * 1e6),
        decode_per_seq_ns=0,
        decode_per_ctx_token_ns=0.0,
        eos_prob=0.0,
        prefill_tokens_per_s=5e6,
        max_num_seqs=1024,
        spin_ns=1_000_000,
        num_speculative_tokens=spec_tokens,
        spec_acceptance=[0.8, 0.6, 0.5][:spec_tokens],
    )
    path.write_text(json.dumps(base))
    return path


@contextlib.contextmanager
def sim_server(profile: Path, gt: Path, core: str, kernel_arrival: bool = False) -> Iterator[str]:
    """The engine on ``core``; yields its URL; on exit it is stopped (SIGTERM) and has
    written its ground truth to ``gt``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = pinned(
        core,
        [
            sys.executable,
            "-m",
            "agent_replay.engines.sim",
            "--port",
            "0",
            "--profile",
            str(profile),
            "--ground-truth",
            str(gt),
            "--force",
        ]
        + (["--kernel-arrival"] if kernel_arrival else []),
    )
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"simulated engine did not start: {line!r}")
        yield line.split()[1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


CPU_PERIOD_S = 0.01
"""How often the client's CPU clocks are read: 10 ms, so each end of the window is off by at
most 10 ms of one core's time (the old 0.2 s period put up to 0.2 s of start-up or report CPU
into a window that holds 0.5-3 s of CPU)."""
CHILDREN_PERIOD_S = 0.25
"""How often the client's process tree is listed anew (a scan of /proc: the costly part)."""


def process_cpu_clock(pid: int) -> int:
    """Linux's CPU-time clock of process ``pid`` (``clock_getcpuclockid``: all its threads,
    nanoseconds), for ``time.clock_gettime_ns``."""
    return (~pid << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process ``pid``: its CPU-time clock where the platform has
    one, else user + system from psutil (10 ms resolution)."""
    if sys.platform.startswith("linux"):
        return time.clock_gettime_ns(process_cpu_clock(pid)) / 1e9
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


class TreeCpu:
    """Samples the CPU seconds of a process and all its descendants (ended ones keep their
    last reading) every ``period`` seconds, against ``time.monotonic_ns()``."""

    def __init__(self, pid: int, period: float = CPU_PERIOD_S) -> None:
        self.root = psutil.Process(pid)
        self.period = period
        self.samples: list[tuple[int, float]] = []
        self._last: dict[int, float] = {}
        self._pids: list[int] = [pid]
        self._listed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeCpu:
        self._thread.start()
        return self

    def _read(self) -> float:
        now = time.monotonic_ns()
        if now - self._listed >= CHILDREN_PERIOD_S * 1e9:
            self._listed = now
            try:
                self._pids = [self.root.pid, *(p.pid for p in self.root.children(recursive=True))]
            except psutil.Error:
                pass
        for pid in self._pids:
            try:
                self._last[pid] = process_cpu_s(pid)
            except (OSError, psutil.Error):
                pass
        return sum(self._last.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic_ns()
            self.samples.append((t, self._read()))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def at(self, t: int) -> float:
        """CPU seconds used by ``t`` (linear interpolation between samples)."""
        if len(self.samples) < 2:
            return float("nan")
        ts = np.array([s[0] for s in self.samples], dtype=np.float64)
        cpu = np.array([s[1] for s in self.samples])
        return float(np.interp(t, ts, cpu))

    def between(self, t0: int, t1: int) -> float:
        """CPU seconds used between two monotonic instants (linear interpolation)."""
        return self.at(t1) - self.at(t0)

    def save(self, path: Path) -> None:
        """The samples as CSV (monotonic ns, CPU s), to look at the edges of a window."""
        path.write_text("t_ns,cpu_s\n" + "".join(f"{t},{c:.6f}\n" for t, c in self.samples))


@dataclass
class ClientRun:
    rc: int
    wall_s: float
    cpu: TreeCpu
    log: str
    total_cpu_s: float = float("nan")
    """User + system CPU of the whole run (``wait4``: the client and every descendant it
    waited for), start-up and the end included: what the user pays for the run."""
    load1: float = float("nan")
    """The host's 1-minute load average when the client started."""
    steal: float = float("nan")
    """Share of the host's CPU time stolen by the hypervisor while the client ran."""


def _cpu_ticks() -> tuple[int, int]:
    """(all, steal) clock ticks of the host so far, from /proc/stat; (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(f[:8]), f[7] if len(f) > 7 else 0


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    """Wait for ``proc`` (SIGKILL to its session after ``timeout`` s); (exit code, its
    user + system CPU seconds with its waited-for descendants)."""
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        if not killed and time.monotonic() > deadline:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.02)


def run_client(
    cmd: Sequence[str], core: str, env: dict[str, str], log: Path, timeout: float = 600
) -> ClientRun:
    t = time.monotonic()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    all0, steal0 = _cpu_ticks()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            pinned(core, cmd), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        cpu = TreeCpu(proc.pid).start()
        rc, total = _wait(proc, timeout)
        cpu.stop()
    all1, steal1 = _cpu_ticks()
    steal = (steal1 - steal0) / (all1 - all0) if all1 > all0 else float("nan")
    return ClientRun(
        rc, time.monotonic() - t, cpu, log.read_text(errors="replace")[-3000:], total, load1, steal
    )


@dataclass
class Truth:
    """What the server really did."""

    requests: int
    chunks: int
    tokens: int
    t0: int
    t1: int
    chunk_gap_p50_ms: float
    chunk_gap_p99_ms: float
    itl_mean_ms: float
    itl_p99_ms: float
    ttft_mean_ms: float
    """First chunk written - request handler started (the engine's ingress queue left out)."""
    ttft_first_read_mean_ms: float = float("nan")
    """First chunk written - the engine's event loop first read the request's bytes (its
    ingress queue included); NaN for ground truth written before that column existed."""
    by_id: dict[str, tuple[int, np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    """request id -> (handler started, chunk write times, chunk tokens)."""
    first_byte_by_id: dict[str, int] = field(default_factory=dict, repr=False)
    """request id -> when its bytes reached the engine (kernel stamp with --kernel-arrival,
    else the engine loop's first read)."""

    arrivals_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """Each request's arrival (when its handler started), in arrival order."""
    chunks_by_arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """Chunks written for each request, in the order of ``arrivals_ns``."""

    @property
    def window_s(self) -> float:
        return (self.t1 - self.t0) / 1e9

    def workload(self, n: int) -> Truth:
        """The ground truth's window and chunk count cut to the client's last ``n`` requests
        by arrival: a client's own requests before its workload of ``n`` (a warm-up, a test
        run) are left out of the CPU window and of the chunks it is divided by."""
        extra = self.requests - n
        if extra <= 0 or self.arrivals_ns.size != self.requests:
            return self
        return replace(
            self,
            requests=n,
            t0=int(self.arrivals_ns[extra]),
            chunks=int(self.chunks_by_arrival[extra:].sum()),
        )


def per_token(gaps: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ITL samples (docs/metrics.md): gap j counts k_j times as gap/k_j."""
    return gaps / k, k


def weighted_pct(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if values.size == 0:
        return float("nan")
    order = np.argsort(values)
    v, w = values[order], weights[order].astype(np.float64)
    cum = np.cumsum(w)
    idx = int(np.searchsorted(cum, q / 100 * cum[-1], side="left"))
    return float(v[min(idx, v.size - 1)])


def read_truth(path: Path) -> Truth:
    t = pq.read_table(path)
    rec = t.column("received_ns").to_numpy()
    first = (
        t.column("first_byte_ns").to_numpy(zero_copy_only=False)
        if "first_byte_ns" in t.column_names
        else None
    )
    ids = t.column("request_id").to_pylist()
    cns = t.column("chunk_ns").to_pylist()
    ctk = t.column("chunk_tokens").to_pylist()
    gaps, toks, ttft, ttft_first = [], [], [], []
    by_id, first_by_id = {}, {}
    t1 = 0
    for rid, r, c, k in zip(ids, rec, cns, ctk, strict=True):
        c_arr, k_arr = np.asarray(c, dtype=np.int64), np.asarray(k, dtype=np.int64)
        by_id[rid] = (int(r), c_arr, k_arr)
        if first is not None:
            first_by_id[rid] = int(first[len(by_id) - 1])
        if c_arr.size:
            ttft.append(c_arr[0] - r)
            t1 = max(t1, int(c_arr[-1]))
            if first is not None:
                ttft_first.append(c_arr[0] - first[len(ttft) - 1])
        if c_arr.size > 1:
            gaps.append(np.diff(c_arr))
            toks.append(k_arr[1:])
    g = np.concatenate(gaps) if gaps else np.zeros(0)
    k = np.concatenate(toks) if toks else np.ones(0)
    itl, w = per_token(g, k)
    return Truth(
        requests=len(ids),
        chunks=int(sum(len(c) for c in cns)),
        tokens=int(sum(sum(k) for k in ctk)),
        t0=int(rec.min()) if len(rec) else 0,
        t1=t1,
        chunk_gap_p50_ms=float(np.percentile(g, 50)) / 1e6 if g.size else float("nan"),
        chunk_gap_p99_ms=float(np.percentile(g, 99)) / 1e6 if g.size else float("nan"),
        itl_mean_ms=float((itl * w).sum() / w.sum()) / 1e6 if w.size else float("nan"),
        itl_p99_ms=weighted_pct(itl, w, 99) / 1e6,
        ttft_mean_ms=float(np.mean(ttft)) / 1e6 if ttft else float("nan"),
        ttft_first_read_mean_ms=float(np.mean(ttft_first)) / 1e6 if ttft_first else float("nan"),
        by_id=by_id,
        first_byte_by_id=first_by_id,
        arrivals_ns=np.sort(rec.astype(np.int64)),
        chunks_by_arrival=np.array([len(c) for c in cns], dtype=np.int64)[
            np.argsort(rec, kind="stable")
        ],
    )


def find_number(doc: Any, *path_options: Sequence[str]) -> float | None:
    """The first of several key paths that leads to a number in a JSON document."""
    for path in path_options:
        cur = doc
        ok = True
        for key in path:
            if isinstance(cur, dict) and key in cur:
                cur = cur[key]
            elif isinstance(cur, list) and key.isdigit() and int(key) < len(cur):
                cur = cur[int(key)]
            else:
                ok = False
                break
        if ok and isinstance(cur, (int, float)):
            return float(cur)
    return None
