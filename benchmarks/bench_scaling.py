"""Per-host scaling of the replay client: capacity at a schedule-lag bound, by worker count.

    python benchmarks/bench_scaling.py [--workers 1 2 4] [--rates 150 200 250 300]
                                       [--sim-workers 6] [--seconds 10] [--bound-ms 2]
                                       [--independent] [--pin] [--out FILE]

Each run replays requests of 256 output tokens (one token per chunk, the sim's ``fast``
profile) arriving uniformly at ``rate`` per second per worker in ``absolute`` timing, so the
offered load is rate x 256 chunks/s per worker. For every worker count and rate it reports
chunks/s delivered, the schedule-lag p99 (actual send - intended), each worker's loop-lag
p99 and the client's CPU per chunk.

A worker count's capacity is the highest delivered chunks/s among the rates whose runs all
delivered at least 99% of the offered chunks with schedule-lag p99 <= ``--bound-ms`` (with
``--repeat``, the median over the sweeps: single runs of 10 s vary by 2x in their p99 on
shared hosts). The table ends
with each count's capacity and its ratio to the first count's (the target for N workers is
>= 0.85 x N).

``--independent`` adds, for each count N > 1 and rate, a control: N separate single-worker
``agent-replay`` processes started together against the same engine. Their lag against the
one-worker run shows what the host does to a worker when others run beside it, apart from
anything the multi-worker run itself adds. ``--dashboard`` runs with the live dashboard, as
``agent-replay run`` does by default (its progress lines then appear among the rows).
``--pin`` runs the workers with ``--cpus`` on the last physical cores and the sim on the
others. Each row gives when the run's largest lag fell and its p99 without the first second.

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
import threading
import time
from functools import partial
from importlib import resources
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_replay.engines.sim import SimProcess
from agent_replay.replay.affinity import allowed_cpus, one_per_core, siblings
from agent_replay.replay.config import RunConfig
from agent_replay.replay.provenance import code_version
from agent_replay.replay.run import run
from benchmarks.bench_replay import OUT_TOKENS, uniform_trace

_ONE = """
import json, sys
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import run
trace, target, out, cpus = sys.argv[1:5]
s = run(RunConfig(trace=trace, target=target, output=out, timing="absolute", workers=1,
                  cpus=cpus or None, scrape_interval_s=0, progress=False), progress=None)
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
    later = lag[i - i.min() >= 1_000_000_000]  # the first second (connections opening) left out
    return {
        "lag_p50_ms": float(np.percentile(lag, 50) / 1e6),
        "lag_p99_ms": float(np.percentile(lag, 99) / 1e6),
        "lag_max_ms": float(lag.max() / 1e6),
        "lag_max_at_s": float((i[lag.argmax()] - i.min()) / 1e9),
        "lag_p99_after_1s_ms": float(np.percentile(later, 99) / 1e6)
        if later.size
        else float("nan"),
        "span_s": float((e.max() - s.min()) / 1e9),
    }


class BusyCores:
    """The host's busy cores (every process), sampled each second on a thread; ``peak`` is
    the busiest second, i.e. the streaming phase of a run rather than its set-up.
    ``steal_peak``: the most cores' worth of time the hypervisor took from this VM in one
    second (Linux ``steal``; 0 on bare metal), counted in ``peak`` too."""

    def __init__(self) -> None:
        self.peak = 0.0
        self.steal_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _times() -> tuple[float, float]:
        t = psutil.cpu_times()
        return float(sum(t) - t.idle - getattr(t, "iowait", 0.0)), float(getattr(t, "steal", 0.0))

    def _sample(self) -> None:
        (busy, steal), t = self._times(), time.monotonic()
        while not self._stop.wait(1.0):
            (busy2, steal2), now = self._times(), time.monotonic()
            self.peak = max(self.peak, (busy2 - busy) / (now - t))
            self.steal_peak = max(self.steal_peak, (steal2 - steal) / (now - t))
            busy, steal, t = busy2, steal2, now

    def __enter__(self) -> BusyCores:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_run(
    tmp: Path,
    url: str,
    workers: int,
    rate: float,
    seconds: float,
    salt: int,
    dashboard: bool = False,
    cpus: list[int] | None = None,
) -> dict:
    trace = uniform_trace(tmp / f"u-{workers}-{rate:g}.parquet", rate * workers, seconds)
    out = tmp / f"res-{workers}-{rate:g}"
    s = run(
        RunConfig(
            trace=str(trace),
            target=url,
            output=str(out),
            timing="absolute",
            workers=workers,
            cpus=",".join(map(str, cpus)) if cpus else None,
            salt=salt,
            scrape_interval_s=0,
            progress=dashboard,
        ),
        progress=(lambda line: None) if dashboard else None,
    )
    f = _lag_figures([out])
    return {
        "mode": f"{workers} worker{'s' if workers > 1 else ''}",
        "workers": workers,
        "rate": rate,
        "offered": rate * workers * OUT_TOKENS,
        "chunks": s.chunks,
        "ok": s.ok,
        "failed": s.failed,
        "chunks_per_s": s.chunks / f["span_s"],
        **f,
        "worker_loop_p99_ms": [float(np.percentile(w.loop_lag_ns(), 99) / 1e6) for w in s.workers],
        "cpu_us_per_chunk": sum(w.cpu_run_s for w in s.workers) / max(s.chunks, 1) * 1e6,
        "gc": s.gc,
    }


