"""Where our TTFT and ITL differ from the simulated engine's ground truth, request by request.

The engine and our client run on one host, so their ``CLOCK_MONOTONIC`` readings compare
directly. For a run kept by ``benchmarks/run_all.py --keep DIR`` (a folder with
``gt.parquet`` and ``results/``), every request is matched by its X-Request-Id and every
token-carrying chunk by position:

* ingress = engine received - our send s (sent_ns + connect_ns): kernel, the engine's loop
  reading and parsing the request; it is in our TTFT and not in the handler-based ground
  truth's. Split at the engine's first byte (its kernel receive stamp when the engine ran
  with --kernel-arrival, else its loop's first read): send -> first byte is what remains
  against the first-byte ground truth, first byte -> handler is the engine's own queue;
* delay = our read time - engine write time, per chunk (kernel, our loop getting to the
  read); TTFT excess = ingress + the first chunk's delay; an ITL sample differs from the
  truth by the difference of two consecutive delays;
* the same delays on a 50 ms grid of write times, to show when they are large (the waves
  of request starts under max-rate).

    .venv/bin/python benchmarks/peers/decompose.py DIR/ours-c256-s0-w1
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_replay.analysis.results import read_run_record  # noqa: E402
from benchmarks.peers.harness import read_truth  # noqa: E402


def pct(a: np.ndarray, qs: tuple[float, ...] = (50, 90, 99, 99.9)) -> str:
    if a.size == 0:
        return "-"
    return (
        ", ".join(f"p{q:g} {np.percentile(a, q) / 1e6:.2f}" for q in qs)
        + f", max {a.max() / 1e6:.2f} ms (n={a.size})"
    )


def decompose(rundir: Path) -> str:
    truth = read_truth(rundir / "gt.parquet")
    t0 = read_run_record(rundir / "results").clock.t0_monotonic_ns or 0
    t = pq.read_table(
        rundir / "results" / "requests",
        columns=["request_id", "sent_ns", "connect_ns", "chunk_ns", "chunk_tokens"],
    ).to_pydict()
    ingress, first, delays, writes, gap_err, read_gap, gt_gap = [], [], [], [], [], [], []
    to_first_byte, queue = [], []
    for rid, sent, connect, cns in zip(
        t["request_id"], t["sent_ns"], t["connect_ns"], t["chunk_ns"], strict=True
    ):
        if rid not in truth.by_id or sent is None:
            continue
        sent += connect or 0  # s: the request's bytes handed to its connection
        received, wns, _ = truth.by_id[rid]
        ours = np.asarray(cns, dtype=np.int64) + t0
        if ours.size != wns.size or ours.size == 0:
            continue
        ingress.append(received - (sent + t0))
        if rid in truth.first_byte_by_id:
            to_first_byte.append(truth.first_byte_by_id[rid] - (sent + t0))
            queue.append(received - truth.first_byte_by_id[rid])
        d = ours - wns
        first.append(d[0])
        delays.append(d)
        writes.append(wns)
        gap_err.append(np.diff(d))
        read_gap.append(np.diff(ours))
        gt_gap.append(np.diff(wns))
    ing = np.asarray(ingress)
    fst = np.asarray(first)
    dl = np.concatenate(delays)
    wr = np.concatenate(writes)
    ge = np.concatenate(gap_err)
    rg, gg = np.concatenate(read_gap), np.concatenate(gt_gap)
    lines = [
        f"{rundir.name}: {len(ing)} requests matched, {dl.size} chunks",
        f"  TTFT excess mean {float((ing + fst).mean()) / 1e6:.2f} ms = ingress mean "
        f"{float(ing.mean()) / 1e6:.2f} + first-chunk delay mean {float(fst.mean()) / 1e6:.2f}",
        f"  ingress (engine handler - our send): {pct(ing)}",
        f"    our send -> engine's first byte: {pct(np.asarray(to_first_byte))}",
        f"    engine's first byte -> its handler: {pct(np.asarray(queue))}",
        f"  first-chunk delay (read - written): {pct(fst)}",
        f"  every chunk's delay: {pct(dl)}",
        f"  chunk gap, ours: {pct(rg, (50, 99))}; truth: {pct(gg, (50, 99))}",
        f"  gap error (ours - truth): {pct(ge, (1, 50, 99))}",
    ]
    # when are the delays large: 50 ms windows of write time
    grid = (wr - wr.min()) // 50_000_000
    n = int(grid.max()) + 1
    p99 = np.full(n, np.nan)
    for g in range(n):
        sel = dl[grid == g]
        if sel.size >= 50:
            p99[g] = np.percentile(sel, 99)
    ok = p99[~np.isnan(p99)]
    if ok.size:
        worst = np.argsort(np.nan_to_num(p99, nan=-1))[::-1][:5]
        lines.append(
            f"  per 50 ms window, p99 delay: median {np.median(ok) / 1e6:.2f} ms, "
            f"worst {', '.join(f'{p99[w] / 1e6:.1f} ms at +{w * 50} ms' for w in worst)}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    for d in argv:
        print(decompose(Path(d)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
