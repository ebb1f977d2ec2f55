"""The simulated engine's calibration choices that score its predictions of recorded runs
by the figures ``agent-replay report`` computes (``analysis``): what ``engines.sim.fit``
cannot decide from its least squares alone, decided on the fit runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from agent_replay.engines.sim.profile import SimProfile

FRONTEND_OVERLAPS = (0.0, 0.25, 0.5, 0.75, 1.0)
SCORED = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")


def run_figures(folder: str | Path) -> dict[str, float | None]:
    """A results folder's TTFT and TPOT P50/P90 as ``agent-replay report`` computes them."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report

    row = point_metrics(build_report(Path(folder)), 1)
    return {k: row.get(k) for k in SCORED}


def choose_frontend_overlap(
    deployments: list[tuple[SimProfile, list[Path]]],
    grid: tuple[float, ...] = FRONTEND_OVERLAPS,
) -> tuple[float, dict[float, float]]:
    """The front end's batch overlap (``SimProfile.frontend_batch_overlap``) that predicts
    the fit runs best, and each candidate's score. For each value of ``grid``, every
    deployment's profile with it predicts each of its own fit runs; the score is the mean
    of |log(predicted / measured)| over their TTFT and TPOT P50 and P90. The lowest wins
    (a tie: the smaller value). Deployments served by one API server and tokenizer share a
    front end, so one value is chosen for all of them."""
    import tempfile

    from agent_replay.engines.sim.predict import predict_run

    measured = {str(f): run_figures(f) for _, folders in deployments for f in folders}
    scores: dict[float, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for value in grid:
            errs = []
            for n, (profile, folders) in enumerate(deployments):
                prof = profile.replace(frontend_batch_overlap=value)
                for j, folder in enumerate(folders):
                    got = run_figures(predict_run(prof, folder, Path(tmp) / f"{n}-{j}"))
                    for k in SCORED:
                        meas, pred = measured[str(folder)][k], got[k]
                        if meas and pred:
                            errs.append(abs(math.log(pred / meas)))
            scores[value] = float(np.mean(errs)) if errs else math.inf
    best = min(grid, key=lambda v: (scores[v], v))
    return best, scores
