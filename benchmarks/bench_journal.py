"""What the row journal costs the measuring loop per completed request: ``ResultWriter.add``
with the journal on against the same calls with it off, in one process, on rows of 8, 100
and 1,000 chunks. Prints microseconds per row and the ratio.

    python benchmarks/bench_journal.py [--rows 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from array import array
from pathlib import Path

from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.results import ResultWriter

T0 = 1_000_000_000


def _rec(i: int, chunks: int) -> RequestRecord:
    r = RequestRecord(
        session_id=f"session-{i % 50}",
        request_index=i,
        parent_index=i - 1,
        clone=0,
        worker=0,
        request_id=f"abcd1234-session-{i % 50}-{i}",
        api="chat",
        expected_input_tokens=4000,
        expected_output_tokens=chunks,
        implied_cached_tokens=3000,
    )
    r.intended_ns, r.sent_ns, r.first_token_ns, r.end_ns = (
        T0 + i,
        T0 + i + 5,
        T0 + i + 50,
        T0 + i + 900,
    )
    r.chunk_ns = array("q", range(T0 + i, T0 + i + chunks))
    r.chunk_tokens = array("i", [1] * chunks)
    r.prompt_tokens, r.completion_tokens, r.cached_tokens = 4000, chunks, 3000
    return r


def _add_ns(recs: list[RequestRecord], journal: bool) -> float:
    """Mean ns of ``add`` per row (flushes every 2,000 rows included, as in a run)."""
    with tempfile.TemporaryDirectory() as d:
        w = ResultWriter(Path(d), T0, journal=journal)
        w.warm()
        start = time.perf_counter_ns()
        for r in recs:
            w.add(r)
        took = time.perf_counter_ns() - start
        w.close()
    return took / len(recs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    args = ap.parse_args()
    print("| chunks per row | add, journal off (us) | add, journal on (us) | ratio |")
    print("|---|---|---|---|")
    for chunks in (8, 100, 1000):
        recs = [_rec(i, chunks) for i in range(args.rows)]
        off = min(_add_ns(recs, False) for _ in range(3))
        on = min(_add_ns(recs, True) for _ in range(3))
        print(f"| {chunks} | {off / 1e3:.2f} | {on / 1e3:.2f} | {on / off:.1f}x |")


if __name__ == "__main__":
    main()
