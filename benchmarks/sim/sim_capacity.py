"""Agents per GPU at a per-user speed target: from the GPU's ladder and from the simulated
engine fitted on it, side by side, each with its interval.

For each deployment of the H100 solo ladder (``benchmarks/results/gpu/2026-12-06-h100-agentx-solo``:
AgentX lanes 1, 2, 4, 6, 8, one run each; ``REPEATS`` adds runs of some points):

- **GPU**: each run's figure (P90 TPS, North Star) with its 95% interval from the time-block
  bootstrap over the run's requests (``replay.sweep.capacity.figure_estimate``); at a point
  with repeats, the mean of its runs' figures with its Student-t interval; and the
  capacity of that ladder (``replay.sweep.capacity.ladder_capacity``): the highest lane count
  that meets the SLO, the lowest that does not, and where the SLO is crossed between them
  with its interval.
- **Virtual**: the simulated engine fitted on all five runs of the ladder
  (``engines.sim.fit.fit_runs``) replays the same trace with the run's own recorded options
  (preset, seed, duration, API) in virtual time (``replay.virtual.run_virtual``) at more lane
  counts, and the same two functions give its capacity.

    python benchmarks/sim/sim_capacity.py --refresh [--trace DIR]   # refit, rerun, write the data
    python benchmarks/sim/sim_capacity.py                           # the doc's table from the data
    python benchmarks/sim/sim_capacity.py --check docs/sim-engine.md

Data: benchmarks/results/sim/capacity.json and the fitted profiles
benchmarks/results/sim/h100-solo-*-ladder.json. ``--refresh`` needs the ladder's trace
(run.json's ``trace.path``, else ``--trace``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/results/sim"
SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
REPEATS = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats"
"""More runs of some of the ladder's points (other start seeds, another server start)."""
DEPLOYMENTS = (("standard", "std"), ("mtp", "mtp"), ("dedicated-decode", "ded"))
GPU_LANES = (1, 2, 4, 6, 8)
VIRTUAL_LANES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
SLOS = ("p90_tps>=100", "north_star>=100")
"""Per-user speed targets: P90 TPS (1 / P90 TPOT) and the AgentX North Star (1 / P90 of E2E
per output token), both at 100 tok/s/user."""
KEYS = ("p90_tps", "north_star")


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def _folder(profile: str, lanes: int) -> Path:
    return SOLO / "results/runs" / profile / f"c{lanes}" / "r1"


def repeats(profile: str, lanes: int) -> list[Path]:
    """The point's run of the ladder and its repeats (``REPEATS``), where committed."""
    more = REPEATS / "results/runs" / profile / f"c{lanes}"
    return [_folder(profile, lanes), *sorted(p.parent for p in more.glob("r*/requests"))]


def point_estimates(folders: list[Path]) -> dict[str, dict[str, float | None]]:
    """A ladder point's figures with their 95% intervals: one run's time-block bootstrap
    (``estimates``); over several runs, their mean with its Student-t interval
    (``analysis.replicates.mean_ci``, as ``sweep --find-capacity`` takes repeats)."""
    if len(folders) == 1:
        return estimates(folders[0])
    from agent_replay.analysis.replicates import mean_ci

    runs = [estimates(f) for f in folders]
    out = {}
    for key in KEYS:
        ci = mean_ci([r[key]["value"] for r in runs])
        out[key] = {"value": ci.estimate, "low": ci.low, "high": ci.high}
    return out


def estimates(folder: Path) -> dict[str, dict[str, float | None]]:
    """A run's figures with their 95% intervals (``figure_estimate``)."""
    from agent_replay.analysis.report import build_report
    from agent_replay.replay.sweep.capacity import figure_estimate

    report = build_report(folder)
    out = {}
    for key in KEYS:
        e = figure_estimate(report, key)
        out[key] = {"value": e.value, "low": e.low, "high": e.high}
    return out


