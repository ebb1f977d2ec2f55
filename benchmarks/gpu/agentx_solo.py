"""The solo ladders of docs/gpu.md: each deployment alone on the H100
(benchmarks/results/gpu/2026-12-06-h100-agentx-solo/), one run per lane count. The ladder
table, the frontier as `agent-replay frontier` writes it (with the published reference
points), and the lanes each profile holds at a per-user P90 TPS floor, by the test
`agent-replay sweep --find-capacity` applies to a point. ``agentx_doc.py`` checks the doc
against these blocks (``SOLO_BLOCKS``).
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
    _n,
    acceptance_length,
    figures,
    run_dir,
    settings_table,
)

SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
SOLO_SERVER = {"standard": "std", "mtp": "mtp", "dedicated-decode": "ded"}
"""The server (logs/NAME.server.log, results/NAME.command.json) of each profile's solo
ladder: one at a time, each with the GPU to itself."""
SOLO_LANES = (1, 2, 4, 6, 8)
REFERENCE = ROOT / "benchmarks/references/agentx.json"
THRESHOLDS = (100, 150, 200)
"""Per-user P90 TPS floors of the capacity answer (tok/s/user)."""


def solo_folders(run: Path = SOLO) -> list[tuple[str, int, Path]]:
    """(profile, lanes, results folder) of every solo run, in table order."""
    return [
        (prof, c, run_dir(prof, c, 1, run))
        for prof in PROFILES
        for c in SOLO_LANES
        if run_dir(prof, c, 1, run).is_dir()
    ]


@cache
def index_row(folder: Path, profile: str, lanes: int, order: int) -> dict[str, Any]:
    """One run as a row of a sweep index (``replay.sweep.index``): the figures
    ``analysis.points.point_metrics`` gives a sweep's run, so ``agent-replay frontier`` reads
    these runs as a sweep of lanes per profile."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report, self_check

    meta = json.loads((folder / "run.json").read_text())
    rep = build_report(folder, gpus=1)
    row: dict[str, Any] = dict(point_metrics(rep, 1))
    row.update(
        phase="sweep",
        order=order,
        repeat=1,
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


def solo_rows(run: Path = SOLO) -> list[dict[str, Any]]:
    return [index_row(f, prof, c, i) for i, (prof, c, f) in enumerate(solo_folders(run))]


def write_sweep(out: Path, run: Path = SOLO) -> Path:
    """The solo runs as a sweep folder (index.parquet, sweep.json) at ``out``, whose rows
    point at the committed results folders: ``agent-replay frontier OUT --reference
    benchmarks/references/agentx.json`` draws their frontier with the published points.
    The axis is offered load: AgentX lanes think between turns, so the throughput a point
    draws is what its lanes asked for, not the server's capacity."""
    from agent_replay.analysis.frontier import OFFERED
    from agent_replay.replay.sweep.index import write_index

    out.mkdir(parents=True, exist_ok=True)
    write_index(out, solo_rows(run))
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "axis": "concurrency",
                "axis_kind": OFFERED,
                "points": list(SOLO_LANES),
                "repeats": 1,
                "targets": [{"name": p} for p in PROFILES],
                "source": str(run),
            },
            indent=2,
        )
        + "\n"
    )
    return out


def solo_points(run: Path = SOLO) -> list[Any]:
    from agent_replay.analysis.frontier import points

    return points(solo_rows(run))


def frontier_solo_table(run: Path = SOLO) -> str:
    """The frontier table `agent-replay frontier` writes for the solo runs, with its note."""
    from agent_replay.analysis.frontier import OFFERED, to_markdown

    return to_markdown(solo_points(run), "concurrency", kind=OFFERED).strip()


def cards(run: Path) -> list[str]:
    """The GPU names every run of ``run`` recorded (run.json ``provenance.gpus``)."""
    names = set()
    for meta in (run / "results/runs").glob("*/c*/r*/run.json"):
        for g in json.loads(meta.read_text())["provenance"].get("gpus") or []:
            names.add(f"{g['name']} (driver {g['driver']})")
    return sorted(names)


