"""Capacity at an SLO: the most load (concurrent agents) per GPU that meets every objective.

``parse_slo('p90_tps>=20,ttft_p99<=2s')``: terms over the index table's per-run figures
(``analysis.points.POINT_FIELDS``); a latency term (``ttft_p99``, ``tpot_p90``, ...) takes
a duration (bare numbers are ms). A load point meets the SLO when the mean of its replicate
runs (``analysis.replicates.mean_ci``) meets every term and none failed.

Capacity means the server, not the trace's idle time, set the limit, so the search:

* runs only on a load the server paces: sessions at once (each session's turns back to
  back but for their think times), requests in flight (closed loop) or session arrivals
  per second; not ``speedup``, where the trace's own timing sets the load;
* makes each run long enough for ``MIN_TURNS`` turns per session at the trace's median
  turn period (``run_length``), or the experiment's ``duration_s`` when that is longer;
* raises the top of the range (doubling, ``expand`` times at most) while the highest probe
  still meets the SLO, so that the answer is a load that fails, not the end of the file's
  range;
* bisects between the highest passing and the lowest failing probe for every target in
  lock step (each step's runs interleaved, targets in a rotated order), until adjacent
  probes are one apart (integer axes) or 5% apart;
* runs the bracket's two ends again (``repeats`` more runs each) and widens the bracket by
  the run-to-run spread: a load surely meets when the 95% interval of every term's mean is
  on the right side of its bound, surely fails when one term's is wholly on the wrong side.

The answer holds for the host's load during the search: the runs with host contention are
counted beside it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_replay.analysis.hist import FEW, min_count_for, rank
from agent_replay.analysis.points import POINT_FIELDS, too_few
from agent_replay.analysis.replicates import mean_ci
from agent_replay.errors import InputError
from agent_replay.replay.plan import stable_hash
from agent_replay.replay.sweep.experiment import INTEGER_AXES, Experiment
from agent_replay.replay.sweep.runner import Reporter, RunHook, Slot, execute, target_order
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
            raise InputError(
                f"--slo: {part.strip()!r}: expected NAME>=VALUE or NAME<=VALUE, "
                "e.g. p90_tps>=20,ttft_p99<=2s"
            )
        name, op, raw, unit = m.groups()
        col = name if name in fields else f"{name}_ms" if f"{name}_ms" in fields else None
        if col is None:
            raise InputError(
                f"--slo: unknown figure {name!r} (known: "
                f"{', '.join(k.removesuffix('_ms') for k in fields)})"
            )
        try:
            value = float(raw)
        except ValueError:
            raise InputError(f"--slo: {part.strip()!r}: {raw!r} is not a number") from None
        if fields[col] == "ms":
            if unit not in _UNITS_MS:
                raise InputError(f"--slo: {name}: unit {unit!r} (use ms, s or us)")
            value *= _UNITS_MS[unit]
        elif unit:
            raise InputError(
                f"--slo: {name}: takes a plain number in {fields[col]}, got unit {unit!r}"
            )
        terms.append(Term(col, op, value, part.strip()))
    return tuple(terms)


def meets(runs: Sequence[Mapping[str, Any]], slo: Sequence[Term]) -> bool:
    """The mean over ``runs`` (``mean_ci``'s estimate) meets every term (no complete run:
    it does not)."""
    if not runs:
        return False
    for t in slo:
        vals = [r.get(t.column) for r in runs]
        clean = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
        if len(clean) < len(vals) or not t.ok(mean_ci(clean).estimate if clean else None):
            return False
    return True


def _term_ci(
    runs: Sequence[Mapping[str, Any]], t: Term
) -> tuple[float | None, float | None] | None:
    """The 95% interval of a term's mean over ``runs`` ((None, None) with fewer than two);
    None when a run lacks the figure."""
    vals = [r.get(t.column) for r in runs]
    clean = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
    if len(clean) < len(vals):
        return None
    ci = mean_ci(clean)
    return ci.low, ci.high


def verdict(intervals: Sequence[tuple[Term, tuple[float | None, float | None] | None]]) -> str:
    """``meets`` when every term's interval is on the right side of its bound, ``fails`` when
    some term's is wholly on the wrong side (or lacks the figure), ``uncertain`` otherwise
    (also where a term has no interval)."""
    all_in = True
    for t, ci in intervals:
        if ci is None:
            return "fails"
        low, high = ci
        if low is None or high is None:
            all_in = False
            continue
        worst, best = (low, high) if t.op == ">=" else (high, low)
        if not t.ok(best):
            return "fails"
        all_in &= t.ok(worst)
    return "meets" if all_in else "uncertain"


def surely(runs: Sequence[Mapping[str, Any]], slo: Sequence[Term]) -> str:
    """``meets`` when the 95% interval of every term's mean is on the right side of its bound,
    ``fails`` when some term's interval is wholly on the wrong side (or a run failed),
    ``uncertain`` otherwise (also with fewer than two runs: no interval)."""
    if not runs:
        return "fails"
    return verdict([(t, _term_ci(runs, t)) for t in slo])


MIN_TURNS = 5
"""Turns per session a capacity run lasts at least (``run_length``)."""


def turn_period_s(trace: str) -> float | None:
    """The trace's median time from one turn's send to the next one's in the same session
    (intended, trace time), over sessions of two or more turns; None when there are none."""
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(trace, columns=["session_id", "arrival_ns"])
    except (OSError, ValueError, KeyError):
        return None
    sid = np.asarray(t.column("session_id").to_pylist(), dtype=object)
    arr = np.asarray(t.column("arrival_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    periods = []
    for s in set(sid.tolist()):
        a = np.sort(arr[sid == s])
        if a.size >= 2 and a[-1] > a[0]:
            periods.append((a[-1] - a[0]) / (a.size - 1) / 1e9)
    return float(np.median(periods)) if periods else None


def run_length(exp: Experiment) -> tuple[float | None, str]:
    """The duration of a capacity run and why: for session-timed axes, ``MIN_TURNS`` turns
    per session at the trace's median turn period (compressed by ``speedup``) plus the ramp,
    more turns where the fewest sessions at once would not send the requests a P90 needs
    (``analysis.hist.min_count_for``), or the experiment's ``duration_s`` when longer; the
    experiment's for requests in flight."""
    given = exp.run.get("duration_s")
    if exp.axis == "concurrency":
        return given, "closed loop: the experiment's duration"
    period = turn_period_s(exp.trace)
    if period is None:
        return given, "the trace has no session of two turns: the experiment's duration"
    speed = float(exp.run.get("speedup", 1.0))
    turns = MIN_TURNS
    if exp.axis == "concurrent_sessions":
        turns = max(turns, math.ceil(min_count_for(90) / min(exp.points)))
    need = turns * period / speed + float(exp.run.get("ramp_s", 1.0))
    if given is not None and float(given) >= need:
        return float(
            given
        ), f"the experiment's duration (>= {turns} turns of {period / speed:.2f} s)"
    return round(need, 1), (
        f"{turns} turns per session at the trace's median turn period "
        f"{period:.2f} s / speedup {speed:g} + ramp"
    )


