"""All benchmarks in one command; prints one markdown report and writes it to
benchmarks/results/latest.md.

    .venv/bin/python benchmarks/run_all.py            # the full set (~10-15 min here)
    .venv/bin/python benchmarks/run_all.py --quick    # one load point, no repeats

(a)+(b) Client capacity and timing accuracy, side by side in one run: the simulated engine on
core 0 writes one chunk per stream every 5 ms (offered load = streams x 200 chunks/s) and
records every chunk's write time; each client (us, ``vllm bench serve``, GuideLLM, AIPerf)
runs on core 1 with the same workload (128 in / 256 out tokens). Per run: the chunks/s the
server delivered (and % of offered), the client's CPU per chunk over the workload's window
(its whole process tree, read every 10 ms from the processes' CPU-time clocks; start-up,
its own requests before the workload and the work after the last chunk excluded; see
benchmarks/peers/harness.py) beside its CPU per chunk over the whole run (what a user pays),
and the client's own TTFT and ITL against the server's ground truth. Also with speculative multi-token chunks (1..4 tokens per chunk), and
our 1 vs 2 local workers. (c) proxy overhead and (d) trace/report speeds come from the
benchmarks/bench_*.py scripts when present. Peers are installed on first use into
~/.cache/agent-replay/peers/ (see benchmarks/peers/clients.py).

Figures are noisy: this is a 2-core machine shared with other work. Run it more than once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_replay.replay.provenance import code_version  # noqa: E402
from benchmarks.peers import clients as cl  # noqa: E402
from benchmarks.peers.harness import cores, read_truth, run_client, sim_server, write_profile  # noqa: E402

NAMES = {
    "ours": "agent-replay",
    "ours-aiohttp": "agent-replay (aiohttp client)",
    "ours-loop": "agent-replay (--timestamps loop)",
    "vllm": "vllm bench serve",
    "guidellm": "GuideLLM 0.8.1",
    "aiperf": "AIPerf 0.13.0",
    "floor": "floor: read + kernel stamp only",
    "floor-loop": "floor: read + loop stamp only",
}
INTERVAL_MS = 5.0
KERNEL_ARRIVAL = True
"""The engine's ground truth stamps each request's arrival from the kernel (``engines sim
--kernel-arrival``), so a TTFT's truth starts when the request reached the engine's host,
before its own ingress queue; ``--engine-first-read``: when its event loop first read it."""


def one(
    client: str, conc: int, n: int, spec: int, work: Path, workers: int = 1, label: str = ""
) -> dict[str, Any]:
    tag = f"{client}-c{conc}-s{spec}-w{workers}{label}"
    rundir = work / tag
    rundir.mkdir(parents=True, exist_ok=True)
    profile = write_profile(rundir / "profile.json", INTERVAL_MS, spec)
    gt = rundir / "gt.parquet"
    srv_core, cli_core = cores()
    if label == "-unpinned":
        srv_core = cli_core = ""  # the workers need both cores; the server shares them
    with sim_server(profile, gt, srv_core, kernel_arrival=KERNEL_ARRIVAL) as url:
        cmd, env = cl.command(client, url, conc, n, rundir, workers)
        run = run_client(cmd, cli_core, env, rundir / "client.log")
    truth = read_truth(gt).workload(n)
    run.cpu.save(rundir / "cpu.csv")
    before, upto = run.cpu.at(truth.t0), run.cpu.at(truth.t1)
    cpu = upto - before
    rep = cl.reported(client, rundir, truth)
    row: dict[str, Any] = {
        "client": NAMES[client] + (f" x{workers} workers" if workers > 1 else ""),
        "key": client,
        "conc": conc,
        "spec": spec,
        "rc": run.rc,
        "requests": truth.requests,
        "chunks_s": truth.chunks / truth.window_s if truth.window_s > 0 else 0.0,
        "offered": conc * 1000 / INTERVAL_MS,
        "cpu_us_chunk": cpu / truth.chunks * 1e6 if truth.chunks else None,
        "core": cpu / truth.window_s if truth.window_s > 0 else None,
        "cpu_before_s": before,
        "cpu_window_s": cpu,
        "cpu_after_s": run.total_cpu_s - upto,
        "cpu_total_s": run.total_cpu_s,
        "load1": run.load1,
        "steal": run.steal,
        "cpu_us_chunk_total": run.total_cpu_s / truth.chunks * 1e6 if truth.chunks else None,
        "gt_ttft": truth.ttft_mean_ms,
        "gt_ttft_first": truth.ttft_first_read_mean_ms,
        "gt_itl": truth.itl_mean_ms,
        "gt_itl_p99": truth.itl_p99_ms,
        "ttft": rep.get("ttft"),
        "itl": rep.get("itl"),
        "itl_p99": rep.get("itl_p99"),
        "lag_p99": None,
    }
    if client in cl.OURS:
        sc = cl.self_check(rundir)
        if sc.get("schedule_lag_p99_ns") is not None:
            row["lag_p99"] = sc["schedule_lag_p99_ns"] / 1e6
    if run.rc != 0:
        row["error"] = (
            run.log.strip().splitlines()[-1][:160] if run.log.strip() else f"exit {run.rc}"
        )
    print(
        f"  {tag}: {row['chunks_s']:,.0f} chunks/s, cpu/chunk {_f(row['cpu_us_chunk'])} us "
        f"(whole run {_f(row['cpu_us_chunk_total'])} us), rc {run.rc}",
        file=sys.stderr,
        flush=True,
    )
    return row


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _diff(a: Any, b: Any) -> str:
    """a - b in ms, signed; '-' when either is missing (NaN: ground truth without the column)."""
    if a is None or b is None or b != b:
        return "-"
    return f"{a - b:+.2f} ms"


def _pct(a: Any, b: Any) -> str:
    return "-" if a is None or b is None or not b else f"{(a / b - 1) * 100:+.0f}%"


def client_table(rows: list[dict[str, Any]]) -> str:
    ours = {_point(r): r for r in rows if r["key"] == "ours" and "workers" not in r["client"]}
    out = [
        "| client | streams | spec | chunks/s (% offered) | CPU us/chunk | vs ours | client core "
        "| TTFT mean ms (GT) | TTFT - GT | engine queue | ITL mean ms (GT) | ITL P99 ms (GT) "
        "| P99 err | sched. lag P99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = ours.get(_point(r))
        ratio = (
            "-"
            if base is None or not base["cpu_us_chunk"] or r["cpu_us_chunk"] is None
            else f"{r['cpu_us_chunk'] / base['cpu_us_chunk']:.2f}x"
        )
        err = f" ({r['error']})" if r.get("error") else ""
        out.append(
            f"| {r['client']}{err} | {r['conc']} | {'1-4 tok' if r['spec'] else '1 tok'} | "
            f"{r['chunks_s']:,.0f} ({r['chunks_s'] / r['offered'] * 100:.0f}%) | "
            f"{_f(r['cpu_us_chunk'], '{:.1f}')} | {ratio} | {_f(r['core'])} | "
            f"{_f(r['ttft'])} ({_f(r.get('gt_ttft_first'))}) | {_diff(r['ttft'], r.get('gt_ttft_first'))} | "
            f"{_diff(r.get('gt_ttft_first'), r['gt_ttft'])} | "
            f"{_f(r['itl'], '{:.3f}')} ({_f(r['gt_itl'], '{:.3f}')}) | "
            f"{_f(r['itl_p99'])} ({_f(r['gt_itl_p99'])}) | {_pct(r['itl_p99'], r['gt_itl_p99'])} | "
            f"{_f(r['lag_p99'])} |"
        )
    return "\n".join(out)


def _point(r: dict[str, Any]) -> tuple[int, int, int]:
    """A row's load point and repeat: rows of one point and repeat are compared."""
    return r["conc"], r["spec"], r.get("rep", 1)


