"""Self-measurement: is the load generator itself the bottleneck?

* schedule lag (s - S) of every request, kept by the driver;
* event-loop lag: a watchdog task asks to wake every ``interval`` and records how late it
  woke (includes the timer's own 0-1 ms wake-up jitter);
* the process's CPU use over the run.

``verdict`` turns them into the one self-check policy's verdict (``analysis.selfcheck``),
printed on the first line of the output.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


class LoopWatchdog:
    """Event-loop lag: how late a plain loop timer fires, every ``interval_ns``. It sleeps on
    the loop's own timer, not on the run's Clock, on purpose: its subject is the loop's
    lateness, which the Clock's re-check after waking would hide."""

    def __init__(self, interval_ns: int = 10_000_000) -> None:
        self.interval_ns = interval_ns
        self.lags = array("q")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        now = time.monotonic_ns
        interval = self.interval_ns / 1e9
        while True:
            expected = now() + self.interval_ns
            await asyncio.sleep(interval)
            self.lags.append(max(0, now() - expected))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def reserve_fds(limit: int = 65536) -> int:
    """Raise the soft open-files limit towards ``limit`` (never past the hard limit) and
    grow this process's file-descriptor table to that size now, before the run; returns
    the size reserved (0 where there is no such limit).

    The kernel grows a process's fd table by doubling when a new descriptor does not fit
    (64, 128, 256, ...), and in a process with more than one thread each growth waits for an
    RCU grace period (``synchronize_rcu`` in ``expand_fdtable``). The thread that asked,
    here the event loop opening a connection, is stopped meanwhile, for milliseconds to tens
    of milliseconds (benchmarks/journal/2026-11-30-workers-on-one-host.md). A table grown beforehand never shrinks, so those calls never wait
    again.
    """
    try:
        import fcntl
        import resource
    except ImportError:  # not a Unix
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    size = min(soft, limit) if soft != resource.RLIM_INFINITY else limit
    if size > 64:
        fd = os.open(os.devnull, os.O_RDONLY)
        try:
            os.close(fcntl.fcntl(fd, fcntl.F_DUPFD, size - 1))  # the lowest free fd >= size - 1
        except OSError:
            size = 0
        finally:
            os.close(fd)
    return size


class QuietRuntime:
    """The interpreter's own pauses kept off the measuring window.

    * Cyclic GC: before the run, everything built so far (plan, prepared bodies, imports)
      is collected once and frozen (``gc.freeze``: never scanned again), and automatic
      collection is switched off. ``young()``, called by the worker's 0.5 s ticker, runs
      a generation-0/1 collection once ``young_threshold`` tracked objects have been
      created (net) since the last one, never a full collection of every live object
      landing on a burst. The replay itself makes almost no cyclic garbage (the closed
      connections), so at the default threshold a run of that kind never collects, where a
      collection every tick stalls the loop for nothing (benchmarks/journal/2026-11-29-client-performance.md); a workload that does make
      cycles is collected once they reach the threshold (a bounded memory cost).
      Cyclic garbage that survives a young collection waits for ``exit``: a collection of
      the objects made during the run, run before the rest is unfrozen (a process that
      holds much more, such as a sweep's, is not scanned whole at every run's end); its
      count is reported (``gc_end_collected``).
    * GIL hand-over: while the result-writer thread converts rows to Arrow it holds the
      GIL; the loop thread gets it back after at most ``switch_interval_s`` (CPython's
      default is 5 ms, i.e. up to 5 ms late chunk timestamps per hand-over).

    ``exit`` restores the interpreter's settings (the same process may run again).
    """

    def __init__(self, switch_interval_s: float = 0.0005, young_threshold: int = 100_000) -> None:
        self.switch_interval_s = switch_interval_s
        self.young_threshold = young_threshold
        self._old_switch: float | None = None
        self._was_enabled = True
        self.young_collections = 0
        self.young_ns = array("q")
        self.end_collected = 0
        self.end_ns = 0

    def enter(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        self._old_switch = sys.getswitchinterval()
        sys.setswitchinterval(self.switch_interval_s)

    def young(self) -> None:
        if gc.get_count()[0] < self.young_threshold:
            return
        t = time.perf_counter_ns()
        gc.collect(1)
        self.young_ns.append(time.perf_counter_ns() - t)
        self.young_collections += 1

    def exit(self) -> None:
        if self._old_switch is None:
            return
        sys.setswitchinterval(self._old_switch)
        self._old_switch = None
        t = time.perf_counter_ns()
        self.end_collected = gc.collect()  # the run's objects only: the rest is still frozen
        self.end_ns = time.perf_counter_ns() - t
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def stats(self) -> dict[str, int]:
        y = (
            np.frombuffer(self.young_ns, dtype=np.int64)
            if len(self.young_ns)
            else np.zeros(1, np.int64)
        )
        return {
            "gc_young_collections": self.young_collections,
            "gc_young_p99_ns": int(np.percentile(y, 99, method="higher")),
            "gc_young_max_ns": int(y.max()),
            "gc_end_collected": self.end_collected,
            "gc_end_ns": self.end_ns,
        }


STALL_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100)


