"""Capacity at an SLO: the most load (concurrent agents) per GPU that meets every objective.

``parse_slo('p90_tps>=20,ttft_p99<=2s')``: terms over the index table's per-run figures
(``analysis.points.POINT_FIELDS``); a latency term (``ttft_p99``, ``tpot_p90``, ...) takes
a duration (bare numbers are ms). A load point meets the SLO when the mean of its replicate
runs meets every term. ``find_capacity`` bisects the load axis for every target in lock
step (each step's runs interleaved in a seeded random order), between the experiment's
smallest and largest points, until adjacent probes are one session apart (integer axes) or
5% apart. The answer comes with its uncertainty: the bracket [highest passing probe, lowest
failing probe) and the range where the replicate runs disagreed (some passed, some not).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_replay.analysis.points import POINT_FIELDS
from agent_replay.errors import InputError
from agent_replay.replay.plan import stable_hash
from agent_replay.replay.sweep.experiment import INTEGER_AXES, Experiment
from agent_replay.replay.sweep.runner import Reporter, RunHook, Slot, execute
from agent_replay.replay.sweep.targets import Servers

_TERM = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*([a-z]*)\s*$")
_UNITS_MS = {"": 1.0, "ms": 1.0, "s": 1000.0, "us": 0.001}


@dataclass(frozen=True, slots=True)
class Term:
    column: str
    op: str
    bound: float
    text: str

    def ok(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound


def parse_slo(text: str) -> tuple[Term, ...]:
    """``name>=value`` / ``name<=value`` terms separated by commas."""
    fields = {k: unit for k, unit in POINT_FIELDS}
    terms = []
    for part in text.split(","):
        m = _TERM.match(part.lower())
        if not m:
            raise InputError(f"--slo: {part.strip()!r}: expected NAME>=VALUE or NAME<=VALUE, "
                             "e.g. p90_tps>=20,ttft_p99<=2s")
        name, op, raw, unit = m.groups()
        col = name if name in fields else f"{name}_ms" if f"{name}_ms" in fields else None
        if col is None:
            raise InputError(f"--slo: unknown figure {name!r} (known: "
                             f"{', '.join(k.removesuffix('_ms') for k in fields)})")
        try:
            value = float(raw)
        except ValueError:
            raise InputError(f"--slo: {part.strip()!r}: {raw!r} is not a number") from None
        if fields[col] == "ms":
            if unit not in _UNITS_MS:
                raise InputError(f"--slo: {name}: unit {unit!r} (use ms, s or us)")
            value *= _UNITS_MS[unit]
        elif unit:
            raise InputError(f"--slo: {name}: takes a plain number in {fields[col]}, got unit {unit!r}")
        terms.append(Term(col, op, value, part.strip()))
    return tuple(terms)


def meets(runs: Sequence[Mapping[str, Any]], slo: Sequence[Term]) -> bool:
    """The mean over ``runs`` meets every term (no complete run: it does not)."""
    if not runs:
        return False
    for t in slo:
        vals = [r.get(t.column) for r in runs]
        clean = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
        if len(clean) < len(vals) or not t.ok(float(np.mean(clean)) if clean else None):
            return False
    return True


@dataclass
class Probe:
    point: float
    runs: int
    passed_runs: int
    meets: bool
    means: dict[str, float | None]


@dataclass
class Capacity:
    target: str
    gpus: int
    probes: list[Probe] = field(default_factory=list)
    capacity: float | None = None
    """Highest probed load whose mean meets the SLO (None: not even the lowest)."""
    first_fail: float | None = None
    """Lowest probed load above ``capacity`` that does not (None: the highest probed met it)."""
    disagree: tuple[float, float] | None = None
    """Lowest and highest probe where some repeats met the SLO and some did not."""
    interval: tuple[float | None, float | None] = (None, None)
    """The uncertainty: the highest probe where every run met the SLO, and the highest
    where at least one did (single runs put the capacity anywhere between)."""

    def line(self, axis: str) -> str:
        per = "" if self.capacity is None else f" = {self.capacity / self.gpus:g} per GPU"
        if self.capacity is None:
            head = f"{self.target}: no probed {axis} meets the SLO (lowest probe failed)"
        elif self.first_fail is None:
            head = f"{self.target}: {axis} {self.capacity:g}{per} meets the SLO; the highest point probed, so capacity is at least this"
        else:
            head = (f"{self.target}: capacity {self.capacity:g}{per} ({axis}; between {self.capacity:g} "
                    f"and {self.first_fail:g})")
        lo, hi = self.interval
        if lo != hi or self.disagree is not None:
            head += (f"; uncertainty {'-' if lo is None else f'{lo:g}'} to "
                     f"{'-' if hi is None else f'{hi:g}'}: every run met the SLO up to "
                     f"{'none' if lo is None else f'{lo:g}'}, some run up to "
                     f"{'none' if hi is None else f'{hi:g}'}")
        return head


def _state(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    ok = [p.point for p in probes if p.meets]
    lo = max(ok) if ok else None
    bad = [p.point for p in probes if not p.meets and (lo is None or p.point > lo)]
    return lo, (min(bad) if bad else None)


def _next(lo: float | None, hi: float | None, integer: bool) -> float | None:
    if lo is None or hi is None:
        return None
    if integer:
        return float((int(lo) + int(hi)) // 2) if int(hi) - int(lo) > 1 else None
    return math.sqrt(lo * hi) if hi / lo - 1 > 0.05 else None


def max_runs(exp: Experiment, max_steps: int = 12) -> int:
    """The most runs a capacity search can take: both ends of the load axis, then one point
    per target and round while the bisection narrows (to neighbouring integers on an
    integer axis, to 5% on the others), for every repeat."""
    lo, hi = min(exp.points), max(exp.points)
    if hi <= lo:
        return len(exp.targets) * exp.repeats
    if exp.axis in INTEGER_AXES:
        rounds = math.ceil(math.log2(max(int(hi) - int(lo), 1)))
    else:
        rounds = math.ceil(math.log2(max(math.log(hi / lo) / math.log(1.05), 1.0)))
    rounds = min(rounds, max_steps - 1)
    return len(exp.targets) * exp.repeats * (2 + rounds)


class _Overall:
    """The capacity search's progress lines: each run's line with the round, the runs done
    of the most the search can take, and the time that leaves at most (from the mean run
    so far); the sweep runner's own count restarts every round."""

    def __init__(self, progress: Reporter | None, most: int) -> None:
        self.progress, self.most, self.done, self.round = progress, most, 0, 0
        self.t0 = time.monotonic()

    def __call__(self, line: str) -> None:
        self.done += 1
        per_run = (time.monotonic() - self.t0) / self.done
        left = max(0, self.most - self.done) * per_run
        if self.progress is not None:
            self.progress(f"capacity round {self.round}, run {self.done} of at most {self.most}"
                          f" (at most {left / 60:.0f} min left): {line}")