def virtual_run(source: Path, profile: Path, lanes: int, out: Path, trace: str | None) -> Path:
    """The source run's own options (run.json ``options``) at ``lanes``, replayed in virtual
    time against ``profile``."""
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.virtual import run_virtual

    opts = json.loads((source / "run.json").read_text())["options"]
    known = {f.name for f in fields(RunConfig)}
    cfg = RunConfig(**{k: v for k, v in opts.items() if k in known and k != "agentx"})
    cfg = replace(
        cfg,
        agentx=replace(
            cfg.agentx,
            **{
                k: v for k, v in opts["agentx"].items() if k in {f.name for f in fields(cfg.agentx)}
            },
        ),
        concurrency=lanes,
        output=str(out),
        trace=trace or cfg.trace,
        target=None,
        force=True,
        progress=False,
        gpu_metrics="off",
        launch=None,
    )
    run_virtual(cfg, f"sim:{profile}")
    return out


def refresh(trace: str | None) -> dict[str, Any]:
    """Fit each deployment on its whole ladder (the front end's batch overlap chosen on
    those runs of all three, ``choose_frontend_overlap``), run the virtual ladder, and
    collect both sides' figures."""
    from agent_replay.engines.sim.fit import fit_runs, read_command
    from agent_replay.replay.simcal import choose_frontend_overlap

    data: dict[str, Any] = {"slos": list(SLOS), "deployments": []}
    ladders = {profile: [_folder(profile, c) for c in GPU_LANES] for profile, _ in DEPLOYMENTS}
    fits = {
        profile: fit_runs(
            [_rel(f) for f in ladders[profile]],
            name=f"h100-solo-{profile}-ladder",
            command=read_command(SOLO / f"results/{server}.command.json"),
            prefill_ctx_full_chunk=512,  # FLASH_ATTN_MLA, as in sim_error.py
        ).profile
        for profile, server in DEPLOYMENTS
    }
    overlap, scores = choose_frontend_overlap([(fits[p], ladders[p]) for p, _ in DEPLOYMENTS])
    data["frontend_batch_overlap"] = {
        "value": overlap,
        "scores": {f"{v:g}": round(sc, 4) for v, sc in scores.items()},
    }
    for profile, _ in DEPLOYMENTS:
        runs = ladders[profile]
        path = OUT / f"h100-solo-{profile}-ladder.json"
        fitted = fits[profile].replace(frontend_batch_overlap=overlap)
        path.write_text(json.dumps(fitted.to_dict(), indent=1) + "\n")
        gpu = {str(c): point_estimates(repeats(profile, c)) for c in GPU_LANES}
        virtual: dict[str, Any] = {}
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            for c in VIRTUAL_LANES:
                out = virtual_run(runs[0], path, c, Path(tmp) / f"c{c}", trace)
                virtual[str(c)] = estimates(out)
        data["deployments"].append(
            {
                "name": profile,
                "profile": _rel(path),
                "gpu_runs": [_rel(f) for f in runs],
                "gpu_repeats": {
                    str(c): [_rel(f) for f in repeats(profile, c)[1:]]
                    for c in GPU_LANES
                    if len(repeats(profile, c)) > 1
                },
                "gpu": gpu,
                "virtual": virtual,
                "virtual_host_s": round(time.monotonic() - t0, 1),
            }
        )
    (OUT / "capacity.json").write_text(json.dumps(data, indent=1) + "\n")
    return data


# ---- the table (pure functions of capacity.json) -----------------------------------------


def capacity(side: dict[str, Any], slo_text: str) -> Any:
    from agent_replay.replay.sweep.capacity import Estimate, ladder_capacity, parse_slo

    slo = parse_slo(slo_text)
    points = {
        float(c): {k: Estimate(v["value"], v["low"], v["high"]) for k, v in figs.items()}
        for c, figs in side.items()
    }
    return ladder_capacity("", 1, points, slo)


