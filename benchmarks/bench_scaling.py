"""Per-host scaling of the replay client: capacity at a schedule-lag bound, by worker count.

    python benchmarks/bench_scaling.py [--workers 1 2 4] [--rates 150 200 250 300]
                                       [--sim-workers 6] [--seconds 10] [--bound-ms 2]
                                       [--independent] [--out FILE]

Each run replays requests of 256 output tokens (one token per chunk, the sim's ``fast``
profile) arriving uniformly at ``rate`` per second per worker in ``absolute`` timing, so the
offered load is rate x 256 chunks/s per worker. For every worker count and rate it reports
chunks/s delivered, the schedule-lag p99 (actual send - intended), each worker's loop-lag
p99 and the client's CPU per chunk.

A worker count's capacity is the highest delivered chunks/s among the runs that delivered
at least 99% of the offered chunks with schedule-lag p99 <= ``--bound-ms``. The table ends
with each count's capacity and its ratio to the first count's (the target for N workers is
>= 0.85 x N).

``--independent`` adds, for each count N > 1 and rate, a control: N separate single-worker
``agent-replay`` processes started together against the same engine. Their lag against the
one-worker run shows what the host does to a worker when others run beside it, apart from
anything the multi-worker run itself adds. ``--dashboard`` runs with the live dashboard, as
``agent-replay run`` does by default (its progress lines then appear among the rows).

Needs as many free cores as workers plus what the engine takes (about one per 60k chunks/s):
on a 2-core machine it cannot show scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_replay import OUT_TOKENS, uniform_trace
from engines.sim import SimProcess
from replay.config import RunConfig
from replay.run import run

_ONE = """
import json, sys
from replay.config import RunConfig
from replay.run import run
trace, target, out = sys.argv[1:4]
s = run(RunConfig(trace=trace, target=target, output=out, timing="absolute", workers=1,
                  scrape_interval_s=0, progress=False), progress=None)
w = s.workers[0]
json.dump({"chunks": s.chunks, "ok": s.ok, "failed": s.failed, "cpu_run_s": w.cpu_run_s,
           "loop_lag": w.loop_lag_ns().tolist()}, open(out + ".json", "w"))