def cards_sentence(run: Path = SOLO) -> str:
    both = {str(r.relative_to(ROOT)): cards(r) for r in (RUN, run)}
    return (
        "The card of every run, as its run.json records it: "
        + "; ".join(f"{name}: {', '.join(c) or 'not recorded'}" for name, c in both.items())
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


def ladder_solo_table(run: Path = SOLO) -> str:
    """Per profile and lane count: what was measured, the per-user speeds, TTFT, the
    throughput per GPU and the server's own gauges over the run."""
    from agent_replay.analysis.hist import FEW, min_count_for

    lines = [
        "| profile | lanes | measured s | requests | P90 TPS | North Star "
        "| 1/P90 ITL (AgentX interactivity) | TTFT p50 ms | TTFT p90 ms "
        "| output tok/s per GPU | AgentX tok/s per GPU | KV cache peak | preemptions "
        "| waiting peak |",
        "|---" * 14 + "|",
    ]
    for prof, c, folder in solo_folders(run):
        f = figures(folder)
        few = FEW if f.requests < min_count_for(90) else ""
        lines.append(
            f"| {prof} | {c} | {_n(f.measured_s, 0)} | {f.requests} | {_n(f.p90_tps)}{few} | "
            f"{_n(f.north_star)}{few} | {_n(f.interactivity)}{few} | {_n(f.ttft_p50_ms, 0)} | "
            f"{_n(f.ttft_p90_ms, 0)}{few} | {_n(f.output_per_gpu, 0)} | {_n(f.total_per_gpu, 0)} | "
            f"{(f.kv_peak or 0.0) * 100:.0f}% | {_n(f.preemptions, 0)} | {_n(f.waiting_peak, 0)} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Capacity:
    """The lanes a profile holds at a per-user floor, from one run per lane count: ``meets``
    the largest tested count up to which every tested count met it (0: not even one lane),
    ``fails`` the next tested count and its P90 TPS (None: none above was tested),
    ``later`` tested counts above ``fails`` that met it again (a ladder that is not
    monotone), ``few`` whether a run that decides it had too few requests for its P90."""

    meets: int
    fails: tuple[int, float] | None
    later: tuple[int, ...]
    few: bool


def capacity(run: Path, profile: str, floor: float) -> Capacity:
    return capacity_of(solo_points(run), profile, floor)


def capacity_of(points: Sequence[Any], profile: str, floor: float) -> Capacity:
    """`agent-replay sweep --find-capacity`'s test of a point (``replay.sweep.capacity``:
    the mean of its runs meets ``p90_tps>=floor``) over the frontier points
    (``analysis.frontier.Point``) of ``profile``, in lane order."""
    from agent_replay.replay.sweep.capacity import meets, parse_slo

    slo = parse_slo(f"p90_tps>={floor:g}")
    pts = sorted((p for p in points if p.target == profile), key=lambda p: p.point)
    best, fails, deciding = 0, None, []
    for p in pts:
        if not meets(p.runs, slo):
            fails = (int(p.point), float(p.mean("p90_tps") or 0.0))
            deciding.append(p)
            break
        best = int(p.point)
        deciding = [p]
    later = tuple(
        int(p.point) for p in pts if fails is not None and p.point > fails[0] and meets(p.runs, slo)
    )
    return Capacity(best, fails, later, any(p.few("p90_tps") for p in deciding))


def _capacity_cell(cap: Capacity) -> str:
    from agent_replay.analysis.hist import FEW

    mark = FEW if cap.few else ""
    if cap.fails is None:
        return f"{cap.meets} or more{mark} (the most tested)"
    at = f"at {cap.fails[0]}: {_n(cap.fails[1])}"
    text = f"none{mark} ({at})" if cap.meets == 0 else f"{cap.meets}{mark} ({at})"
    return text + (f"; meets again at {', '.join(map(str, cap.later))}" if cap.later else "")


def capacity_table(run: Path = SOLO) -> str:
    lines = [
        "| P90 TPS per user at least | " + " | ".join(PROFILES) + " |",
        "|---" * (len(PROFILES) + 1) + "|",
    ]
    for floor in THRESHOLDS:
        lines.append(
            f"| {floor} tok/s | "
            + " | ".join(_capacity_cell(capacity(run, prof, floor)) for prof in PROFILES)
            + " |"
        )
    return "\n".join(lines)


def ladder_sentence(run: Path = SOLO) -> str:
    """Each profile's P90 TPS at the ends of its ladder and its range over the ladder."""
    parts = []
    for prof in PROFILES:
        got = [(c, figures(f).p90_tps) for p, c, f in solo_folders(run) if p == prof]
        vals = [float(v) for _, v in got if v is not None]
        parts.append(
            f"{prof} {_n(got[0][1])} at {got[0][0]} lane, {_n(got[-1][1])} at "
            f"{got[-1][0]}, between {_n(min(vals))} and {_n(max(vals))}"
        )
    return "P90 TPS along the solo ladder: " + "; ".join(parts) + "."


def leaders_sentence(run: Path = SOLO) -> str:
    """Which profile had the highest P90 TPS, and which the highest AgentX throughput per
    GPU, at each lane count."""

    def best(key: str) -> str:
        out = []
        for c in SOLO_LANES:
            vals = {p: getattr(figures(f), key) for p, n, f in solo_folders(run) if n == c}
            out.append(f"{c}: {max(vals, key=lambda p: vals[p] or 0.0)}")
        return ", ".join(out)

    return (
        f"Highest P90 TPS per lane count: {best('p90_tps')}. Highest AgentX tok/s per "
        f"GPU: {best('total_per_gpu')}."
    )


def throughput_sentence(run: Path = SOLO) -> str:
    """How far the frontier's total tok/s per GPU (from the first intended send,
    ``analysis.definitions`` RUN_FIGURES) is from AgentX's (from the first actual send,
    ``total_tokens_per_s_per_gpu``) over the solo runs."""
    gap = max(
        abs(r["total_tps_per_gpu"] / figures(Path(r["path"])).total_per_gpu - 1)
        for r in solo_rows(run)
    )
    return (
        "The frontier's total tok/s/GPU counts each run from its first intended send, the "
        "ladder's AgentX tok/s per GPU from its first actual send (AgentX's definition); "
        f"over these runs they differ by {gap * 100:.2f}% at most."
    )


def flags_sentence(run: Path = SOLO) -> str:
    """The report's cold-start flags of the solo runs, with the warm-up requests each run
    did send (kept out of its figures)."""
    from agent_replay.analysis.report import build_report

    why: dict[str, int] = {}
    warm: dict[int, set[int]] = {}
    for _, lanes, folder in solo_folders(run):
        reason = build_report(folder, gpus=1).cold_start
        if reason:
            key = reason.split(":")[0]
            why[key] = why.get(key, 0) + 1
        w = pq.read_table(folder / "requests", columns=["warmup"]).column("warmup").to_pylist()
        warm.setdefault(lanes, set()).add(sum(1 for x in w if x))
    per_lane = sorted({n // lanes for lanes, ns in warm.items() for n in ns})
    flagged = "; ".join(f"'{k}' on {n} of {len(solo_folders(run))} runs" for k, n in why.items())
    return (
        f"Flags: {flagged or 'none'}. Each run sent {' or '.join(map(str, per_lane))} "
        "warm-up requests per lane before its measured window (AgentX's warm-up, kept "
        "out of the figures), which the report's cold-start check counts as a warm-up."
    )


def steps(run: Path = SOLO) -> list[tuple[str, int, float]]:
    """(step, rc, seconds) of logs/steps.tsv: the phase's steps as the script timed them."""
    rows = (run / "logs/steps.tsv").read_text().splitlines()[1:]
    return [(a, int(b), float(c)) for a, b, c, *_ in (r.split("\t") for r in rows)]


def interval_sentence(run: Path = SOLO) -> str:
    """What an interval per point would take: more runs per point (``replay.sweep.capacity``
    calls a point sure only when the 95% interval of its runs' mean clears the floor, which
    needs 2 runs at least), and runs long enough for a P90 of 10 or more requests."""
    from agent_replay.analysis.hist import min_count_for

    runs = [(n, s) for n, _, s in steps(run) if n.startswith("c") and "-r1-" in n]
    few = [
        n
        for n, _ in runs
        if figures(run_dir(_profile(n), int(n[1:].split("-")[0]), 1, run)).requests
        < min_count_for(90)
    ]
    total = sum(s for _, s in runs)
    return (
        f"One run per point: the {len(runs)} runs took {total:,.0f} s of wall time "
        f"(logs/steps.tsv), so two more repeats of every point, the least that gives each "
        f"mean a Student-t interval with 2 degrees of freedom, take about "
        f"{2 * total:,.0f} s more, server starts aside; {len(few)} of the runs "
        f"({', '.join(few)}) counted fewer than the {min_count_for(90)} requests a P90 "
        f"needs, so their P90 is their slowest request or next to it, and a longer "
        f"measured window is the other half of the fix."
    )


def _profile(step: str) -> str:
    short = step.rsplit("-", 1)[1]
    return next(p for p, s in SOLO_SERVER.items() if s == short)


def solo_acceptance_sentence(run: Path = SOLO) -> str:
    parts = []
    for prof in ("mtp", "dedicated-decode"):
        acc = n = 0.0
        for c in SOLO_LANES:
            a, m = acceptance_length(run_dir(prof, c, 1, run))
            acc, n = acc + a, n + m
        parts.append(f"{prof} {1 + acc / n:.3f} over {n:,.0f} verify steps")
    return (
        "Mean acceptance length the servers counted over the solo ladder (1 + accepted "
        "draft tokens per verify step, from /metrics): " + "; ".join(parts) + "."
    )


def solo_settings_table(run: Path = SOLO) -> str:
    return settings_table(run, SOLO_SERVER)


def trace_sentence(run: Path = SOLO) -> str:
    """The trace folder's hash (run.json ``trace.sha256``) of each setup's runs."""

    def hashes(r: Path) -> list[str]:
        return sorted(
            {
                json.loads(m.read_text())["trace"]["sha256"][:12]
                for m in (r / "results/runs").glob("*/c*/r*/run.json")
            }
        )

    return (
        f"Trace hash (run.json trace.sha256): co-resident runs {', '.join(hashes(RUN))}; "
        f"solo runs {', '.join(hashes(run))}."
    )


SOLO_BLOCKS = {
    "cards sentence": cards_sentence,
    "solo settings table": solo_settings_table,
    "solo acceptance sentence": solo_acceptance_sentence,
    "trace sentence": trace_sentence,
    "solo ladder table": ladder_solo_table,
    "solo frontier table": frontier_solo_table,
    "reference table": reference_section,
    "ladder sentence": ladder_sentence,
    "leaders sentence": leaders_sentence,
    "throughput sentence": throughput_sentence,
    "flags sentence": flags_sentence,
    "capacity table": capacity_table,
    "interval sentence": interval_sentence,
}
"""The solo ladders' blocks of docs/gpu.md, each computed from the solo folder."""
