"""Reset streams per client, timestamp mode and loop: misses (requests left to their
timeout instead of ending as ``stream`` errors) and detection delay.

    PYTHONPATH=. python benchmarks/bench_resets.py [N] [--no-watchdog]

``--no-watchdog`` turns off ``engines.kstamp.Watchdog`` to show what it prevents."""

from __future__ import annotations

import sys

import numpy as np

from agent_replay.engines import kstamp
from tests.faults import test_resets as t


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "10000"))
    if "--no-watchdog" in sys.argv:
        kstamp.Watchdog.add = lambda self, tr: None  # type: ignore[method-assign]
    t.TIMEOUT_S = 5.0
    for param in t._loops():
        factory = param.values[0]
        for client in t.CLIENTS:
            kinds, delays = t.run_resets(factory, client, n, concurrency=64)
            d = np.array(delays) / 1e6
            print(
                f"{param.id:8s} {client:12s} {kinds} detection ms p50 {np.percentile(d, 50):.1f} "
                f"p99 {np.percentile(d, 99):.1f} max {d.max():.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
