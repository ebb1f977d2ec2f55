"""Pinning worker processes to CPUs (Linux).

A load generator's lag is mostly scheduling: a worker that shares its core with another busy
process (an engine on the same host, another worker, a hyperthread sibling) waits for it.
``--cpus`` gives each local worker a CPU of its own:

- ``auto``: one CPU per physical core (the first hyperthread of each), among the CPUs this
  process may use, in order; worker k gets the k-th. Sibling threads are left out, so two
  workers never share a core's execution units.
- a list, ``2,4,6-9``: worker k gets the k-th CPU listed.

Only a worker's event-loop thread runs on its CPU: its helper threads (the result writer,
which encodes Parquet outside the GIL) call ``helper_thread`` and run on the CPUs no worker
got, as do the run's other processes (the parent, the dashboard, the /metrics scraper). A
helper thread on the loop's own CPU would take it for whole scheduler slices (ms).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from agent_replay.errors import InputError

_SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str, what: str = "--cpus") -> list[int]:
    """``"0,2,4-6"`` -> ``[0, 2, 4, 5, 6]`` (order kept, duplicates refused)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise InputError(f"{what}: empty item in {text!r}")
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise InputError(
                f"{what}: {part!r} is not a CPU number or range (like 2 or 4-7)"
            ) from None
        if a < 0 or b < a:
            raise InputError(f"{what}: bad range {part!r}")
        out.extend(range(a, b + 1))
    if len(set(out)) != len(out):
        raise InputError(f"{what}: a CPU is listed twice in {text!r}")
    return out


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where affinity is not supported)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def siblings(cpu: int, sys_cpu: Path = _SYS_CPU) -> list[int]:
    """The CPUs of ``cpu``'s physical core (hyperthreads), ``cpu`` included."""
    f = sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return parse_cpu_list(f.read_text().strip(), str(f))
    except (OSError, InputError):
        return [cpu]


def one_per_core(cpus: Iterable[int], sys_cpu: Path = _SYS_CPU) -> list[int]:
    """The first CPU of each physical core among ``cpus`` (hyperthread siblings dropped)."""
    chosen: list[int] = []
    taken: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in taken:
            continue
        chosen.append(cpu)
        taken.update(siblings(cpu, sys_cpu))
        taken.add(cpu)
    return chosen


def worker_cpus(spec: str, n: int, sys_cpu: Path = _SYS_CPU) -> list[int]:
    """The CPU of each of ``n`` workers for ``--cpus spec``; an error when there are fewer
    CPUs than workers or a listed CPU is not allowed."""
    allowed = allowed_cpus()
    if spec == "auto":
        cpus = one_per_core(allowed, sys_cpu)
        if len(cpus) < n:
            raise InputError(
                f"--cpus auto: {n} workers but {len(cpus)} physical cores available "
                f"(CPUs {_fmt(allowed)}); use fewer workers or list CPUs"
            )
    else:
        cpus = parse_cpu_list(spec)
        bad = [c for c in cpus if c not in allowed]
        if bad:
            raise InputError(
                f"--cpus: CPU {bad[0]} is not available to this process (allowed: {_fmt(allowed)})"
            )
        if len(cpus) < n:
            raise InputError(f"--cpus lists {len(cpus)} CPUs for {n} workers")
    return cpus[:n]


def rest_cpus(workers: Iterable[int]) -> list[int]:
    """The allowed CPUs no worker got (empty when the workers took them all)."""
    used = set(workers)
    return [c for c in allowed_cpus() if c not in used]


_helpers: frozenset[int] | None = None


def pin_loop_thread(cpus: list[int] | tuple[int, ...], index: int) -> None:
    """Pin the calling thread (worker ``index``'s event loop) to ``cpus[index]``, ``cpus``
    being every worker's; threads that call ``helper_thread`` later run on the CPUs this
    process had, less every worker's (all of them when nothing is left)."""
    global _helpers
    _helpers = frozenset(rest_cpus(cpus) or allowed_cpus())
    pin([cpus[index]])


def helper_thread() -> None:
    """A worker's helper thread calls this first: off the loop thread's CPU when pinned."""
    if _helpers is not None:
        pin(_helpers)


def pin(cpus: Iterable[int]) -> None:
    """Confine the calling process (and the threads and processes it starts later)."""
    cpus = set(cpus)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def kept_affinity() -> Iterator[None]:
    """Put the calling thread's CPU set back as it was on leaving the block."""
    global _helpers
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        _helpers = None
        if before is not None:
            os.sched_setaffinity(0, before)


def _fmt(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if len(cpus) <= 16 else f"{cpus[0]}-{cpus[-1]} ({len(cpus)})"
