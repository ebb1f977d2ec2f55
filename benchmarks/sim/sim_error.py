"""The calibrated simulated engine's error on GPU runs it never saw: fit, predict, compare.

For each deployment of a committed GPU run, the model is fitted on some load points and
predicts the others, repeat by repeat: each held-out run's own rows are replayed against
the fitted engine on a virtual clock (``engines/sim/predict.py``) and both folders go
through the report's own computation (``analysis.report.build_report``,
``analysis.points.point_metrics``).

    python benchmarks/sim/sim_error.py --refresh        # refit, repredict, write the data
    python benchmarks/sim/sim_error.py                  # print the doc's table from the data
    python benchmarks/sim/sim_error.py --check docs/sim-engine.md   # exit 1 if it lacks it

Data: benchmarks/results/sim/ (the fitted profiles and error.json). Error = mean predicted
over mean measured - 1 across the held-out repeats; spread = the largest distance of one
measured repeat from their mean, relative to that mean (how far a single GPU run strays).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/results/sim"
H200 = ROOT / "benchmarks/results/gpu/2026-12-03-h200-mtp"
H100 = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx"
SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
REPEATS = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats"
"""More runs of the solo ladder's held-out points (other start seeds, another server start)."""

FIGURES = (
    ("ttft_p50_ms", "TTFT P50"),
    ("ttft_p90_ms", "TTFT P90"),
    ("tpot_p50_ms", "TPOT P50"),
    ("tpot_p90_ms", "TPOT P90"),
    ("itl_p99_ms", "ITL P99"),
    ("p90_tps", "P90 TPS"),
    ("north_star", "North Star"),
    ("total_tps_per_gpu", "tok/s/GPU"),
)
TARGETS = {"tpot_p50_ms": 0.03, "tpot_p90_ms": 0.03, "ttft_p50_ms": 0.10, "ttft_p90_ms": 0.10}
"""Error targets: TPOT within 3%, TTFT within 10% (or within the measured spread)."""


@dataclass(frozen=True)
class Experiment:
    name: str
    gpu: str
    profile: str  # the sweep's profile folder
    command: Path
    fit: tuple[str, ...]  # load points fitted on
    held_out: tuple[str, ...]  # load points predicted
    runs: Path
    repeats: tuple[str, ...]
    spread_runs: tuple[Path, ...] = ()
    """Repeats of another point whose spread stands in where a held-out point ran once."""
    prefill_ctx_full_chunk: int = 0
    """The attention backend's decode-path threshold (``sim-fit --prefill-ctx-full-chunk``)."""

    more_runs: Path | None = None
    """Another sweep's runs folder with more repeats (``r*``) of the held-out points."""
    front_end: str = ""
    """Experiments served by one API server and tokenizer share ``frontend_batch_overlap``."""

    def folders(self, point: str) -> list[Path]:
        own = [
            self.runs / self.profile / point / r
            for r in self.repeats
            if (self.runs / self.profile / point / r / "requests").is_dir()
        ]
        if self.more_runs is None or point not in self.held_out:
            return own
        more = sorted(p.parent for p in (self.more_runs / self.profile / point).glob("r*/requests"))
        return own + more


def _h200(profile: str, server: str) -> Experiment:
    """The H200 toy sweep: fitted on 1 and 8 sessions, predicting 2 and 32. Its servers ran
    vLLM's FLASH_ATTN_MLA backend too (``logs/``)."""
    return Experiment(
        name=f"h200-{profile}",
        gpu="H200, 4-layer toy model, mini-swe-agent sessions",
        profile=profile,
        command=H200 / f"results/{server}.command.json",
        fit=("concurrent_sessions=1", "concurrent_sessions=8"),
        held_out=("concurrent_sessions=2", "concurrent_sessions=32"),
        runs=H200 / "mtp/runs",
        repeats=tuple(f"r{i}" for i in range(5)),
        prefill_ctx_full_chunk=512,
        front_end="h200",
    )