@dataclass
class Probe:
    point: float
    runs: int
    passed_runs: int
    meets: bool
    means: dict[str, float | None]
    sure: str = "uncertain"
    """``surely``: meets, fails or uncertain given the run-to-run spread."""
    unreachable: int = 0
    """Runs whose load generator could not hold the load."""
    contended: int = 0
    """Runs with host contention."""
    unsteady: int = 0
    """Runs whose warm-up never became steady."""
    few: tuple[str, ...] = ()
    """SLO figures that are, in some run, a percentile of too few samples."""


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
    spread: tuple[float | None, float | None] = (None, None)
    """The bracket widened by the run-to-run spread: the highest probe that surely meets
    the SLO (none below it surely fails) and the lowest above it that surely fails."""
    client_limit: bool = False
    """The lowest failing probe was one the load generator could not hold."""
    crossing: tuple[float, float, float] | None = None
    """Where the SLO's first binding term crosses its bound between the bracket's ends
    (``crossing_interval``): the estimate and its 95% interval from the ends' repeats."""

    def line(self, axis: str) -> str:
        per = "" if self.capacity is None else f" = {self.capacity / self.gpus:g} per GPU"
        if self.capacity is None:
            head = f"{self.target}: no probed {axis} meets the SLO (lowest probe failed)"
        elif self.first_fail is None:
            head = f"{self.target}: {axis} {self.capacity:g}{per} meets the SLO; the highest point probed, so capacity is at least this"
        else:
            head = (
                f"{self.target}: capacity {self.capacity:g}{per} ({axis}; between {self.capacity:g} "
                f"and {self.first_fail:g})"
            )
        slo_, shi = self.spread
        if self.capacity is not None and (slo_, shi) != (self.capacity, self.first_fail):
            top = max((p.point for p in self.probes), default=None)
            head += (
                f"; with the run-to-run spread: {'none' if slo_ is None else f'{slo_:g}'} to "
                + (
                    f"{shi:g}"
                    if shi is not None
                    else f"beyond the highest probe ({top:g})"
                    if top is not None
                    else "-"
                )
            )
        if self.crossing is not None:
            x, lo_x, hi_x = self.crossing
            head += (
                f"; the SLO is crossed at {x:.1f} (95% interval {lo_x:.1f} to {hi_x:.1f}, "
                "from the bracket's repeats)"
            )
        if self.client_limit:
            head += (
                "; the first failing load was one the load generator could not hold: "
                "this is the client's limit, not the server's (use more --workers)"
            )
        lo, hi = self.interval
        if lo != hi or self.disagree is not None:
            head += (
                f"; uncertainty {'-' if lo is None else f'{lo:g}'} to "
                f"{'-' if hi is None else f'{hi:g}'}: every run met the SLO up to "
                f"{'none' if lo is None else f'{lo:g}'}, some run up to "
                f"{'none' if hi is None else f'{hi:g}'}"
            )
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


