"""The measuring harness shared by the peer benchmarks: the simulated engine pinned to one
core with ground truth on, a client pinned to the other core, the client's CPU sampled over
its whole process tree, and the ground truth's own figures.

Method (the same for every client): the server records ``monotonic_ns`` when each request
arrived and right after each chunk was written. The window is from the first arrival to
the last chunk written. A client's CPU is the user+system time of all its processes,
sampled every 0.2 s and interpolated to that window, so start-up (imports, tokenizer
loading) is not counted. CPU per chunk = that CPU / chunks the server wrote in the window.
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
from dataclasses import dataclass, field
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
    base.update(name=path.stem, model_name=MODEL, decode_base_ns=int(interval_ms * 1e6),
                decode_per_seq_ns=0, decode_per_ctx_token_ns=0.0, eos_prob=0.0,
                prefill_tokens_per_s=5e6, max_num_seqs=1024, spin_ns=1_000_000,
                num_speculative_tokens=spec_tokens,
                spec_acceptance=[0.8, 0.6, 0.5][:spec_tokens])
    path.write_text(json.dumps(base))
    return path


@contextlib.contextmanager
def sim_server(profile: Path, gt: Path, core: str, kernel_arrival: bool = False) -> Iterator[str]:
    """The engine on ``core``; yields its URL; on exit it is stopped (SIGTERM) and has
    written its ground truth to ``gt``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = pinned(core, [sys.executable, "-m", "agent_replay.engines.sim", "--port", "0", "--profile",
                        str(profile), "--ground-truth", str(gt), "--force"]
                 + (["--kernel-arrival"] if kernel_arrival else []))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
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


class TreeCpu:
    """Samples user+system CPU seconds of a process and all its descendants (dead ones keep
    their last reading) every ``period`` seconds, against ``time.monotonic_ns()``."""

    def __init__(self, pid: int, period: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.period = period
        self.samples: list[tuple[int, float]] = []
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeCpu:
        self._thread.start()
        return self

    def _read(self) -> float:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                self._last[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return sum(self._last.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic_ns(), self._read()))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: int, t1: int) -> float:
        """CPU seconds used between two monotonic instants (linear interpolation)."""
        if len(self.samples) < 2:
            return float("nan")
        ts = np.array([s[0] for s in self.samples], dtype=np.float64)
        cpu = np.array([s[1] for s in self.samples])
        return float(np.interp(t1, ts, cpu) - np.interp(t0, ts, cpu))


@dataclass
class ClientRun:
    rc: int
    wall_s: float
    cpu: TreeCpu
    log: str


def run_client(cmd: Sequence[str], core: str, env: dict[str, str], log: Path,
               timeout: float = 600) -> ClientRun:
    t = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(pinned(core, cmd), stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        cpu = TreeCpu(proc.pid).start()
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        cpu.stop()
    return ClientRun(rc, time.monotonic() - t, cpu, log.read_text(errors="replace")[-3000:])


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

    @property
    def window_s(self) -> float:
        return (self.t1 - self.t0) / 1e9


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
    first = (t.column("first_byte_ns").to_numpy(zero_copy_only=False)
             if "first_byte_ns" in t.column_names else None)
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
        requests=len(ids), chunks=int(sum(len(c) for c in cns)),
        tokens=int(sum(sum(k) for k in ctk)), t0=int(rec.min()) if len(rec) else 0, t1=t1,
        chunk_gap_p50_ms=float(np.percentile(g, 50)) / 1e6 if g.size else float("nan"),
        chunk_gap_p99_ms=float(np.percentile(g, 99)) / 1e6 if g.size else float("nan"),
        itl_mean_ms=float((itl * w).sum() / w.sum()) / 1e6 if w.size else float("nan"),
        itl_p99_ms=weighted_pct(itl, w, 99) / 1e6,
        ttft_mean_ms=float(np.mean(ttft)) / 1e6 if ttft else float("nan"),
        ttft_first_read_mean_ms=float(np.mean(ttft_first)) / 1e6 if ttft_first else float("nan"),
        by_id=by_id, first_byte_by_id=first_by_id)


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
