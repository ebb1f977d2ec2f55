"""The newest GPU figures for the live dashboard, in shared memory: the sampler process
writes one aggregate per read (``GpuGauges.write``), the dashboard's process reads it and
shows ``line()``. Nothing is queued or pickled per read.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

from agent_replay.engines.telemetry.backends import Row

NAMES = (
    "gpus",
    "util_pct",
    "sm_active_pct",
    "power_w",
    "energy_j",
    "mem_used_gib",
    "mem_total_gib",
    "temp_max_c",
)
_UTIL, _SM, _MEM, _MEMTOT, _POWER, _ENERGY, _TEMP = 2, 3, 6, 7, 8, 9, 10  # Row positions


def aggregate(rows: Sequence[Row], energy0_mj: float | None) -> dict[str, float]:
    """One read of every GPU as the dashboard's figures: mean utilization and SM activity,
    total power and memory, hottest GPU, and the energy (J) since ``energy0_mj`` (the sum of
    the counters at the first read)."""

    def vals(i: int) -> list[float]:
        return [float(r[i]) for r in rows if r[i] is not None]

    def mean(v: list[float]) -> float:
        return sum(v) / len(v) if v else math.nan

    def total(v: list[float]) -> float:
        return sum(v) if v else math.nan

    energy = vals(_ENERGY)
    return {
        "gpus": float(len(rows)),
        "util_pct": mean(vals(_UTIL)),
        "sm_active_pct": mean(vals(_SM)),
        "power_w": total(vals(_POWER)),
        "energy_j": (sum(energy) - energy0_mj) / 1000
        if energy0_mj is not None and len(energy) == len(rows)
        else math.nan,
        "mem_used_gib": total(vals(_MEM)) / 2**30,
        "mem_total_gib": total(vals(_MEMTOT)) / 2**30,
        "temp_max_c": max(vals(_TEMP), default=math.nan),
    }


def line(g: dict[str, float]) -> str:
    """``GPU 8x: util 73% (SM 61%)  power 5,431 W  energy 1.23 MJ  memory 610/1,128 GiB
    max 67 C``, leaving out what the source does not have."""
    if not g or not g.get("gpus"):
        return ""
    parts = [part(g) for key, part in _LINE_PARTS if _has(g, key)]
    return f"GPU {g['gpus']:.0f}x: " + "  ".join(parts)


def _has(g: dict[str, float], k: str) -> bool:
    return k in g and not math.isnan(g[k])


def _util_part(g: dict[str, float]) -> str:
    sm = f" (SM {g['sm_active_pct']:.0f}%)" if _has(g, "sm_active_pct") else ""
    return f"util {g['util_pct']:.0f}%{sm}"


def _energy_part(g: dict[str, float]) -> str:
    e = g["energy_j"]
    if e >= 1e6:
        return f"energy {e / 1e6:,.2f} MJ"
    return f"energy {e / 1e3:,.1f} kJ" if e >= 1e3 else f"energy {e:,.0f} J"


def _memory_part(g: dict[str, float]) -> str:
    total = f"/{g['mem_total_gib']:,.0f}" if _has(g, "mem_total_gib") else ""
    return f"memory {g['mem_used_gib']:,.0f}{total} GiB"


_LINE_PARTS: tuple[tuple[str, Callable[[dict[str, float]], str]], ...] = (
    ("util_pct", _util_part),
    ("power_w", lambda g: f"power {g['power_w']:,.0f} W"),
    ("energy_j", _energy_part),
    ("mem_used_gib", _memory_part),
    ("temp_max_c", lambda g: f"max {g['temp_max_c']:.0f} C"),
)
"""The parts of ``line``, each shown when the gauges have its key."""


class GpuGauges:
    """Made in the parent, handed to the sampler process (writer) and the dashboard process
    (reader)."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._values: Any = ctx.Array("d", [math.nan] * len(NAMES))
        self._seq: Any = ctx.Value("q", 0)

    def write(self, g: dict[str, float]) -> None:
        with self._values.get_lock():
            for i, name in enumerate(NAMES):
                self._values[i] = g.get(name, math.nan)
        with self._seq.get_lock():
            self._seq.value += 1

    def read(self) -> tuple[int, dict[str, float]]:
        """(writes so far, the newest figures)."""
        with self._values.get_lock():
            vals = self._values[:]
        return self._seq.value, dict(zip(NAMES, vals, strict=True))

    def line(self) -> tuple[int, str]:
        """(writes so far, the dashboard's GPU line; empty before the first read)."""
        n, g = self.read()
        return n, line(g) if n else ""