CAPACITY_AXES = ("concurrent_sessions", "concurrency", "rate")
"""Load axes the server paces (closed loop or arrival rate)."""


def check_axis(exp: Experiment) -> None:
    if exp.axis not in CAPACITY_AXES:
        raise InputError(
            f"{exp.path}: --find-capacity needs a load the server paces: [load] axis "
            f"concurrent_sessions, concurrency (closed loop) or rate, not {exp.axis!r} "
            "(the trace's own timing sets that load, so meeting an SLO there says "
            "nothing of how much more the server could take)"
        )


def _probe(
    rows: Mapping[tuple[Any, ...], Mapping[str, Any]], target: str, pt: float, slo: Sequence[Term]
) -> Probe:
    runs = [r for k, r in rows.items() if k[0] == "capacity" and k[1] == target and k[2] == pt]
    good = [r for r in runs if r["status"] == "complete"]
    passed = sum(1 for r in good if meets([r], slo))
    ok = meets(good, slo) and len(good) == len(runs)
    sure = surely(good, slo) if len(good) == len(runs) else "fails"
    return Probe(
        pt,
        len(runs),
        passed,
        ok,
        {t.column: _mean([r.get(t.column) for r in good]) for t in slo},
        sure,
        sum(1 for r in runs if r["status"] == "unreachable"),
        sum(1 for r in runs if r.get("machine_contention")),
        sum(1 for r in runs if r.get("warmup_steady") is False),
        tuple(t.column for t in slo if any(too_few(r, t.column) for r in good)),
    )


def max_runs(exp: Experiment, max_steps: int = 12, expand: int = 3, rounds: int = 3) -> int:
    """About the most runs a capacity search can take (for the progress line's bound): both
    ends of the load axis, the top doubled while it still meets the SLO, one point per
    target and step while the bisection narrows (to neighbouring integers on an integer
    axis, to 5% on the others), for every repeat, and the bracket's ends run again."""
    lo, hi = min(exp.points), max(exp.points)
    if hi <= lo:
        return len(exp.targets) * exp.repeats
    if exp.axis in INTEGER_AXES:
        steps = math.ceil(math.log2(max(int(hi) - int(lo), 1)))
    else:
        steps = math.ceil(math.log2(max(math.log(hi / lo) / math.log(1.05), 1.0)))
    # both ends, up to `expand` doublings of the top, the bisection, then per round the
    # bracket's two ends again (another `repeats` runs each) and a bisection step more
    steps = min(steps + 2 * expand, max_steps + expand - 1)
    per_round = 3 * exp.repeats  # the two ends again, then a bisection step
    return len(exp.targets) * (exp.repeats * (2 + steps) + rounds * per_round)