def ratio_summary(rows: list[dict[str, Any]]) -> str:
    """Our CPU per chunk / each other client's, per repeat and their median, per stream
    count: in the window and over the whole run."""
    ours = {_point(r): r for r in rows if r["key"] == "ours" and "workers" not in r["client"]}
    out = [
        "| client | streams | ours / it, window: per repeat (median) "
        "| ours / it, whole run: per repeat (median) |",
        "|---|---|---|---|",
    ]
    seen: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["key"] != "ours":
            seen.setdefault((r["client"], r["conc"], r["spec"]), []).append(r)
    for (client, conc, _spec), rs in seen.items():
        cells = []
        for key in ("cpu_us_chunk", "cpu_us_chunk_total"):
            vals = [
                ours[_point(r)][key] / r[key]
                for r in rs
                if _point(r) in ours and r.get(key) and ours[_point(r)].get(key) is not None
            ]
            cells.append(
                ", ".join(f"{v:.2f}" for v in vals)
                + (f" ({statistics.median(vals):.2f})" if vals else "-")
            )
        out.append(f"| {client} | {conc} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    """Each client's CPU: in the window (the per-chunk figure above), before it (start-up)
    and after it (the end: metrics, reports, files), and per chunk over the whole run, with
    ours / that client for both."""
    ours = {_point(r): r for r in rows if r["key"] == "ours" and "workers" not in r["client"]}
    out = [
        "| client | streams | spec | CPU s before / window / after | CPU us/chunk, window "
        "| ours / it | CPU us/chunk, whole run | ours / it | host load (1 min) at start "
        "| steal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(base: dict[str, Any] | None, r: dict[str, Any], key: str) -> str:
        if base is None or not r.get(key) or base.get(key) is None:
            return "-"
        return f"{base[key] / r[key]:.2f}"

    for r in rows:
        base = ours.get(_point(r))
        out.append(
            f"| {r['client']} | {r['conc']} | {'1-4 tok' if r['spec'] else '1 tok'} | "
            f"{_f(r.get('cpu_before_s'))} / {_f(r.get('cpu_window_s'))} / {_f(r.get('cpu_after_s'))} | "
            f"{_f(r['cpu_us_chunk'], '{:.1f}')} | {ratio(base, r, 'cpu_us_chunk')} | "
            f"{_f(r.get('cpu_us_chunk_total'), '{:.1f}')} | {ratio(base, r, 'cpu_us_chunk_total')} | "
            f"{_f(r.get('load1'))} | {_f(r.get('steal'), '{:.1%}')} |"
        )
    return "\n".join(out)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    w = {r["client"]: r for r in rows}
    one_, two = w.get(NAMES["ours"]), w.get(NAMES["ours"] + " x2 workers")
    if not one_ or not two:
        return "(not run)"
    return (
        "| workers | chunks/s delivered | client cores used | chunks/s per client core |\n"
        "|---|---|---|---|\n"
        + "\n".join(
            f"| {k} | {r['chunks_s']:,.0f} | {_f(r['core'])} | "
            f"{r['chunks_s'] / r['core'] if r['core'] else 0:,.0f} |"
            for k, r in ((1, one_), (2, two))
        )
    )


def script(name: str, args: list[str], timeout: float = 600) -> str:
    path = ROOT / "benchmarks" / name
    if not path.exists():
        return f"(benchmarks/{name} is not in the repository yet)"
    try:
        p = subprocess.run(
            [sys.executable, str(path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return f"(benchmarks/{name} ran past {timeout:.0f} s)"
    body = p.stdout.strip() or p.stderr.strip()[-2000:]
    return (
        f"```\n{body}\n```"
        if p.returncode == 0
        else f"(exit {p.returncode})\n\n```\n{body[-1500:]}\n```"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="one load point per client, no extras")
    ap.add_argument(
        "--clients",
        default="ours,ours-loop,ours-aiohttp,vllm,guidellm,aiperf",
        help="comma-separated: ours (the defaults: fast client, kernel timestamps), "
        "ours-loop (--timestamps loop), ours-aiohttp (--http-client aiohttp), vllm, "
        "guidellm, aiperf",
    )
    ap.add_argument(
        "--streams", default=None, help="comma-separated stream counts (default 64,256)"
    )
    ap.add_argument("--no-install", action="store_true", help="skip peers that are not installed")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every client at every stream count, the clients' order "
        "alternated; the CPU ratios get a median over them",
    )
    ap.add_argument("--skip-scripts", action="store_true", help="skip (c) and (d)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep every run's files in DIR")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest.md"))
    ap.add_argument(
        "--engine-first-read",
        action="store_true",
        help="the ground truth's TTFT starts when the engine's event loop first read "
        "each request (its ingress queue left out), not at the kernel's receive "
        "stamp (engines sim --kernel-arrival, the default here)",
    )
    args = ap.parse_args(argv)
    global KERNEL_ARRIVAL
    KERNEL_ARRIVAL = not args.engine_first_read
    streams = [int(x) for x in (args.streams or ("256" if args.quick else "64,256")).split(",")]
    wanted = [c for c in args.clients.split(",") if c]
    avail = []
    for c in wanted:
        if c in cl.OURS or c in cl.FLOORS or cl.ensure(c, install=not args.no_install) is not None:
            avail.append(c)
        else:
            print(f"skipping {c}: not installed", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    spec_rows: list[dict[str, Any]] = []
    scale_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agent-replay-bench-") as tmp:
        work = Path(args.keep or tmp)
        for rep in range(args.repeat):
            for conc in streams:
                # alternated order: a drift of the host over a run falls on both sides
                for c in avail if rep % 2 == 0 else avail[::-1]:
                    row = one(
                        c, conc, 4 * conc, 0, work, label=f"-r{rep + 1}" if args.repeat > 1 else ""
                    )
                    row["rep"] = rep + 1
                    rows.append(row)
        spec_c = 64
        for c in (
            [x for x in avail if x in ("ours", "ours-loop", "ours-aiohttp", "vllm")]
            if not args.quick
            else []
        ):
            spec_rows.append(one(c, spec_c, 4 * spec_c, 3, work))
        if "ours" in avail and not args.quick:
            top = max(streams)
            scale_rows.append(one("ours", top, 4 * top, 0, work, workers=1, label="-unpinned"))
            scale_rows.append(one("ours", top, 4 * top, 0, work, workers=2, label="-unpinned"))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"# agent-replay benchmarks ({stamp})",
        f"Commit: {code_version()}. Machine: {platform.node()}, {platform.machine()}, {sys.platform}, Python "
        f"{platform.python_version()}; server on core 0, client on core 1 (taskset). "
        f"Rerun: `.venv/bin/python benchmarks/run_all.py{' --quick' if args.quick else ''}`. "
        "Noisy: a shared 2-core VM; compare rows of the same run, not across runs.",
        "## (a) client capacity and (b) timing accuracy, 5 ms between chunks per stream",
        "GT = the simulated engine's ground truth: chunk write times (per-token ITL) and, for "
        "TTFT, each request's first byte -> its first chunk written. The first byte is "
        + (
            "the kernel's receive stamp on the engine's socket"
            if KERNEL_ARRIVAL
            else "when the engine's event loop first read the request (--engine-first-read: the "
            "time its bytes waited in the engine's socket is left out, and shows as TTFT error)"
        )
        + ". 'TTFT - GT' = the client's TTFT mean minus that; 'engine queue' = the engine's own "
        "wait from the first byte to its request handler (mean), which is in the truth and so "
        "in every client's TTFT. Our TTFT counts from the request's send (sent_ns + connect_ns: "
        "after a new connection is open); the other clients' from their own stamps. "
        "CPU us/chunk = the CPU time of the client's whole process tree over the workload's "
        "window (the first of its N requests arriving -> the last chunk written; read from "
        "the processes' CPU-time clocks every 10 ms and interpolated to both ends) / chunks "
        "written for those N requests. 'vs ours' = that client's CPU per chunk divided by "
        "ours at the same point.",
        client_table(rows),
        "### client CPU: the window and the whole run",
        "'before' = start-up (imports, tokenizer, dataset or plan, a client's own "
        "requests before the workload), 'after' = the end (metrics, reports, result files); whole run = the "
        "client's wait4 CPU (user + system, every process) / the workload's chunks: what a "
        "user pays for this run. 'ours / it' = our CPU per chunk divided by that client's.",
        cpu_table(rows),
        "### our CPU per chunk / theirs, by repeat",
        ratio_summary(rows),
    ]
    if spec_rows:
        parts += [
            "### speculative multi-token chunks (1-4 tokens per chunk, mean about 2.5)",
            "ITL here is per token (docs/metrics.md). A client that takes one ITL sample per "
            "chunk reports the chunk gap instead, about 2.5x the per-token figure.",
            client_table(spec_rows),
        ]
    if scale_rows:
        parts += [
            "### one host: 1 vs 2 local workers (no pinning: the 2 workers and the engine "
            "share the 2 cores)",
            scaling_table(scale_rows),
        ]
    if not args.skip_scripts:
        parts += [
            "## (c) proxy overhead\n\n`.venv/bin/python benchmarks/bench_proxy.py "
            "--streams 100 --seconds 10`",
            script("bench_proxy.py", ["--streams", "100", "--seconds", "10"]),
            "## (d) trace import / inspect\n\n`.venv/bin/python benchmarks/bench_traces.py "
            "--repeat 1`",
            script("bench_traces.py", ["--repeat", "1"]),
            "## (d) report\n\n`.venv/bin/python benchmarks/bench_report.py --repeat 1`",
            script("bench_report.py", ["--repeat", "1"]),
        ]
    text = "\n\n".join(parts) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(
        json.dumps(
            {"stamp": stamp, "commit": code_version(), "rows": rows + spec_rows + scale_rows},
            indent=1,
            default=str,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