def find_capacity(exp: Experiment, slo: Sequence[Term], *, rows: dict[tuple[Any, ...], dict[str, Any]],
                  out: Any, servers: Servers, progress: Reporter | None = None,
                  hooks: Sequence[RunHook] = (), timing: dict[str, float] | None = None,
                  max_steps: int = 12) -> list[Capacity]:
    integer = exp.axis in INTEGER_AXES
    lo0, hi0 = min(exp.points), max(exp.points)
    caps = [Capacity(t.name, t.gpus) for t in exp.targets]
    want: dict[int, list[float]] = {i: [lo0, hi0] if hi0 > lo0 else [lo0] for i in range(len(caps))}
    order = 10_000
    most = max_runs(exp, max_steps)
    overall = _Overall(progress, most)
    for step in range(max_steps):
        jobs = [(r, i, pt) for i, pts in want.items() for pt in pts for r in range(exp.repeats)]
        if not jobs:
            break
        rng = np.random.default_rng([exp.seed, step, stable_hash("capacity") & 0xFFFFFFFF])
        # repeat-major, targets and points shuffled within a repeat
        slots = []
        for r in range(exp.repeats):
            these = [j for j in jobs if j[0] == r]
            for k in rng.permutation(len(these)).tolist():
                _, i, pt = these[k]
                slots.append(Slot(order, r, i, pt, "capacity"))
                order += 1
        overall.round = step + 1
        if not execute(exp, slots, servers, rows, out, progress=overall if progress else None,
                       hooks=hooks, timing=timing):
            raise KeyboardInterrupt
        for i, pts in want.items():
            for pt in pts:
                runs = [rows[k] for k in rows if k[0] == "capacity" and k[1] == caps[i].target and k[2] == pt]
                good = [r for r in runs if r["status"] == "complete"]
                passed = sum(1 for r in good if meets([r], slo))
                caps[i].probes.append(Probe(pt, len(runs), passed, meets(good, slo) and len(good) == len(runs),
                                            {t.column: _mean([r.get(t.column) for r in good]) for t in slo}))
        want = {}
        for i, c in enumerate(caps):
            lo, hi = _state(c.probes)
            nxt = _next(lo, hi, integer)
            if nxt is not None and all(p.point != nxt for p in c.probes):
                want[i] = [nxt]
    for c in caps:
        c.capacity, c.first_fail = _state(c.probes)
        mixed = [p.point for p in c.probes if 0 < p.passed_runs < p.runs]
        c.disagree = (min(mixed), max(mixed)) if mixed else None
        every = [p.point for p in c.probes if p.runs and p.passed_runs == p.runs]
        some = [p.point for p in c.probes if p.passed_runs > 0]
        c.interval = (max(every) if every else None, max(some) if some else None)
    return caps


def _mean(vals: Sequence[Any]) -> float | None:
    clean = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
    return float(np.mean(clean)) if clean else None


def to_markdown(caps: Sequence[Capacity], axis: str, slo_text: str) -> str:
    lines = [f"# Capacity at SLO `{slo_text}`", ""]
    lines += [f"- {c.line(axis)}" for c in caps]
    lines += ["", f"| target | {axis} | runs | runs meeting SLO | mean meets | " + " | ".join(
        "mean " + t for t in sorted({k for c in caps for p in c.probes for k in p.means})) + " |"]
    keys = sorted({k for c in caps for p in c.probes for k in p.means})
    lines.append("|" + "---|" * (5 + len(keys)))
    for c in caps:
        for p in sorted(c.probes, key=lambda p: p.point):
            vals = [("-" if p.means.get(k) is None else f"{p.means[k]:,.2f}") for k in keys]
            lines.append(f"| {c.target} | {p.point:g} | {p.runs} | {p.passed_runs} | "
                         f"{'yes' if p.meets else 'no'} | " + " | ".join(vals) + " |")
    lines.append("")
    lines.append("A load meets the SLO when the mean of its replicate runs meets every term "
                 "and none of them failed. Per GPU = load / the target's GPUs.")
    return "\n".join(lines) + "\n"
