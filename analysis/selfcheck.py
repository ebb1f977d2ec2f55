"""The one self-check policy: was the load generator the bottleneck, was the host busy with
other work, or neither? The run line, the dashboard and the report all call ``assess``, so
they say the same thing with the same thresholds, once.

Symptoms: schedule lag P99 (requests left late; not in max-rate timing, where waiting for
a slot is the design) or event-loop lag P99 (chunk timestamps late) above ``LAG_P99_NS``,
each only with at least ``MIN_SAMPLES`` samples behind the P99. Causes, in order:

* saturated: our busiest worker used at least ``CPU_SATURATED`` of a core (with a symptom),
  or ``CPU_BUSY`` without one. The load generator set the pace: more ``--workers`` help.
* contention: a symptom while our CPU was low, and the host was busy with other processes
  (their CPU at least ``OTHERS_BUSY`` of the host's cores) or the hypervisor stole at least
  ``STEAL`` of the CPU time. More workers would not help; a quieter host or CPUs of our own
  (``--cpus``) would.
* stall: a symptom with neither: the loop was held up by something other than load (a
  blocking call, the timer, I/O). More workers would not help either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agent_replay.runmeta import RunMeta

LAG_P99_NS = 5_000_000
MIN_SAMPLES = 100
CPU_SATURATED = 0.85
CPU_BUSY = 0.95
OTHERS_BUSY = 0.5
STEAL = 0.05


@dataclass(frozen=True, slots=True)
class Machine:
    """The host over the run: its CPUs, the cores busy on average (every process), the share
    of CPU time stolen by the hypervisor, and the cores our own processes used."""

    cpus: int
    busy_cores: float
    steal: float
    ours_cores: float

    @property
    def others_cores(self) -> float:
        return max(0.0, self.busy_cores - self.ours_cores)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Machine | None:
        if not d:
            return None
        try:
            return cls(
                int(d["cpus"]), float(d["busy_cores"]), float(d["steal"]), float(d["ours_cores"])
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Assessment:
    kind: str  # ok, saturated, contention, stall
    line: str | None

    @property
    def bottleneck(self) -> bool:
        return self.kind == "saturated"

    @property
    def contention(self) -> bool:
        return self.kind == "contention"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class MachineMeter:
    """The host's CPU since creation (psutil's system-wide times): cores busy on average and
    the share stolen by the hypervisor; ``machine(ours_cpu_s)`` subtracts our own use."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.t0 = time.monotonic()
        self.c0 = psutil.cpu_times()

    def machine(self, ours_cpu_s: float) -> Machine:
        c1 = self._psutil.cpu_times()
        wall = max(time.monotonic() - self.t0, 1e-9)
        d = {k: getattr(c1, k) - getattr(self.c0, k) for k in c1._fields}
        total = sum(d.values())
        idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
        steal = d.get("steal", 0.0)
        busy = max(0.0, total - idle - steal)
        return Machine(
            cpus=os.cpu_count() or 1,
            busy_cores=busy / wall,
            steal=steal / total if total > 0 else 0.0,
            ours_cores=ours_cpu_s / wall,
        )


def host_busy(machine: Machine) -> bool:
    """Whether other processes kept the host busy (at least ``OTHERS_BUSY`` of its CPUs) or
    the hypervisor stole at least ``STEAL`` of its CPU time: the cause of ``contention``."""
    return machine.steal >= STEAL or machine.others_cores >= OTHERS_BUSY * machine.cpus


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def assess(
    *,
    schedule_lag_p99_ns: float | None,
    schedule_lag_n: int,
    loop_lag_p99_ns: float | None,
    loop_lag_n: int,
    cpu_fraction: float,
    machine: Machine | None = None,
    mode: str = "session",
) -> Assessment:
    """The verdict and its one line (None when all is well). ``cpu_fraction``: the busiest
    worker's CPU seconds per wall second (1.0 = one core)."""
    symptoms = []
    if mode != "max-rate":
        symptoms += _lag("schedule lag", schedule_lag_p99_ns, schedule_lag_n)
    symptoms += _lag("event-loop lag", loop_lag_p99_ns, loop_lag_n)
    cpu = f"{cpu_fraction * 100:.0f}% of a core"
    bound = f"> {_ms(LAG_P99_NS)}"
    if cpu_fraction >= CPU_BUSY or (symptoms and cpu_fraction >= CPU_SATURATED):
        what = ", ".join(symptoms) + f" ({bound}) " if symptoms else ""
        return Assessment(
            "saturated",
            f"load generator saturated: {what}at CPU {cpu}: it may "
            "have set the pace instead of the server; use more --workers",
        )
    if not symptoms:
        return Assessment("ok", None)
    return _lag_cause(", ".join(symptoms) + f" ({bound})", cpu, machine)


def _lag(name: str, p99_ns: float | None, n: int) -> list[str]:
    """The symptom a lag's P99 over enough samples shows when it is over the bound."""
    if n >= MIN_SAMPLES and p99_ns is not None and p99_ns > LAG_P99_NS:
        return [f"{name} p99 {_ms(p99_ns)}"]
    return []


def _lag_cause(lags: str, cpu: str, machine: Machine | None) -> Assessment:
    """Lags while our CPU was not saturated: the host's contention when it was busy, else
    a stall of the loop."""
    if machine is not None and host_busy(machine):
        return Assessment(
            "contention",
            (
                f"host contention: {lags} while our CPU was {cpu} and other processes kept "
                f"{machine.others_cores:.1f} of {machine.cpus} CPUs busy (steal "
                f"{machine.steal * 100:.0f}%): timings may be late by that much; run on a quieter "
                "host or give the replay CPUs of its own (--cpus); more --workers would not help"
            ),
        )
    host = (
        ""
        if machine is None
        else (
            f" and the host not busy ({machine.others_cores:.1f} of "
            f"{machine.cpus} CPUs used by others)"
        )
    )
    return Assessment(
        "stall",
        (
            f"{lags} with our CPU at {cpu}{host}: the loop was held up by something other than "
            "its load (a blocking call, the timer, I/O); more --workers would not help"
        ),
    )


def assess_meta(
    meta: RunMeta | Mapping[str, Any],
    schedule_lag_p99_ns: float | None,
    schedule_lag_n: int,
    mode: str | None = None,
) -> Assessment | None:
    """``assess`` for a finished run: the loop lag, CPU and host figures run.json keeps, with
    the schedule lag from the run's rows. None for a run.json without a self-check."""
    meta = RunMeta.of(meta)
    sc = meta.self_check
    if sc is None:
        return None
    return assess(
        schedule_lag_p99_ns=schedule_lag_p99_ns,
        schedule_lag_n=schedule_lag_n,
        loop_lag_p99_ns=sc.loop_lag_p99_ns,
        loop_lag_n=int(sc.loop_lag_n or meta.loop_stalls.get("ticks") or 0),
        cpu_fraction=float(sc.cpu_fraction or 0.0),
        machine=Machine.from_dict(sc.machine),
        mode=mode or meta.timing,
    )