"""


def _lag_figures(folders: list[Path]) -> dict[str, float]:
    sent, intended, end = [], [], []
    for f in folders:
        t = pq.read_table(f / "requests", columns=["sent_ns", "intended_ns", "end_ns"]).to_pydict()
        sent += t["sent_ns"]
        intended += t["intended_ns"]
        end += t["end_ns"]
    s = np.array([x for x in sent if x is not None], dtype=np.int64)
    i = np.array([y for x, y in zip(sent, intended, strict=True) if x is not None], dtype=np.int64)
    e = np.array([x for x in end if x is not None], dtype=np.int64)
    lag = np.abs(s - i)
    return {"lag_p50_ms": float(np.percentile(lag, 50) / 1e6), "lag_p99_ms": float(np.percentile(lag, 99) / 1e6),
            "lag_max_ms": float(lag.max() / 1e6), "span_s": float((e.max() - s.min()) / 1e9)}


def one_run(tmp: Path, url: str, workers: int, rate: float, seconds: float, salt: int,
            dashboard: bool = False) -> dict:
    trace = uniform_trace(tmp / f"u-{workers}-{rate:g}.parquet", rate * workers, seconds)
    out = tmp / f"res-{workers}-{rate:g}"
    s = run(RunConfig(trace=str(trace), target=url, output=str(out), timing="absolute", workers=workers,
                      salt=salt, scrape_interval_s=0, progress=dashboard),
            progress=(lambda line: None) if dashboard else None)
    f = _lag_figures([out])
    return {"mode": f"{workers} worker{'s' if workers > 1 else ''}", "workers": workers, "rate": rate,
            "offered": rate * workers * OUT_TOKENS, "chunks": s.chunks, "ok": s.ok, "failed": s.failed,
            "chunks_per_s": s.chunks / f["span_s"], **f,
            "worker_loop_p99_ms": [float(np.percentile(w.loop_lag_ns(), 99) / 1e6) for w in s.workers],
            "cpu_us_per_chunk": sum(w.cpu_run_s for w in s.workers) / max(s.chunks, 1) * 1e6}


def independent_run(tmp: Path, url: str, n: int, rate: float, seconds: float) -> dict:
    outs, procs = [], []
    for k in range(n):
        trace = uniform_trace(tmp / f"i-{n}-{rate:g}-{k}.parquet", rate, seconds)
        out = tmp / f"ind-{n}-{rate:g}-{k}"
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, "-c", _ONE, str(trace), url, str(out)],
                                      cwd=Path(__file__).resolve().parents[1]))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"independent worker exited with {p.returncode}")
    parts = [json.loads(Path(str(o) + ".json").read_text()) for o in outs]
    f = _lag_figures(outs)
    chunks = sum(p["chunks"] for p in parts)
    return {"mode": f"{n} independent", "workers": n, "rate": rate, "offered": rate * n * OUT_TOKENS,
            "chunks": chunks, "ok": sum(p["ok"] for p in parts), "failed": sum(p["failed"] for p in parts),
            "chunks_per_s": chunks / f["span_s"], **f,
            "worker_loop_p99_ms": [float(np.percentile(p["loop_lag"], 99) / 1e6) for p in parts],
            "cpu_us_per_chunk": sum(p["cpu_run_s"] for p in parts) / max(chunks, 1) * 1e6}


def capacity(rows: list[dict], bound_ms: float) -> float:
    good = [r["chunks_per_s"] for r in rows
            if r["lag_p99_ms"] <= bound_ms and r["failed"] == 0
            and r["chunks"] >= 0.99 * r["workers"] * int(r["rate"] * r["seconds"]) * OUT_TOKENS]
    return max(good, default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rates", type=float, nargs="+", default=[150, 200, 250, 300],
                    help="requests/s per worker (x256 chunks/s)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--sim-workers", type=int, default=6)
    ap.add_argument("--bound-ms", type=float, default=2.0)
    ap.add_argument("--independent", action="store_true")
    ap.add_argument("--dashboard", action="store_true",
                    help="runs with the live dashboard (its plain-line form: stdout is not a terminal)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows: list[dict] = []
    print(f"host: {os.cpu_count()} CPUs; sim in {args.sim_workers} processes; {args.seconds:g} s per run",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp, SimProcess("fast", workers=args.sim_workers) as sim:
        tmpd = Path(tmp)
        for rate in args.rates:
            for w in args.workers:
                r = one_run(tmpd, sim.url, w, rate, args.seconds, salt=w, dashboard=args.dashboard)
                r["seconds"] = args.seconds
                rows.append(r)
                _print(r)
                if args.independent and w > 1:
                    r = independent_run(tmpd, sim.url, w, rate, args.seconds)
                    r["seconds"] = args.seconds
                    rows.append(r)
                    _print(r)
    print()
    base = None
    for w in args.workers:
        c = capacity([r for r in rows if r["mode"].endswith(("worker", "workers")) and r["workers"] == w],
                     args.bound_ms)
        base = c if base is None else base
        ratio = c / base if base else float("nan")
        print(f"capacity at schedule-lag p99 <= {args.bound_ms:g} ms, {w} worker(s): {c:,.0f} chunks/s"
              f" = {ratio:.2f}x of {args.workers[0]} (target >= {0.85 * w / args.workers[0]:.2f}x)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


def _print(r: dict) -> None:
    loops = " ".join(f"{x:.2f}" for x in r["worker_loop_p99_ms"])
    print(f"{r['mode']:>15s} rate {r['rate']:>5g}/s/worker: {r['chunks_per_s']:>9,.0f} chunks/s of "
          f"{r['offered']:>9,.0f} offered, failed {r['failed']}, lag p50/p99/max "
          f"{r['lag_p50_ms']:.2f}/{r['lag_p99_ms']:.2f}/{r['lag_max_ms']:.1f} ms, "
          f"loop p99 per worker [{loops}] ms, CPU {r['cpu_us_per_chunk']:.1f} us/chunk", flush=True)


if __name__ == "__main__":
    main()