def independent_run(
    tmp: Path, url: str, n: int, rate: float, seconds: float, cpus: list[int] | None = None
) -> dict:
    outs, procs = [], []
    for k in range(n):
        trace = uniform_trace(tmp / f"i-{n}-{rate:g}-{k}.parquet", rate, seconds)
        out = tmp / f"ind-{n}-{rate:g}-{k}"
        outs.append(out)
        cpu = str(cpus[k]) if cpus else ""
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _ONE, str(trace), url, str(out), cpu],
                cwd=Path(__file__).resolve().parents[1],
            )
        )
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"independent worker exited with {p.returncode}")
    parts = [json.loads(Path(str(o) + ".json").read_text()) for o in outs]
    f = _lag_figures(outs)
    chunks = sum(p["chunks"] for p in parts)
    return {
        "mode": f"{n} independent",
        "workers": n,
        "rate": rate,
        "offered": rate * n * OUT_TOKENS,
        "chunks": chunks,
        "ok": sum(p["ok"] for p in parts),
        "failed": sum(p["failed"] for p in parts),
        "chunks_per_s": chunks / f["span_s"],
        **f,
        "worker_loop_p99_ms": [float(np.percentile(p["loop_lag"], 99) / 1e6) for p in parts],
        "cpu_us_per_chunk": sum(p["cpu_run_s"] for p in parts) / max(chunks, 1) * 1e6,
    }


def capacity(rows: list[dict], bound_ms: float) -> float:
    """The highest chunks/s (median over repeats) among the rates whose runs all delivered
    >= 99% of the offered chunks with the median schedule-lag p99 <= ``bound_ms``."""
    by_rate: dict[float, list[dict]] = {}
    for r in rows:
        by_rate.setdefault(r["rate"], []).append(r)
    good = [
        float(np.median([r["chunks_per_s"] for r in rs]))
        for rs in by_rate.values()
        if np.median([r["lag_p99_ms"] for r in rs]) <= bound_ms
        and all(
            r["failed"] == 0
            and r["chunks"] >= 0.99 * r["workers"] * int(r["rate"] * r["seconds"]) * OUT_TOKENS
            for r in rs
        )
    ]
    return max(good, default=0.0)


