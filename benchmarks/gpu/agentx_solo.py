"""The solo ladders of docs/gpu.md: each deployment alone on the H100
(benchmarks/results/gpu/2026-12-06-h100-agentx-solo/: one run per lane count, r1) and the
repeats of some points on the same servers restarted
(benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats/: r2, r3). The ladder table
(each point the geometric mean of its runs, with its 95% Student-t interval where it has
two runs or more), the runs of the repeated points, the frontier as `agent-replay frontier`
writes it (with the published reference points), and the lanes each profile holds at a
per-user P90 TPS floor, by the test `agent-replay sweep --find-capacity` applies to a point.
``agentx_doc.py`` checks the doc against these blocks (``SOLO_BLOCKS``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentx_runs import (  # the script beside this one
    PROFILES,
    ROOT,
    RUN,
    RunFigures,
    _n,
    acceptance_length,
    figures,
    run_dir,
    settings_table,
)

SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
REPEATS = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats"
"""More runs of some of the ladder's points, on the same servers restarted: repeat r of a
point replayed AgentX start seed 41 + r (r1, seed 42, is the ladder's own run)."""
SOLO_SERVER = {"standard": "std", "mtp": "mtp", "dedicated-decode": "ded"}
"""The server (logs/NAME.server.log, results/NAME.command.json) of each profile's solo
ladder: one at a time, each with the GPU to itself."""
SOLO_LANES = (1, 2, 4, 6, 8)
REFERENCE = ROOT / "benchmarks/references/agentx.json"
THRESHOLDS = (100, 150, 200)
"""Per-user P90 TPS floors of the capacity answer (tok/s/user)."""


def solo_folders(run: Path = SOLO) -> list[tuple[str, int, Path]]:
    """(profile, lanes, results folder) of the ladder's own run (r1) of every point, in
    table order."""
    return [
        (prof, c, run_dir(prof, c, 1, run))
        for prof in PROFILES
        for c in SOLO_LANES
        if run_dir(prof, c, 1, run).is_dir()
    ]


def point_runs(
    run: Path = SOLO, more: Sequence[Path] = (REPEATS,)
) -> dict[tuple[str, int], list[tuple[int, Path]]]:
    """Every run of each (profile, lanes) point, as (repeat, results folder) in repeat
    order: the ladder's r1 from ``run``, the repeats (r2, r3, ...) from the folders
    ``more``; points in table order. A repeat found twice is an error."""
    out: dict[tuple[str, int], list[tuple[int, Path]]] = {}
    for prof, c, folder in solo_folders(run):
        got = {1: folder}
        for extra in more:
            for f in sorted((extra / "results/runs" / prof / f"c{c}").glob("r[0-9]*")):
                k = int(f.name[1:])
                if k in got:
                    raise ValueError(f"{f}: repeat r{k} of {prof} at {c} lanes is also {got[k]}")
                got[k] = f
        out[(prof, c)] = sorted(got.items())
    return out


def all_folders(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> list[Path]:
    """Every solo run's results folder: the ladder's and the repeats'."""
    return [f for runs in point_runs(run, more).values() for _, f in runs]


@dataclass(frozen=True)
class Aggregate:
    """A figure of one point over its runs: the geometric mean with its 95% Student-t
    interval on the logs (``analysis.replicates.mean_ci``, the frontier's and
    ``--find-capacity``'s definition); low and high None with one run."""

    estimate: float | None
    low: float | None
    high: float | None
    n: int


def aggregate(values: Sequence[float | None]) -> Aggregate:
    """``values`` (one per run; None where a run gave none) as a point's figure."""
    from agent_replay.analysis.replicates import mean_ci

    ci = mean_ci([v for v in values if v is not None])
    return Aggregate(ci.estimate, ci.low, ci.high, ci.n)


def _agg(a: Aggregate, digits: int = 1, mark: str = "") -> str:
    """``est`` for one run, ``est [low, high]`` for more (``mark`` after the estimate)."""
    if a.estimate is None:
        return "-"
    if a.low is None or a.high is None:
        return f"{_n(a.estimate, digits)}{mark}"
    return f"{_n(a.estimate, digits)}{mark} [{_n(a.low, digits)}, {_n(a.high, digits)}]"


@cache
def index_row(
    folder: Path, profile: str, lanes: int, order: int, repeat: int = 1
) -> dict[str, Any]:
    """One run as a row of a sweep index (``replay.sweep.index``): the figures
    ``analysis.points.point_metrics`` gives a sweep's run, so ``agent-replay frontier`` reads
    these runs as a sweep of lanes per profile, ``repeat`` as one more run of its point."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report, self_check

    meta = json.loads((folder / "run.json").read_text())
    rep = build_report(folder, gpus=1)
    row: dict[str, Any] = dict(point_metrics(rep, 1))
    row.update(
        phase="sweep",
        order=order,
        repeat=repeat,
        target=profile,
        axis="concurrency",
        point=float(lanes),
        status="complete" if meta["status"] == "ok" else meta["status"],
        reason=meta.get("error"),
        path=str(folder),
        salt=meta.get("salt"),
        gpus=1,
        cold_start=bool(rep.cold_start),
        machine_contention=self_check(rep.meta, rep.stats).contention,
    )
    return row


def solo_rows(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> list[dict[str, Any]]:
    """Every solo run (the repeats as more runs of their points) as sweep index rows."""
    runs = [(prof, c, k, f) for (prof, c), got in point_runs(run, more).items() for k, f in got]
    return [index_row(f, prof, c, i, k) for i, (prof, c, k, f) in enumerate(runs)]


def write_sweep(out: Path, run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> Path:
    """The solo runs as a sweep folder (index.parquet, sweep.json) at ``out``, whose rows
    point at the committed results folders, the repeats (``more``) as more runs of their
    points: ``agent-replay frontier OUT --reference benchmarks/references/agentx.json``
    draws their frontier, with intervals where a point has two runs or more, beside the
    published points.
    The axis is offered load: AgentX lanes think between turns, so the throughput a point
    draws is what its lanes asked for, not the server's capacity."""
    from agent_replay.analysis.frontier import OFFERED
    from agent_replay.replay.sweep.index import write_index

    out.mkdir(parents=True, exist_ok=True)
    write_index(out, solo_rows(run, more))
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "axis": "concurrency",
                "axis_kind": OFFERED,
                "points": list(SOLO_LANES),
                "repeats": max(len(r) for r in point_runs(run, more).values()),
                "targets": [{"name": p} for p in PROFILES],
                "source": [str(run), *map(str, more)],
            },
            indent=2,
        )
        + "\n"
    )
    return out