def answer(cap: Any) -> str:
    """``capacity (bracket), crossed at X [low, high]`` of one ladder."""
    top = max(p.point for p in cap.probes)
    low = min(p.point for p in cap.probes)
    if cap.capacity is None:
        return f"below {low:g} (the lowest point fails)"
    if cap.first_fail is None:
        return f"at least {cap.capacity:g} (the highest point, {top:g}, meets)"
    text = f"{cap.capacity:g} (between {cap.capacity:g} and {cap.first_fail:g})"
    if cap.crossing is not None:
        x, lo, hi = cap.crossing
        text += f"; crossed at {x:.1f} [{lo:.1f}, {hi:.1f}]"
    return text


def _fig(figs: dict[str, Any], key: str) -> str:
    f = figs.get(key) or {}
    if f.get("value") is None:
        return "–"
    ci = "" if f.get("low") is None else f" [{f['low']:.0f}, {f['high']:.0f}]"
    return f"{f['value']:.0f}{ci}"


def gpu_runs_text(data: dict[str, Any]) -> str:
    """The GPU ladder's lanes and which points have several runs."""
    lanes = ", ".join(sorted(data["deployments"][0]["gpu"], key=int))
    parts = []
    for d in data["deployments"]:
        more = d.get("gpu_repeats") or {}
        by_count: dict[int, list[str]] = {}
        for lane, runs in sorted(more.items(), key=lambda kv: int(kv[0])):
            by_count.setdefault(len(runs) + 1, []).append(lane)
        parts += [f"{d['name']} {', '.join(ls)}: {n} runs" for n, ls in sorted(by_count.items())]
    if not parts:
        return f"lanes {lanes}; one run each"
    return (
        f"lanes {lanes}; one run each, but {'; '.join(parts)}: their geometric mean with its "
        "t interval"
    )


def table(data: dict[str, Any]) -> str:
    """One row per deployment and SLO: the GPU ladder's answer and the virtual engine's."""
    lines = [
        f"| Deployment | SLO | GPU ({gpu_runs_text(data)}) | Virtual engine "
        f"(lanes {', '.join(str(c) for c in VIRTUAL_LANES)}) |",
        "|---|---|---|---|",
    ]
    for d in data["deployments"]:
        for slo in data["slos"]:
            lines.append(
                f"| {d['name']} | `{slo}` | {answer(capacity(d['gpu'], slo))} | "
                f"{answer(capacity(d['virtual'], slo))} |"
            )
    return "\n".join(lines)


def figures_table(data: dict[str, Any]) -> str:
    """Each lane count's figures with their intervals, GPU beside virtual."""
    lines = [
        "| Deployment | Lanes | P90 TPS, GPU | P90 TPS, virtual | North Star, GPU | "
        "North Star, virtual |",
        "|---|---|---|---|---|---|",
    ]
    for d in data["deployments"]:
        for c in sorted({*d["gpu"], *d["virtual"]}, key=int):
            g, v = d["gpu"].get(c, {}), d["virtual"].get(c, {})
            lines.append(
                f"| {d['name']} | {c} | {_fig(g, 'p90_tps')} | {_fig(v, 'p90_tps')} | "
                f"{_fig(g, 'north_star')} | {_fig(v, 'north_star')} |"
            )
    return "\n".join(lines)


def blocks(data: dict[str, Any]) -> dict[str, str]:
    return {"capacity table": table(data), "capacity figures": figures_table(data)}


def load() -> dict[str, Any]:
    return json.loads((OUT / "capacity.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", action="store_true", help="refit and rerun the virtual ladder")
    ap.add_argument("--trace", default=None, help="the ladder's trace (default: its run.json's)")
    ap.add_argument("--check", metavar="DOC", default=None)
    args = ap.parse_args(argv)
    data = refresh(args.trace) if args.refresh else load()
    if args.check is None:
        for name, text in blocks(data).items():
            print(f"<!-- {name} -->\n{text}\n")
        return 0
    text = Path(args.check).read_text()
    gone = [name for name, block in blocks(data).items() if block not in text]
    for name in gone:
        print(
            f"{args.check}: lacks the {name} computed from {_rel(OUT / 'capacity.json')}",
            file=sys.stderr,
        )
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