class _Overall:
    """The capacity search's progress lines: each run's line with the round, the runs done
    of the most the search can take, and the time that leaves at most (from the mean run
    so far); the sweep runner's own count restarts every round."""

    def __init__(self, progress: Reporter | None, most: int) -> None:
        self.progress, self.most, self.done, self.round = progress, most, 0, 0
        self.t0 = time.monotonic()

    def __call__(self, line: str) -> None:
        self.done += 1
        self.most = max(self.most, self.done)  # the bound is an estimate: never below the count
        per_run = (time.monotonic() - self.t0) / self.done
        left = max(0, self.most - self.done) * per_run
        if self.progress is not None:
            self.progress(
                f"capacity round {self.round}, run {self.done} of at most {self.most}"
                f" (at most {left / 60:.0f} min left): {line}"
            )


def find_capacity(
    exp: Experiment,
    slo: Sequence[Term],
    *,
    rows: dict[tuple[Any, ...], dict[str, Any]],
    out: Any,
    servers: Servers,
    progress: Reporter | None = None,
    hooks: Sequence[RunHook] = (),
    timing: dict[str, float] | None = None,
    max_steps: int = 12,
    expand: int = 3,
    rounds: int = 3,
) -> list[Capacity]:
    check_axis(exp)
    integer = exp.axis in INTEGER_AXES
    lo0, hi0 = min(exp.points), max(exp.points)
    caps = [Capacity(t.name, t.gpus) for t in exp.targets]
    want: dict[int, list[float]] = {i: [lo0, hi0] if hi0 > lo0 else [lo0] for i in range(len(caps))}
    reps: dict[tuple[int, float], range] = {}
    order = 10_000
    grown = [0] * len(caps)
    confirmed: set[tuple[int, float]] = set()

    overall = _Overall(progress, max_runs(exp, max_steps, expand, rounds))

    def run_step(step: int, jobs: list[tuple[int, int, float]]) -> None:
        nonlocal order
        overall.round = step + 1
        rng = np.random.default_rng([exp.seed, step, stable_hash("capacity") & 0xFFFFFFFF])
        # repeat-major; targets in the balanced (rotated) order, points shuffled per target
        base = rng.permutation(len(caps)).tolist()
        slots = []
        for r in sorted({j[0] for j in jobs}):
            for i in target_order(base, r + step):
                mine = [pt for rr, ii, pt in jobs if rr == r and ii == i]
                for k in rng.permutation(len(mine)).tolist():
                    slots.append(Slot(order, r, i, mine[k], "capacity"))
                    order += 1
        if not execute(
            exp,
            slots,
            servers,
            rows,
            out,
            progress=overall if progress else None,
            hooks=hooks,
            timing=timing,
        ):
            raise KeyboardInterrupt

    def refresh(i: int) -> None:
        caps[i].probes = [
            _probe(rows, caps[i].target, pt, slo)
            for pt in sorted({p for (ii, p) in reps if ii == i})
        ]

    step = 0
    for _ in range(rounds):
        while step < max_steps + expand:
            jobs = [(r, i, pt) for i, pts in want.items() for pt in pts for r in range(exp.repeats)]
            if not jobs:
                break
            for i, pts in want.items():
                for pt in pts:
                    reps[(i, pt)] = range(exp.repeats)
            run_step(step, jobs)
            step += 1
            want = {}
            for i, c in enumerate(caps):
                refresh(i)
                lo, hi = _state(c.probes)
                top = max(p.point for p in c.probes)
                if hi is None and lo == top and grown[i] < expand:
                    # still meets at the top: the server is not yet the limit there
                    grown[i] += 1
                    want[i] = [float(int(top) * 2) if integer else top * 2]
                    continue
                nxt = _next(lo, hi, integer)
                if nxt is not None and all(p.point != nxt for p in c.probes):
                    want[i] = [nxt]
        # the bracket's ends again (repeats more runs each); where that moves the bracket,
        # bisect the new one
        again = []
        before = [_state(c.probes) for c in caps]
        for i in range(len(caps)):
            for end in before[i]:
                if end is not None and (i, end) not in confirmed:
                    confirmed.add((i, end))
                    again += [(exp.repeats + r, i, end) for r in range(exp.repeats)]
        if not again:
            break
        run_step(step, again)
        step += 1
        for i, c in enumerate(caps):
            refresh(i)
            if _state(c.probes) != before[i]:
                nxt = _next(*_state(c.probes), integer)
                if nxt is not None and all(p.point != nxt for p in c.probes):
                    want[i] = [nxt]
    for i, c in enumerate(caps):
        refresh(i)
        c.capacity, c.first_fail = _state(c.probes)
        mixed = [p.point for p in c.probes if 0 < p.passed_runs < p.runs]
        c.disagree = (min(mixed), max(mixed)) if mixed else None
        every = [p.point for p in c.probes if p.runs and p.passed_runs == p.runs]
        some = [p.point for p in c.probes if p.passed_runs > 0]
        c.interval = (max(every) if every else None, max(some) if some else None)
        c.spread = sure_bracket(c.probes)
        fail = next((p for p in c.probes if p.point == c.first_fail), None)
        c.client_limit = fail is not None and fail.unreachable > 0
        if c.capacity is not None and c.first_fail is not None:
            ends = [
                [
                    r
                    for k, r in rows.items()
                    if k[0] == "capacity"
                    and k[1] == c.target
                    and k[2] == pt
                    and r["status"] == "complete"
                ]
                for pt in (c.capacity, c.first_fail)
            ]
            c.crossing = crossing_interval(ends[0], ends[1], c.capacity, c.first_fail, slo)
    return caps