def stall_distribution(
    loop_lag: Sequence[int] | np.ndarray,
    interval_ns: int = 10_000_000,
) -> dict[str, int | float | None]:
    """The watchdog's lag samples as a distribution for run.json: count, p50/p90/p99/
    p99.9/max (ns), and how many ticks were later than each of ``STALL_BOUNDS_MS``."""
    arr = np.asarray(loop_lag, dtype=np.int64)
    out: dict[str, int | float | None] = {"ticks": int(arr.size), "interval_ns": interval_ns}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99_9", 99.9), ("max", 100)):
        out[f"{name}_ns"] = pct(arr, q)
    for b in STALL_BOUNDS_MS:
        out[f"over_{b}ms"] = int((arr > b * 1_000_000).sum())
    return out


class CpuMeter:
    """Process CPU time (user + system, all threads) over a wall interval."""

    def __init__(self) -> None:
        self.t_wall = time.monotonic_ns()
        t = os.times()
        self.t_cpu = t.user + t.system

    def fraction(self) -> float:
        """CPU seconds per wall second since creation (1.0 = one core busy)."""
        wall = (time.monotonic_ns() - self.t_wall) / 1e9
        t = os.times()
        return ((t.user + t.system) - self.t_cpu) / wall if wall > 0 else 0.0

    def cpu_s(self) -> float:
        t = os.times()
        return (t.user + t.system) - self.t_cpu


def pct(values: Sequence[int] | np.ndarray, q: float) -> int | None:
    """Nearest-rank percentile (``analysis.hist.rank``, the one rule of every report)."""
    from agent_replay.analysis.hist import rank

    arr = np.asarray(values, dtype=np.int64)
    if arr.size == 0:
        return None
    k = rank(q, int(arr.size)) - 1
    return int(np.partition(arr, k)[k])


@dataclass
class SelfReport:
    schedule_lag_p50_ns: int | None = None
    schedule_lag_p99_ns: int | None = None
    schedule_lag_max_ns: int | None = None
    loop_lag_p99_ns: int | None = None
    loop_lag_max_ns: int | None = None
    cpu_fraction: float = 0.0
    warnings: list[str] = field(default_factory=list)
    schedule_lag_n: int = 0
    loop_lag_n: int = 0
    kind: str = "ok"
    """``analysis.selfcheck``: ok, saturated, contention or stall."""
    line: str | None = None
    machine: dict[str, Any] | None = None


def verdict(
    schedule_lag: Sequence[int] | np.ndarray,
    loop_lag: Sequence[int] | np.ndarray,
    cpu_fraction: float,
    mode: str = "session",
    machine: Any = None,
) -> SelfReport:
    """Percentiles and the self-check policy's verdict (``analysis.selfcheck.assess``).
    Pure: tested on hand-made samples. ``machine``: an ``analysis.selfcheck.Machine``."""
    from agent_replay.analysis.selfcheck import assess

    r = SelfReport(
        schedule_lag_p50_ns=pct(schedule_lag, 50),
        schedule_lag_p99_ns=pct(schedule_lag, 99),
        schedule_lag_max_ns=pct(schedule_lag, 100),
        loop_lag_p99_ns=pct(loop_lag, 99),
        loop_lag_max_ns=pct(loop_lag, 100),
        cpu_fraction=cpu_fraction,
        schedule_lag_n=len(schedule_lag),
        loop_lag_n=len(loop_lag),
        machine=None if machine is None else asdict(machine),
    )
    a = assess(
        schedule_lag_p99_ns=r.schedule_lag_p99_ns,
        schedule_lag_n=r.schedule_lag_n,
        loop_lag_p99_ns=r.loop_lag_p99_ns,
        loop_lag_n=r.loop_lag_n,
        cpu_fraction=cpu_fraction,
        machine=machine,
        mode=mode,
    )
    r.kind, r.line = a.kind, a.line
    if a.line:
        r.warnings.append(a.line)
    return r