def solo_points(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> list[Any]:
    """The frontier's points (``analysis.frontier.Point``) of every solo run."""
    from agent_replay.analysis.frontier import points

    return points(solo_rows(run, more))


def frontier_solo_table(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """The frontier table `agent-replay frontier` writes for the solo runs, with its note."""
    from agent_replay.analysis.frontier import OFFERED, to_markdown

    return to_markdown(solo_points(run, more), "concurrency", kind=OFFERED).strip()


def cards(run: Path) -> list[str]:
    """The GPU names every run of ``run`` recorded (run.json ``provenance.gpus``)."""
    names = set()
    for meta in (run / "results/runs").glob("*/c*/r*/run.json"):
        for g in json.loads(meta.read_text())["provenance"].get("gpus") or []:
            names.add(f"{g['name']} (driver {g['driver']})")
    return sorted(names)


def cards_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    every = {str(r.relative_to(ROOT)): cards(r) for r in (RUN, run, *more)}
    return (
        "The card of every run, as its run.json records it: "
        + "; ".join(f"{name}: {', '.join(c) or 'not recorded'}" for name, c in every.items())
        + "."
    )


def ours(run: Path = SOLO) -> list[str]:
    return [f"1x {c.partition(' (')[0]}" for c in cards(run)]


def reference_section(run: Path = SOLO) -> str:
    """The reference table `agent-replay frontier --reference` writes (its title line aside),
    with this frontier's card from the runs' run.json."""
    import dataclasses

    from agent_replay.analysis.frontier import X_AXES, Y_AXES
    from agent_replay.analysis.references import load, to_markdown

    ref = load(REFERENCE, [*X_AXES, *Y_AXES])
    ref = dataclasses.replace(ref, path=str(REFERENCE.relative_to(ROOT)))
    md = to_markdown(ref, ours(run), {**X_AXES, **Y_AXES})
    return "\n".join(md.splitlines()[2:]).strip()


# ---- the points: every run of a (profile, lanes) ------------------------------------------


@dataclass(frozen=True)
class PointFigures:
    """The runs of one (profile, lanes) point, in repeat order."""

    profile: str
    lanes: int
    repeats: tuple[int, ...]
    runs: tuple[RunFigures, ...]

    def agg(self, key: str) -> Aggregate:
        """Figure ``key`` (a ``RunFigures`` field) over the point's runs."""
        return aggregate([getattr(f, key) for f in self.runs])

    @property
    def few(self) -> bool:
        """Some run counted fewer requests than a P90 needs."""
        from agent_replay.analysis.hist import min_count_for

        return any(f.requests < min_count_for(90) for f in self.runs)


def ladder_points(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> list[PointFigures]:
    return [
        PointFigures(prof, c, tuple(k for k, _ in got), tuple(figures(f) for _, f in got))
        for (prof, c), got in point_runs(run, more).items()
    ]


def ladder_solo_table(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Per profile and lane count, over the point's runs: what was measured (per run), the
    per-user speeds, TTFT and the throughput per GPU (geometric mean, with its 95%
    interval from two runs on), and the server's own gauges (their extremes over the
    runs; preemptions summed)."""
    from agent_replay.analysis.hist import FEW

    lines = [
        "| profile | lanes | runs | measured s | requests | P90 TPS | North Star "
        "| 1/P90 ITL (AgentX interactivity) | TTFT p50 ms | TTFT p90 ms "
        "| output tok/s per GPU | AgentX tok/s per GPU | KV cache peak | preemptions "
        "| waiting peak |",
        "|---" * 15 + "|",
    ]
    for pt in ladder_points(run, more):
        few = FEW if pt.few else ""
        meas = ", ".join(_n(f.measured_s, 0) for f in pt.runs)
        reqs = ", ".join(str(f.requests) for f in pt.runs)
        kv = max((f.kv_peak or 0.0) for f in pt.runs)
        pre = [f.preemptions for f in pt.runs]
        pre_s = "-" if any(v is None for v in pre) else _n(sum(v or 0.0 for v in pre), 0)
        wait = max((f.waiting_peak or 0.0) for f in pt.runs)
        lines.append(
            f"| {pt.profile} | {pt.lanes} | {len(pt.runs)} | {meas} | {reqs} | "
            f"{_agg(pt.agg('p90_tps'), 1, few)} | {_agg(pt.agg('north_star'), 1, few)} | "
            f"{_agg(pt.agg('interactivity'), 1, few)} | {_agg(pt.agg('ttft_p50_ms'), 0)} | "
            f"{_agg(pt.agg('ttft_p90_ms'), 0, few)} | {_agg(pt.agg('output_per_gpu'), 0)} | "
            f"{_agg(pt.agg('total_per_gpu'), 0)} | {kv * 100:.0f}% | {pre_s} | {wait:.0f} |"
        )
    return "\n".join(lines)


def place(folder: Path) -> tuple[int, int]:
    """(k, n): the run in ``folder`` was the k-th of the n runs its server ran (that
    setup's logs/steps.tsv, in order)."""
    setup = folder.parents[4]
    prof, lanes, rep = folder.parent.parent.name, folder.parent.name, folder.name
    short = SOLO_SERVER[prof]
    mine = [n for n, _, _ in steps(setup) if n.startswith("c") and n.endswith(f"-{short}")]
    return mine.index(f"{lanes}-{rep}-{short}") + 1, len(mine)


def runs_table(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Each run of the points that have more than one: its seed, its place among its
    server's runs, and its own figures."""
    from agent_replay.analysis.hist import FEW, min_count_for

    lines = [
        "| profile | lanes | run | seed | run on its server | requests | P90 TPS | North Star "
        "| TTFT p50 ms | TTFT p90 ms | AgentX tok/s per GPU |",
        "|---" * 11 + "|",
    ]
    for (prof, c), got in point_runs(run, more).items():
        if len(got) < 2:
            continue
        for k, folder in got:
            f = figures(folder)
            few = FEW if f.requests < min_count_for(90) else ""
            seed = json.loads((folder / "run.json").read_text())["options"]["agentx"]["seed"]
            at, of = place(folder)
            lines.append(
                f"| {prof} | {c} | r{k} | {seed} | {at} of {of} | {f.requests} | "
                f"{_n(f.p90_tps)}{few} | {_n(f.north_star)}{few} | {_n(f.ttft_p50_ms, 0)} | "
                f"{_n(f.ttft_p90_ms, 0)}{few} | {_n(f.total_per_gpu, 0)} |"
            )
    return "\n".join(lines)


# ---- capacity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class End:
    """A point that decides a capacity answer: its lanes, its runs' mean P90 TPS with the
    interval (``aggregate``), and ``--find-capacity``'s verdict on it
    (``replay.sweep.capacity.surely``: meets, fails or uncertain)."""

    lanes: int
    p90: Aggregate
    verdict: str
    few: bool


@dataclass(frozen=True)
class Capacity:
    """The lanes a profile holds at a per-user floor: ``meets`` the largest tested count up
    to which every tested count's mean met it (0: not even one lane), ``fails`` the next
    tested count and its mean P90 TPS (None: none above was tested), ``later`` tested counts
    above ``fails`` whose mean met it again (a ladder that is not monotone), ``few``
    whether a run of a deciding point had too few requests for its P90. ``last`` and
    ``first_fail``: those two points (None where there is none); ``spread``: the bracket
    widened by the run-to-run spread, as ``--find-capacity`` widens its own
    (``replay.sweep.capacity.sure_bracket``: the highest count that surely meets with none below
    surely failing, the lowest above it that surely fails)."""

    meets: int
    fails: tuple[int, float] | None
    later: tuple[int, ...]
    few: bool
    last: End | None = None
    first_fail: End | None = None
    spread: tuple[float | None, float | None] = (None, None)

    @property
    def sure(self) -> bool:
        """The spread is the bracket: the count that meets surely meets and the one that
        fails surely fails (``Capacity.line`` of ``--find-capacity`` then adds no range)."""
        return self.spread == (
            float(self.meets) if self.meets else None,
            None if self.fails is None else float(self.fails[0]),
        )


def capacity(run: Path, profile: str, floor: float, more: Sequence[Path] = (REPEATS,)) -> Capacity:
    return capacity_of(solo_points(run, more), profile, floor)


def capacity_of(points: Sequence[Any], profile: str, floor: float) -> Capacity:
    """`agent-replay sweep --find-capacity`'s test of a point (``replay.sweep.capacity``:
    ``meets``, the mean of its runs meets ``p90_tps>=floor``; ``surely``, the 95% interval
    of that mean is on one side of the floor) over the frontier points
    (``analysis.frontier.Point``) of ``profile``, in lane order."""
    from agent_replay.replay.sweep.capacity import Probe, meets, parse_slo, sure_bracket, surely

    slo = parse_slo(f"p90_tps>={floor:g}")
    pts = sorted((p for p in points if p.target == profile), key=lambda p: p.point)
    probes = [
        Probe(
            float(p.point),
            len(p.runs),
            sum(1 for r in p.runs if meets([r], slo)),
            meets(p.runs, slo),
            {"p90_tps": p.mean("p90_tps")},
            surely(p.runs, slo),
        )
        for p in pts
    ]

    def end(i: int) -> End:
        p = pts[i]
        return End(
            int(p.point),
            aggregate([r.get("p90_tps") for r in p.runs]),
            probes[i].sure,
            bool(p.few("p90_tps")),
        )

    best, fails, last, first_fail = 0, None, None, None
    for i, (p, probe) in enumerate(zip(pts, probes, strict=True)):
        if not probe.meets:
            fails = (int(p.point), float(p.mean("p90_tps") or 0.0))
            first_fail = end(i)
            break
        best, last = int(p.point), end(i)
    later = tuple(
        int(p.point)
        for p, probe in zip(pts, probes, strict=True)
        if fails is not None and p.point > fails[0] and probe.meets
    )
    few = any(e.few for e in (last, first_fail) if e is not None)
    return Capacity(best, fails, later, few, last, first_fail, sure_bracket(probes))


def _capacity_cell(cap: Capacity) -> str:
    """The answer in lanes (``*``: a deciding run had too few requests for its P90)."""
    from agent_replay.analysis.hist import FEW

    mark = FEW if cap.few else ""
    if cap.fails is None:
        return f"{cap.meets} or more{mark} (the most tested)"
    text = f"none{mark}" if cap.meets == 0 else f"{cap.meets}{mark}"
    return text + (f"; meets again at {', '.join(map(str, cap.later))}" if cap.later else "")


VERDICT = {"meets": "surely meets", "fails": "surely fails", "uncertain": "uncertain"}


def _end_cell(e: End | None) -> str:
    from agent_replay.analysis.hist import FEW

    if e is None:
        return "-"
    runs = f"{e.p90.n} run" + ("s" if e.p90.n != 1 else "")
    return f"{e.lanes}: {_agg(e.p90, 1, FEW if e.few else '')} ({runs}), {VERDICT[e.verdict]}"


def _sure_cell(cap: Capacity) -> str:
    """``sure``, or what the run-to-run spread leaves sure (``Capacity.spread``)."""
    if cap.sure:
        return "sure"
    lo, hi = cap.spread
    if lo is None and hi is None:
        return "uncertain: no tested count is sure"
    if lo is None:
        return f"uncertain: surely fewer than {hi:g}"
    return f"uncertain: surely {lo:g} or more" + ("" if hi is None else f", fewer than {hi:g}")


def capacity_table(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Per profile and floor: the answer, its two deciding points with
    ``--find-capacity``'s verdict on each, and whether the answer is sure."""
    pts = solo_points(run, more)
    lines = [
        "| profile | P90 TPS per user at least | agents (lanes) | highest count that meets "
        "| next count, which fails | sure? |",
        "|---" * 6 + "|",
    ]
    for prof in PROFILES:
        for floor in THRESHOLDS:
            cap = capacity_of(pts, prof, floor)
            lines.append(
                f"| {prof} | {floor} tok/s | {_capacity_cell(cap)} | {_end_cell(cap.last)} | "
                f"{_end_cell(cap.first_fail)} | {_sure_cell(cap)} |"
            )
    return "\n".join(lines)


# ---- sentences ------------------------------------------------------------------------------


def ladder_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Each profile's P90 TPS (its points' means) at the ends of its ladder and its range
    over the ladder."""
    parts = []
    for prof in PROFILES:
        got = [
            (p.lanes, p.agg("p90_tps").estimate)
            for p in ladder_points(run, more)
            if p.profile == prof
        ]
        vals = [float(v) for _, v in got if v is not None]
        parts.append(
            f"{prof} {_n(got[0][1])} at {got[0][0]} lane, {_n(got[-1][1])} at "
            f"{got[-1][0]}, between {_n(min(vals))} and {_n(max(vals))}"
        )
    return (
        "P90 TPS along the solo ladder (each point the mean of its runs): " + "; ".join(parts) + "."
    )


def leaders_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Which profile had the highest mean P90 TPS, and which the highest mean AgentX
    throughput per GPU, at each lane count."""
    pts = ladder_points(run, more)

    def best(key: str) -> str:
        out = []
        for c in SOLO_LANES:
            vals = {p.profile: p.agg(key).estimate for p in pts if p.lanes == c}
            out.append(f"{c}: {max(vals, key=lambda p: vals[p] or 0.0)}")
        return ", ".join(out)

    return (
        f"Highest P90 TPS per lane count: {best('p90_tps')}. Highest AgentX tok/s per "
        f"GPU: {best('total_per_gpu')}."
    )


def throughput_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """How far the frontier's total tok/s per GPU (from the first intended send,
    ``analysis.definitions`` RUN_FIGURES) is from AgentX's (from the first actual send,
    ``total_tokens_per_s_per_gpu``) over the solo runs."""
    gap = max(
        abs(r["total_tps_per_gpu"] / figures(Path(r["path"])).total_per_gpu - 1)
        for r in solo_rows(run, more)
    )
    return (
        "The frontier's total tok/s/GPU counts each run from its first intended send, the "
        "ladder's AgentX tok/s per GPU from its first actual send (AgentX's definition); "
        f"over these runs they differ by {gap * 100:.2f}% at most."
    )


def flags_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """The report's cold-start flags of the solo runs, with the warm-up requests each run
    did send (kept out of its figures)."""
    from agent_replay.analysis.report import build_report

    why: dict[str, int] = {}
    warm: dict[int, set[int]] = {}
    folders = [(c, f) for (_, c), got in point_runs(run, more).items() for _, f in got]
    for lanes, folder in folders:
        reason = build_report(folder, gpus=1).cold_start
        if reason:
            key = reason.split(":")[0]
            why[key] = why.get(key, 0) + 1
        w = pq.read_table(folder / "requests", columns=["warmup"]).column("warmup").to_pylist()
        warm.setdefault(lanes, set()).add(sum(1 for x in w if x))
    per_lane = sorted({n // lanes for lanes, ns in warm.items() for n in ns})
    flagged = "; ".join(f"'{k}' on {n} of {len(folders)} runs" for k, n in why.items())
    return (
        f"Flags: {flagged or 'none'}. Each run sent {' or '.join(map(str, per_lane))} "
        "warm-up requests per lane before its measured window (AgentX's warm-up, kept "
        "out of the figures), which the report's cold-start check counts as a warm-up."
    )


def steps(run: Path = SOLO) -> list[tuple[str, int, float]]:
    """(step, rc, seconds) of logs/steps.tsv: the phase's steps as the script timed them."""
    rows = (run / "logs/steps.tsv").read_text().splitlines()[1:]
    return [(a, int(b), float(c)) for a, b, c, *_ in (r.split("\t") for r in rows)]


def _lanes_list(lanes: Sequence[int]) -> str:
    head = ", ".join(map(str, lanes[:-1]))
    return (
        (f"{head} and " if head else "") + f"{lanes[-1]} lane" + ("s" if list(lanes) != [1] else "")
    )


def interval_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Which points have how many runs, what the repeats took (their steps.tsv), what the
    rest would take (``replay.sweep.capacity`` calls a point sure only when the 95%
    interval of its runs' mean clears the floor, which needs 2 runs at least; 3 give the
    interval 2 degrees of freedom), and the runs too short for a P90 of 10 requests."""
    from agent_replay.analysis.hist import min_count_for

    got = point_runs(run, more)
    by_n: dict[int, dict[str, list[int]]] = {}
    for (prof, c), rs in got.items():
        by_n.setdefault(len(rs), {}).setdefault(prof, []).append(c)
    counts = []
    for n in sorted(by_n, reverse=True):
        where = by_n[n]
        if n == 1:
            counts.append(f"1 for the other {sum(len(v) for v in where.values())} points")
        else:
            counts.append(
                f"{n} for "
                + " and ".join(f"{prof} at {_lanes_list(cs)}" for prof, cs in where.items())
            )
    rep_steps = [(name, sec) for m in more for name, _, sec in steps(m)]
    rep_runs = [s for n, s in rep_steps if n.startswith("c")]
    healthy = [s for n, s in rep_steps if n == "healthy"]
    wall = {n: s for n, _, s in steps(run)}
    rest = sum(
        (3 - len(rs)) * wall[f"c{c}-r1-{SOLO_SERVER[prof]}"]
        for (prof, c), rs in got.items()
        if len(rs) < 3
    )
    few = [
        f"c{c}-r{k}-{SOLO_SERVER[prof]}"
        for (prof, c), rs in got.items()
        for k, f in rs
        if figures(f).requests < min_count_for(90)
    ]
    return (
        f"Runs per point: {'; '.join(counts)}. The {len(rep_runs)} repeats took "
        f"{sum(rep_runs):,.0f} s of wall time and the {len(healthy)} restarted servers "
        f"{sum(healthy):,.0f} s to become healthy (logs/steps.tsv of the repeats); bringing "
        f"every point to three runs, the least that gives its mean a Student-t interval with 2 "
        f"degrees of freedom, takes about {rest:,.0f} s more at the ladder's run times, server "
        f"starts aside. {len(few)} of the runs ({', '.join(few)}) counted fewer than the "
        f"{min_count_for(90)} requests a P90 needs, so their P90 is their slowest request or "
        f"next to it, and a longer measured window is the other half of the fix."
    )


def solo_acceptance_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    parts = []
    got = point_runs(run, more)
    for prof in ("mtp", "dedicated-decode"):
        acc = n = 0.0
        runs = [f for (p, _), rs in got.items() if p == prof for _, f in rs]
        for folder in runs:
            a, m = acceptance_length(folder)
            acc, n = acc + a, n + m
        parts.append(f"{prof} {1 + acc / n:.3f} over {n:,.0f} verify steps of {len(runs)} runs")
    return (
        "Mean acceptance length the servers counted over the solo runs (1 + accepted "
        "draft tokens per verify step, from /metrics): " + "; ".join(parts) + "."
    )


def solo_settings_table(run: Path = SOLO) -> str:
    return settings_table(run, SOLO_SERVER)


def repeats_settings_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """Whether the restarted servers of the repeats parsed, and reported, what the
    ladder's servers did (their settings tables are the same), else their own tables."""
    mine = solo_settings_table(run)
    out = []
    for m in more:
        theirs = settings_table(m, SOLO_SERVER)
        name = str(m.relative_to(ROOT))
        if theirs == mine:
            out.append(
                f"The restarted servers of {name} parsed the same settings, and reported "
                "the same of them in effect."
            )
        else:
            out.append(f"The restarted servers of {name}:\n\n{theirs}")
    return "\n".join(out)


def trace_sentence(run: Path = SOLO, more: Sequence[Path] = (REPEATS,)) -> str:
    """The trace folder's hash (run.json ``trace.sha256``) of each setup's runs."""

    def hashes(*rs: Path) -> list[str]:
        return sorted(
            {
                json.loads(m.read_text())["trace"]["sha256"][:12]
                for r in rs
                for m in (r / "results/runs").glob("*/c*/r*/run.json")
            }
        )

    return (
        f"Trace hash (run.json trace.sha256): co-resident runs {', '.join(hashes(RUN))}; "
        f"solo runs and their repeats {', '.join(hashes(run, *more))}."
    )


SOLO_BLOCKS = {
    "cards sentence": cards_sentence,
    "solo settings table": solo_settings_table,
    "repeats settings sentence": repeats_settings_sentence,
    "solo acceptance sentence": solo_acceptance_sentence,
    "trace sentence": trace_sentence,
    "solo ladder table": ladder_solo_table,
    "solo runs table": runs_table,
    "solo frontier table": frontier_solo_table,
    "reference table": reference_section,
    "ladder sentence": ladder_sentence,
    "leaders sentence": leaders_sentence,
    "throughput sentence": throughput_sentence,
    "flags sentence": flags_sentence,
    "capacity table": capacity_table,
    "interval sentence": interval_sentence,
}
"""The solo ladders' blocks of docs/gpu.md, each computed from the solo folder and its
repeats."""