Margin = tuple[float, float, float]
"""A term's margin at one load: (estimate, pessimistic, optimistic) of its value minus the
bound, the sign turned so that positive meets."""


def margin(t: Term, estimate: float | None, low: float | None, high: float | None) -> Margin | None:
    """A term's margin from its value's estimate and 95% interval (None without them)."""
    if estimate is None or low is None or high is None:
        return None
    sign = 1.0 if t.op == ">=" else -1.0
    m = [sign * (v - t.bound) for v in (estimate, low, high)]
    return m[0], min(m[1:]), max(m[1:])


def crossing_interval(
    lo_runs: Sequence[Mapping[str, Any]],
    hi_runs: Sequence[Mapping[str, Any]],
    lo: float,
    hi: float,
    slo: Sequence[Term],
) -> tuple[float, float, float] | None:
    """Where between the bracket's ends ``lo`` (meets) and ``hi`` (fails) the SLO is crossed,
    with a 95% interval; None with fewer than two runs at an end.

    Each term's margin (its mean minus the bound, the sign turned so that positive meets) is
    interpolated linearly between the ends (``crossing``), with both ends' margins at the
    95% intervals of their means (``mean_ci``)."""

    def runs_margin(runs: Sequence[Mapping[str, Any]], t: Term) -> Margin | None:
        vals = [
            float(v)
            for r in runs
            if (v := r.get(t.column)) is not None and not math.isnan(float(v))
        ]
        ci = mean_ci(vals)
        return margin(t, ci.estimate, ci.low, ci.high)

    return crossing(
        [runs_margin(lo_runs, t) for t in slo], [runs_margin(hi_runs, t) for t in slo], lo, hi
    )