def _solo(profile: str, server: str) -> Experiment:
    """The H100 solo ladder (each deployment alone on the GPU, 40 GiB of KV, one run per
    point, seed 42): fitted on 1, 2 and 8 lanes, predicting 4 and 6, each also in the
    repeats' runs (``REPEATS``: seeds 43 and 44) where they are committed. A held-out point
    with one run takes the spread of the co-resident run's three repeats at 1 lane.
    The servers ran vLLM's FLASH_ATTN_MLA backend (``logs/*.server.log``), which sends a
    chunk of up to 512 new tokens down its decode path."""
    more = REPEATS / "results/runs"
    repeated = (more / profile).is_dir()
    spread = H100 / "results/runs" / profile / "c1"
    return Experiment(
        name=f"h100-solo-{profile}",
        gpu="H100 alone, 16B MoE in FP8, AgentX Claude Code sessions",
        profile=profile,
        command=SOLO / f"results/{server}.command.json",
        fit=("c1", "c2", "c8"),
        held_out=("c4", "c6"),
        runs=SOLO / "results/runs",
        repeats=("r1",),
        spread_runs=tuple(
            spread / r for r in ("r1", "r2", "r3") if (spread / r / "requests").is_dir()
        ),
        prefill_ctx_full_chunk=512,
        more_runs=more if repeated else None,
        front_end="h100-solo",
    )


EXPERIMENTS = (
    _h200("standard", "std"),
    _h200("mtp", "mtp"),
    _h200("dedicated-decode", "ded"),
    _solo("standard", "std"),
    _solo("mtp", "mtp"),
    _solo("dedicated-decode", "ded"),
)


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def figures(folder: Path) -> dict[str, float | None]:
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report

    row = point_metrics(build_report(folder), 1)
    return {k: row.get(k) for k, _ in FIGURES}


def fit_all(experiments: tuple[Experiment, ...]) -> dict[str, Any]:
    """Each experiment's fit on its fit points, then the front end's batch overlap chosen
    per front end (``Experiment.front_end``) on those same fit runs
    (``choose_frontend_overlap``): experiment name -> (profile, the overlap's scores)."""
    from agent_replay.engines.sim.fit import fit_runs, read_command
    from agent_replay.replay.simcal import choose_frontend_overlap

    fits = {}
    for ex in experiments:
        fit_folders = [f for p in ex.fit for f in ex.folders(p)]
        fits[ex.name] = fit_runs(
            [_rel(f) for f in fit_folders],
            name=ex.name,
            command=read_command(ex.command),
            prefill_ctx_full_chunk=ex.prefill_ctx_full_chunk,
        ).profile
    out: dict[str, Any] = {}
    for group in dict.fromkeys(ex.front_end for ex in experiments):
        members = [ex for ex in experiments if ex.front_end == group]
        value, scores = choose_frontend_overlap(
            [(fits[ex.name], [f for p in ex.fit for f in ex.folders(p)]) for ex in members]
        )
        for ex in members:
            out[ex.name] = (
                fits[ex.name].replace(frontend_batch_overlap=value),
                {f"{v:g}": round(sc, 4) for v, sc in scores.items()},
            )
    return out


def refresh() -> dict[str, Any]:
    """Fit every experiment, predict its held-out runs, and collect the figures."""
    from agent_replay.engines.sim.predict import predict_run

    OUT.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"experiments": []}
    fits = fit_all(EXPERIMENTS)
    for ex in EXPERIMENTS:
        profile, scores = fits[ex.name]
        profile_path = OUT / f"{ex.name}.json"
        profile_path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
        points = []
        with tempfile.TemporaryDirectory() as tmp:
            for point in ex.held_out:
                measured, predicted = [], []
                for folder in ex.folders(point):
                    out = predict_run(
                        profile,
                        folder,
                        Path(tmp) / point / folder.name,
                        profile_label=_rel(profile_path),
                    )
                    measured.append(figures(folder))
                    predicted.append(figures(out))
                points.append(
                    {
                        "point": point,
                        "runs": [_rel(f) for f in ex.folders(point)],
                        "measured": measured,
                        "predicted": predicted,
                    }
                )
        data["experiments"].append(
            {
                "name": ex.name,
                "gpu": ex.gpu,
                "profile": _rel(profile_path),
                "fitted_on": list(ex.fit),
                "frontend_batch_overlap": {
                    "value": profile.frontend_batch_overlap,
                    "front_end": ex.front_end,
                    "scores": scores,
                },
                "points": points,
                "spread_runs": [_rel(f) for f in ex.spread_runs],
                "spread_measured": [figures(f) for f in ex.spread_runs],
            }
        )
    (OUT / "error.json").write_text(json.dumps(data, indent=1) + "\n")
    return data


