"""A/B of our client at 256 streams (5 ms between chunks), variants alternated in one run:

    .venv/bin/python benchmarks/ab_ours.py REPEATS NAME=SRC_DIR [NAME=SRC_DIR ...]

Each SRC_DIR is a source tree (e.g. ``git archive COMMIT | tar -x -C DIR``; ``.`` for the
working tree) put first on PYTHONPATH for that variant; the harness is benchmarks/peers
(engine on core 0, client on core 1). Prints each run and the median [range] of chunks/s,
CPU us/chunk, TTFT minus ground truth, P99 ITL error against ground truth and loop-lag p99.
``CONC`` in the environment changes the stream count.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_replay.analysis.results import read_run_record  # noqa: E402
from benchmarks.run_all import one  # noqa: E402


def main(argv: list[str]) -> int:
    reps = int(argv[0])
    variants = [a.split("=", 1) for a in argv[1:]]
    conc = int(os.environ.get("CONC", "256"))
    res: dict[str, list[dict[str, Any]]] = {n: [] for n, _ in variants}
    work = Path(tempfile.mkdtemp(prefix="ab-"))
    for r in range(reps):
        for name, path in variants:
            os.environ["PYTHONPATH"] = str(Path(path).resolve())
            d = work / f"{name}-{r}"
            row = one("ours", conc, 4 * conc, 0, d)
            rj = read_run_record(d / f"ours-c{conc}-s0-w1" / "results")
            row["loop_p99"] = ((rj.self_check and rj.self_check.loop_lag_p99_ns) or 0) / 1e6
            res[name].append(row)
            print(
                f"{name} r{r}: chunks/s {row['chunks_s']:.0f} cpu/chunk {row['cpu_us_chunk']:.1f} "
                f"ttft {row['ttft']:.2f} (gt {row['gt_ttft']:.2f}) itl_p99 {row['itl_p99']:.2f} "
                f"(gt {row['gt_itl_p99']:.2f}) loop p99 {row['loop_p99']:.1f}",
                flush=True,
            )

    def med(v: list[float]) -> str:
        return f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"

    for name, rows in res.items():
        print(
            name,
            "chunks/s",
            med([x["chunks_s"] for x in rows]),
            "cpu/chunk",
            med([x["cpu_us_chunk"] for x in rows]),
            "ttft-gt",
            med([x["ttft"] - x["gt_ttft"] for x in rows]),
            "itl_p99 err%",
            med([(x["itl_p99"] / x["gt_itl_p99"] - 1) * 100 for x in rows]),
            "loop p99",
            med([x["loop_p99"] for x in rows]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
