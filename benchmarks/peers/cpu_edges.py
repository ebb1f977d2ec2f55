"""How much a coarse CPU sampling period moves a client's CPU in the window, for the runs a
``benchmarks/run_all.py --keep DIR`` kept (each run folder has ``cpu.csv``, the client's
CPU read every 10 ms, and ``gt.parquet``).

For every run: the CPU in the workload's window from the 10 ms samples; the same from every
20th sample (a 0.2 s period) at each of the 20 phases, min-max; that again over the window
that starts at the first request of all (a client's own requests before its workload
included, the old window), per chunk of all requests; and the client's CPU rate (cores) in the 0.2 s before
the window and after it, which is what a coarse period smears into the window.

    .venv/bin/python benchmarks/peers/cpu_edges.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.harness import read_truth  # noqa: E402

COARSE = 20
"""0.2 s / 10 ms: the sampling period these runs used before, in samples."""


def _interp(t: np.ndarray, c: np.ndarray, x: int) -> float:
    return float(np.interp(x, t, c))


def edges(rundir: Path, n: int) -> str:
    a = np.loadtxt(rundir / "cpu.csv", delimiter=",", skiprows=1, ndmin=2)
    t, c = a[:, 0], a[:, 1]
    whole = read_truth(rundir / "gt.parquet")
    truth = whole.workload(n)
    t0, t1 = truth.t0, truth.t1
    fine = _interp(t, c, t1) - _interp(t, c, t0)

    def coarse_from(start: int) -> list[float]:
        return [
            _interp(t[k::COARSE], c[k::COARSE], t1) - _interp(t[k::COARSE], c[k::COARSE], start)
            for k in range(COARSE)
            if t[k::COARSE].size >= 2
        ]

    coarse = coarse_from(t0)
    old = (
        [x * 1e6 / whole.chunks for x in coarse_from(whole.t0)] if whole.chunks else [float("nan")]
    )
    w = 200_000_000
    before = (_interp(t, c, t0) - _interp(t, c, t0 - w)) / 0.2
    after = (_interp(t, c, t1 + w) - _interp(t, c, t1)) / 0.2
    per = 1e6 / truth.chunks if truth.chunks else float("nan")
    return (
        f"| {rundir.name} | {fine:.3f} | {min(coarse):.3f}-{max(coarse):.3f} | "
        f"{fine * per:.1f} | {min(coarse) * per:.1f}-{max(coarse) * per:.1f} | "
        f"{min(old):.1f}-{max(old):.1f} | "
        f"{before:.2f} | {after:.2f} |"
    )


def main() -> None:
    top = Path(sys.argv[1])
    print(
        "| run | window CPU s (10 ms) | window CPU s (0.2 s, 20 phases) | us/chunk (10 ms) "
        "| us/chunk (0.2 s) | us/chunk (0.2 s, old window) | cores in 0.2 s before "
        "| cores in 0.2 s after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for d in sorted(
        p for p in top.iterdir() if (p / "cpu.csv").exists() and (p / "gt.parquet").exists()
    ):
        conc = int(d.name.split("-c")[1].split("-")[0])
        print(edges(d, 4 * conc))


if __name__ == "__main__":
    main()