def _runs(args: argparse.Namespace, tmpd: Path, url: str, rows: list[dict]) -> None:
    plan = [
        (k, rate, w)
        for k in range(args.repeat)
        for rate in args.rates
        for w in (args.workers if k % 2 == 0 else args.workers[::-1])
    ]
    for rep, rate, w in plan:
        folder = tmpd / f"rep{rep}"
        folder.mkdir(exist_ok=True)
        runs = [
            partial(
                one_run,
                folder,
                url,
                w,
                rate,
                args.seconds,
                salt=w,
                dashboard=args.dashboard,
                cpus=args.client_cpus,
            )
        ]
        if args.independent and w > 1:
            runs.append(
                partial(independent_run, folder, url, w, rate, args.seconds, cpus=args.client_cpus)
            )
        for fn in runs:
            with BusyCores() as busy:
                r = fn()
            r["seconds"], r["host_busy_cores"], r["repeat"] = args.seconds, busy.peak, rep
            r["host_steal_cores"] = busy.steal_peak
            rows.append(r)
            _print(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[150, 200, 250, 300],
        help="requests/s per worker (x256 chunks/s)",
    )
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--sim-workers", type=int, default=6)
    ap.add_argument(
        "--sim-spin-us",
        type=float,
        default=0.0,
        help="the sim's yield-spin before each step (the fast profile's own is 400 us: "
        "every sim process then keeps a core busy, taking it from the clients)",
    )
    ap.add_argument("--bound-ms", type=float, default=2.0)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="sweeps of every rate (worker order alternating); capacity uses the medians",
    )
    ap.add_argument("--independent", action="store_true")
    ap.add_argument(
        "--dashboard",
        action="store_true",
        help="runs with the live dashboard (its plain-line form: stdout is not a terminal)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="workers on CPUs of their own (one per physical core, the last cores), "
        "the sim on the cores left (hyperthread siblings of the workers' left idle)",
    )
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows: list[dict] = []
    args.client_cpus, sim_cpus = _placement(max(args.workers)) if args.pin else (None, None)
    if args.pin:
        print(f"pinned: workers on CPUs {args.client_cpus}, sim on {sim_cpus}")
    print(
        f"commit {code_version()}; host: {os.cpu_count()} CPUs; sim in {args.sim_workers} processes (spin {args.sim_spin_us:g} us); "
        f"{args.seconds:g} s per run",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        profile = json.loads(
            (resources.files("agent_replay.engines.sim") / "profiles" / "fast.json").read_text()
        )
        profile["spin_ns"] = int(args.sim_spin_us * 1000)
        (tmpd / "fast.json").write_text(json.dumps(profile))
        with SimProcess(tmpd / "fast.json", workers=args.sim_workers, cpus=sim_cpus) as sim:
            _runs(args, tmpd, sim.url, rows)
    print()
    base = None
    for w in args.workers:
        c = capacity(
            [r for r in rows if r["mode"].endswith(("worker", "workers")) and r["workers"] == w],
            args.bound_ms,
        )
        base = c if base is None else base
        ratio = c / base if base else float("nan")
        print(
            f"capacity at schedule-lag p99 <= {args.bound_ms:g} ms, {w} worker(s): {c:,.0f} chunks/s"
            f" = {ratio:.2f}x of {args.workers[0]} (target >= {0.85 * w / args.workers[0]:.2f}x)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"commit": code_version(), "rows": rows}, indent=2))


def _placement(n: int) -> tuple[list[int], list[int]]:
    """CPUs for ``n`` pinned workers (the first thread of each of the last ``n`` physical
    cores) and for the sim (every allowed CPU not on those cores)."""
    allowed = allowed_cpus()
    cores = one_per_core(allowed)
    if len(cores) < n + 1:
        raise SystemExit(
            f"--pin: {len(cores)} physical cores, need {n} for workers and one for the sim"
        )
    clients = cores[-n:]
    used = {c for cpu in clients for c in siblings(cpu)}  # siblings(cpu) includes cpu
    return clients, [c for c in allowed if c not in used]


def _print(r: dict) -> None:
    loops = " ".join(f"{x:.2f}" for x in r["worker_loop_p99_ms"])
    print(
        f"{r['mode']:>15s} rate {r['rate']:>5g}/s/worker: {r['chunks_per_s']:>9,.0f} chunks/s of "
        f"{r['offered']:>9,.0f} offered, failed {r['failed']}, lag p50/p99/max "
        f"{r['lag_p50_ms']:.2f}/{r['lag_p99_ms']:.2f}/{r['lag_max_ms']:.1f} ms "
        f"(max at {r['lag_max_at_s']:.2f} s; p99 after 1 s {r['lag_p99_after_1s_ms']:.2f}), "
        f"loop p99 per worker [{loops}] ms, CPU {r['cpu_us_per_chunk']:.1f} us/chunk, "
        f"host busy (peak second) {r['host_busy_cores']:.1f} cores, stolen "
        f"{r['host_steal_cores']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
