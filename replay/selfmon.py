"""Self-measurement: is the load generator itself the bottleneck?

* schedule lag (s - S) of every request, kept by the driver;
* event-loop lag: a watchdog task asks to wake every ``interval`` and records how late it
  woke (includes the timer's own 0-1 ms wake-up jitter);
* the process's CPU use over the run.

``verdict`` turns them into warnings, printed on the first line of the output.
"""

from __future__ import annotations

import asyncio
import os
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SCHEDULE_LAG_P99_NS = 2_000_000
LOOP_LAG_P99_NS = 5_000_000
CPU_LIMIT = 0.90


class LoopWatchdog:
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
    arr = np.asarray(values, dtype=np.int64)
    if arr.size == 0:
        return None
    return int(np.percentile(arr, q, method="higher"))


@dataclass
class SelfReport:
    schedule_lag_p50_ns: int | None = None
    schedule_lag_p99_ns: int | None = None
    schedule_lag_max_ns: int | None = None
    loop_lag_p99_ns: int | None = None
    loop_lag_max_ns: int | None = None
    cpu_fraction: float = 0.0
    warnings: list[str] = field(default_factory=list)


def verdict(schedule_lag: Sequence[int] | np.ndarray, loop_lag: Sequence[int] | np.ndarray,
            cpu_fraction: float, mode: str = "session") -> SelfReport:
    """Percentiles and warnings. Pure: tested on hand-made samples."""
    r = SelfReport(
        schedule_lag_p50_ns=pct(schedule_lag, 50), schedule_lag_p99_ns=pct(schedule_lag, 99),
        schedule_lag_max_ns=pct(schedule_lag, 100), loop_lag_p99_ns=pct(loop_lag, 99),
        loop_lag_max_ns=pct(loop_lag, 100), cpu_fraction=cpu_fraction)
    if mode != "max-rate" and r.schedule_lag_p99_ns is not None and r.schedule_lag_p99_ns > SCHEDULE_LAG_P99_NS:
        r.warnings.append(
            f"schedule lag p99 {r.schedule_lag_p99_ns / 1e6:.1f} ms > {SCHEDULE_LAG_P99_NS / 1e6:.0f} ms: "
            "requests left late; use more --workers or a faster machine")
    if r.loop_lag_p99_ns is not None and r.loop_lag_p99_ns > LOOP_LAG_P99_NS:
        r.warnings.append(
            f"event-loop lag p99 {r.loop_lag_p99_ns / 1e6:.1f} ms > {LOOP_LAG_P99_NS / 1e6:.0f} ms: "
            "chunk timestamps are late; use more --workers")
    if cpu_fraction > CPU_LIMIT:
        r.warnings.append(f"load generator CPU {cpu_fraction * 100:.0f}% of a core: it may be "
                          "the bottleneck; use more --workers")
    return r