def crossing(
    lo_margins: Sequence[Margin | None], hi_margins: Sequence[Margin | None], lo: float, hi: float
) -> tuple[float, float, float] | None:
    """Where the SLO is crossed between ``lo`` (meets) and ``hi`` (fails), with a 95%
    interval, from each term's margin at both ends (``margin``; None: no answer).

    Each term's margin is interpolated linearly between the ends; the load where it reaches
    0 is that term's crossing, and the first term to cross sets the estimate. The interval
    repeats this with both ends' margins at their pessimistic bounds, then at the optimistic
    ones: a conservative union of the two ends' uncertainty. Where that reaches past an end,
    the line is extended, by one bracket width at most: the interval then says the bracket
    itself is uncertain."""
    width = hi - lo

    def cross(a: float, b: float) -> float:
        if not a > b:  # the margin does not fall from lo to hi: no crossing on this line
            return hi + width if a > 0 else lo - width
        return min(hi + width, max(lo - width, lo + width * a / (a - b)))

    est = low = high = math.inf
    for ma, mb in zip(lo_margins, hi_margins, strict=True):
        if ma is None or mb is None:
            return None
        est = min(est, cross(ma[0], mb[0]))
        low = min(low, cross(ma[1], mb[1]))
        high = min(high, cross(ma[2], mb[2]))
    return est, low, high


