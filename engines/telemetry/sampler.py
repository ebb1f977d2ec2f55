"""The sampling loop: a backend read every ``interval_s`` on an injected clock, rows kept as
values, and the loop's own cost (samples per second, CPU time, time per sample).

``Sampler.run(wait)`` is blocking and single-threaded: it belongs in a process of its own
(``engines.telemetry.process``), never on a measuring event loop. ``wait(timeout_s)``
sleeps until the next tick and returns True when the loop should stop (a
``multiprocessing.Event.wait`` in the sampler process; a fake clock's step in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from agent_replay.engines.telemetry.backends import Backend, Row
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA


@dataclass(slots=True)
class SamplerCost:
    """What the sampler itself cost: ``samples`` (backend reads that succeeded, each one row
    per GPU), ``errors``, ``missed`` ticks (a read overran the interval), wall and CPU
    seconds of the loop, and the time one read took."""

    samples: int = 0
    errors: int = 0
    missed: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    read_ns_total: int = 0
    read_ns_max: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        wall = self.wall_s
        return {
            "samples": self.samples,
            "errors": self.errors,
            "missed_ticks": self.missed,
            "wall_s": round(wall, 3),
            "cpu_s": round(self.cpu_s, 4),
            "samples_per_s": round(self.samples / wall, 3) if wall > 0 else None,
            "cpu_percent": round(100 * self.cpu_s / wall, 3) if wall > 0 else None,
            "read_ms_mean": round(self.read_ns_total / self.samples / 1e6, 4)
            if self.samples
            else None,
            "read_ms_max": round(self.read_ns_max / 1e6, 4),
            "last_error": self.last_error,
        }


@dataclass
class Sampler:
    backend: Backend
    interval_s: float = 0.1
    clock_ns: Callable[[], int] = time.monotonic_ns
    cpu_s: Callable[[], float] = time.process_time
    on_sample: Callable[[int, list[Row]], None] | None = None
    """Called with each read's time and rows (the dashboard's gauges)."""
    sink: Callable[[list[tuple[Any, ...]]], bool] | None = None
    """Takes the rows kept so far once there are ``flush_rows`` of them (e.g. writes them
    as a Parquet row group); True: they are written and are dropped here."""
    flush_rows: int = 65_536
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rows_flushed: int = 0
    cost: SamplerCost = field(default_factory=SamplerCost)

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")

    def sample_once(self) -> bool:
        """One backend read, stamped with the middle of the read; a failed read is counted
        and skipped."""
        before = self.clock_ns()
        try:
            rows = self.backend.sample()
        except Exception as exc:  # a flaky exporter or driver call: count it, keep going
            self.cost.errors += 1
            self.cost.last_error = f"{type(exc).__name__}: {exc}"
            return False
        after = self.clock_ns()
        t = before + (after - before) // 2
        self.rows.extend((t, *r) for r in rows)
        self.cost.samples += 1
        self.cost.read_ns_total += after - before
        self.cost.read_ns_max = max(self.cost.read_ns_max, after - before)
        if self.on_sample is not None:
            self.on_sample(t, rows)
        if self.sink is not None and len(self.rows) >= self.flush_rows and self.sink(self.rows):
            self.rows_flushed += len(self.rows)
            self.rows = []
        return True

    def run(self, wait: Callable[[float], bool]) -> None:
        """Read now, then every ``interval_s`` until ``wait`` says stop, then read once more
        (the last sample closes the run's window)."""
        interval = int(self.interval_s * 1e9)
        wall0, cpu0 = self.clock_ns(), self.cpu_s()
        next_ns = wall0
        try:
            while True:
                self.sample_once()
                next_ns += interval
                now = self.clock_ns()
                if next_ns < now:  # a slow read: skip the missed ticks, keep the cadence
                    self.cost.missed += (now - next_ns) // interval + 1
                    next_ns += ((now - next_ns) // interval + 1) * interval
                if wait((next_ns - now) / 1e9):
                    break
            self.sample_once()
        finally:
            self.cost.wall_s += (self.clock_ns() - wall0) / 1e9
            self.cost.cpu_s += self.cpu_s() - cpu0

    def table(self, t0_ns: int = 0, rows: list[tuple[Any, ...]] | None = None) -> pa.Table:
        """The rows kept (or ``rows``), ``t_ns`` as an offset from ``t0_ns`` (the run's t0)."""
        rows = self.rows if rows is None else rows
        cols: list[Any] = (
            list(zip(*rows, strict=True)) if rows else [()] * len(GPU_TELEMETRY_SCHEMA)
        )
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, GPU_TELEMETRY_SCHEMA, strict=True)]
        if t0_ns:
            arrays[0] = pa.array([t - t0_ns for t in cols[0]], type=pa.int64())
        return pa.Table.from_arrays(arrays, schema=GPU_TELEMETRY_SCHEMA)