# ---- the table (pure functions of error.json) --------------------------------------------


def _mean(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def error(measured: list[float | None], predicted: list[float | None]) -> float | None:
    """Mean predicted over mean measured - 1."""
    m, p = _mean(measured), _mean(predicted)
    return None if m is None or p is None or m == 0 else p / m - 1


def spread(measured: list[float | None]) -> float | None:
    """The largest distance of one repeat from the repeats' mean, relative to the mean."""
    m = _mean(measured)
    v = [x for x in measured if x is not None]
    if m is None or m == 0 or len(v) < 2:
        return None
    return max(abs(x - m) for x in v) / m


def met(key: str, err: float | None, spr: float | None) -> bool | None:
    """Whether a figure meets its target (None for figures without one)."""
    if key not in TARGETS or err is None:
        return None
    return abs(err) <= max(TARGETS[key], spr or 0.0)


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.0f}%"


def point_spread(ex: dict[str, Any], pt: dict[str, Any], key: str) -> tuple[float | None, str]:
    """A held-out point's measured spread of ``key`` and its mark: its own repeats', or,
    for a point run once, the spread of the experiment's stand-in repeats (marked ``†``)."""
    own = spread([r[key] for r in pt["measured"]])
    if own is not None or not ex.get("spread_measured"):
        return own, ""
    return spread([r[key] for r in ex["spread_measured"]]), "†"


def table(data: dict[str, Any]) -> str:
    """One row per held-out point and figure: measured mean, predicted, error, spread."""
    lines = [
        "| Deployment | Held-out point | Figure | Measured | Predicted | Error | "
        "Measured spread | Target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ex in data["experiments"]:
        for pt in ex["points"]:
            n = len(pt["measured"])
            for key, label in FIGURES:
                m = [r[key] for r in pt["measured"]]
                p = [r[key] for r in pt["predicted"]]
                (s, mark), e = point_spread(ex, pt, key), error(m, p)
                ok = met(key, e, s)
                verdict = "" if ok is None else ("met" if ok else "**missed**")
                lines.append(
                    f"| {ex['name']} | {pt['point']} ({n} runs) | {label} | "
                    f"{_fmt(_mean(m))} | {_fmt(_mean(p))} | {_pct(e)} | "
                    f"{'±' + _pct(s)[1:] + mark if s is not None else '–'} | {verdict} |"
                )
    return "\n".join(lines)


def summary(data: dict[str, Any]) -> str:
    """How many targeted figures met their target."""
    total = ok = 0
    for ex in data["experiments"]:
        for pt in ex["points"]:
            for key in TARGETS:
                m = [r[key] for r in pt["measured"]]
                p = [r[key] for r in pt["predicted"]]
                v = met(key, error(m, p), point_spread(ex, pt, key)[0])
                if v is not None:
                    total += 1
                    ok += bool(v)
    return f"{ok} of {total} TTFT and TPOT figures at held-out points meet their target."


def blocks(data: dict[str, Any]) -> dict[str, str]:
    return {"error table": table(data), "summary": summary(data)}


def load() -> dict[str, Any]:
    return json.loads((OUT / "error.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", action="store_true", help="refit and repredict from the GPU data")
    ap.add_argument("--check", metavar="DOC", default=None)
    args = ap.parse_args(argv)
    data = refresh() if args.refresh else load()
    if args.check is None:
        for name, text in blocks(data).items():
            print(f"<!-- {name} -->\n{text}\n")
        return 0
    text = Path(args.check).read_text()
    gone = [name for name, block in blocks(data).items() if block not in text]
    for name in gone:
        print(
            f"{args.check}: lacks the {name} computed from {_rel(OUT / 'error.json')}",
            file=sys.stderr,
        )
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