def sure_bracket(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(highest probe that surely meets with no surely failing probe below it, lowest probe
    above that which surely fails)."""
    ordered = sorted(probes, key=lambda p: p.point)
    lo: float | None = None
    for p in ordered:
        if p.sure == "fails":
            break
        if p.sure == "meets":
            lo = p.point
    hi = next(
        (p.point for p in ordered if p.sure == "fails" and (lo is None or p.point > lo)), None
    )
    return lo, hi


def _mean(vals: Sequence[Any]) -> float | None:
    clean = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
    return mean_ci(clean).estimate if clean else None


def other_phase(
    caps: Sequence[Capacity], rows: Mapping[tuple[Any, ...], Mapping[str, Any]], slo: Sequence[Term]
) -> list[str]:
    """Where the sweep phase of the same tree measured a probed (target, load) too: both
    means of each SLO figure, so that a drift of the host between the phases shows."""
    out = []
    for c in caps:
        for p in c.probes:
            runs = [
                r
                for k, r in rows.items()
                if k[0] == "sweep"
                and k[1] == c.target
                and k[2] == p.point
                and r["status"] == "complete"
            ]
            if not runs:
                continue
            figs = []
            for t in slo:
                other = _mean([r.get(t.column) for r in runs])
                mine = p.means.get(t.column)
                if other is not None and mine is not None:
                    figs.append(f"{t.column} {mine:,.1f} here, {other:,.1f} in the sweep")
            if figs:
                out.append(f"{c.target} at {p.point:g}: " + "; ".join(figs))
    return out


def to_markdown(
    caps: Sequence[Capacity], axis: str, slo_text: str, drift: Sequence[str] = ()
) -> str:
    lines = [f"# Capacity at SLO `{slo_text}`", ""]
    lines += [f"- {c.line(axis)}" for c in caps]
    lines += [
        "",
        f"| target | {axis} | runs | runs meeting SLO | mean meets | surely | host contention | "
        "warm-up not steady | "
        + " | ".join(
            "mean " + t for t in sorted({k for c in caps for p in c.probes for k in p.means})
        )
        + " |",
    ]
    keys = sorted({k for c in caps for p in c.probes for k in p.means})
    lines.append("|" + "---|" * (8 + len(keys)))
    for c in caps:
        for p in sorted(c.probes, key=lambda p: p.point):
            vals = [
                (
                    "-"
                    if p.means.get(k) is None
                    else f"{p.means[k]:,.2f}" + (FEW if k in p.few else "")
                )
                for k in keys
            ]
            lines.append(
                f"| {c.target} | {p.point:g} | {p.runs} | {p.passed_runs} | "
                f"{'yes' if p.meets else 'no'} | {p.sure} | {p.contended} | {p.unsteady} | "
                + " | ".join(vals)
                + " |"
            )
    lines.append("")
    lines.append(
        "A load meets the SLO when the mean of its replicate runs meets every term "
        "and none of them failed; 'surely' compares the 95% interval of each mean with "
        "the bound (the bracket's ends are run twice as often). Per GPU = load / the "
        f"target's GPUs. {FEW}: a percentile over fewer samples than it needs in some "
        f"run (P90 >= {min_count_for(90)}, P99 >= {min_count_for(99)})."
    )
    runs = sum(p.runs for c in caps for p in c.probes)
    busy = sum(p.contended for c in caps for p in c.probes)
    lines.append("")
    lines.append(
        f"This answer holds for the host's load during the search: {busy} of {runs} runs "
        "had host contention. The same load measured at another time, or on a host "
        "with other work, can land outside the bracket: repeat the search before "
        "comparing it with another."
    )
    if drift:
        lines += [
            "",
            "The same loads measured by this tree's sweep (another time, another host load):",
            "",
        ] + [f"- {d}" for d in drift]
    return "\n".join(lines) + "\n"


# ---- capacity from a ladder of measured runs ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure of one run with its 95% interval (None: too few requests for one)."""

    value: float | None
    low: float | None = None
    high: float | None = None


RESAMPLES = 1000


def figure_estimate(report: Any, key: str, resamples: int = RESAMPLES, seed: int = 0) -> Estimate:
    """A run's percentile figure (``p90_tps``, ``north_star``, ``ttft_p90_ms``, ...: any with a
    ``analysis.points.basis``) and its 95% interval from the time-block bootstrap of that
    percentile over the run's requests (``analysis.compare.block_bootstrap_percentile``):
    how far the figure moves with which requests the run happened to hold, as a ratio to the
    run's own percentile applied to the figure. The value is the report's own
    (``point_metrics``); no interval below ``min_interval_count`` requests."""
    from agent_replay.analysis.compare import block_bootstrap_percentile, min_interval_count
    from agent_replay.analysis.definitions import SPEEDS
    from agent_replay.analysis.points import basis, point_metrics

    value = point_metrics(report, 1).get(key)
    b = basis(key)
    if b is None:
        raise InputError(f"{key}: not a percentile figure (no interval from one run)")
    t = report.stats.per_request
    ok = t.column("ok").to_numpy(zero_copy_only=False).astype(bool)
    x = np.asarray(t.column(b[0]).to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    order = np.asarray(t.column("intended_ns").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    keep = ~np.isnan(x)
    if value is None or int(keep.sum()) < min_interval_count(b[1], True):
        return Estimate(value)
    boots = block_bootstrap_percentile(
        x[keep], order[keep], b[1], resamples, np.random.default_rng(seed)
    )
    # the bootstrap takes nearest-rank percentiles; a figure may be a linear one (the North
    # Star): its interval is the figure scaled by the resamples' ratio to the whole run's
    # nearest-rank percentile, so that it holds the figure as the report states it
    v = np.sort(x[keep])
    ratio = boots[boots > 0] / v[rank(b[1], v.size) - 1]
    speed = any(sp.key == key for sp in SPEEDS)
    lo, hi = np.percentile(float(value) / ratio if speed else float(value) * ratio, [2.5, 97.5])
    return Estimate(float(value), float(lo), float(hi))


def ladder_capacity(
    target: str, gpus: int, points: Mapping[float, Mapping[str, Estimate]], slo: Sequence[Term]
) -> Capacity:
    """Capacity from a ladder of load points run once each: the highest point whose figures
    meet every term and the lowest above it that does not (the bracket), whether each point
    surely meets or fails given its figures' 95% intervals (``verdict``), and where the SLO
    is crossed between the bracket's ends with its interval (``crossing``)."""
    probes = []
    for pt in sorted(points):
        fig = points[pt]
        ok = all(t.ok(fig[t.column].value) for t in slo)
        sure = verdict([(t, (fig[t.column].low, fig[t.column].high)) for t in slo])
        probes.append(Probe(pt, 1, int(ok), ok, {t.column: fig[t.column].value for t in slo}, sure))
    cap = Capacity(target, gpus, probes)
    cap.capacity, cap.first_fail = _state(probes)
    cap.interval = (cap.capacity, cap.capacity)
    cap.spread = sure_bracket(probes)
    if cap.capacity is not None and cap.first_fail is not None:
        lo_m, hi_m = (
            [margin(t, e[t.column].value, e[t.column].low, e[t.column].high) for t in slo]
            for e in (points[cap.capacity], points[cap.first_fail])
        )
        cap.crossing = crossing(lo_m, hi_m, cap.capacity, cap.first_fail)
    return cap
