"""Benchmark: what the GPU telemetry sampler costs, at 10 Hz on 8 GPUs by default.

The sampler runs as in a replay: ``engines.telemetry.TelemetryProcess``, its own process,
writing gpu_telemetry.parquet at the end. Sources:

  fake   engines.telemetry.fake.FakeNvml with --gpus devices (the NVML calls are answered in
         Python: a real driver's calls cost differently, usually more, so this measures the
         sampler's own loop, row keeping and Parquet write, not NVML)
  real   the host's NVML (nvidia-ml-py, or the bindings vLLM ships): every GPU it sees
  dcgm   a DCGM exporter page for --gpus GPUs (the recorded H200 page's metrics repeated)
         served on loopback from this process, fetched and parsed every tick

Reported per source and round: reads per second (a read = one row per GPU), the sampler
process's CPU time over its wall time (its own accounting, and psutil's view of the whole
process from outside, start-up and Parquet write included), the time one read takes (mean,
max), missed ticks, rows, and for real/fake the energy counter against the power integral
over the sampled span (analysis.gpu_energy). Rounds interleave the sources.

    .venv/bin/python benchmarks/bench_telemetry.py [--source fake,dcgm] [--gpus 8]
        [--interval 0.1] [--seconds 20] [--repeat 3] [--json FILE] [--load CMD]

On a GPU host ``benchmarks/gpu/run_telemetry.sh`` runs it with ``--source real,fake,dcgm``
and a matrix-multiply load on every GPU during the real rounds (the energy cross-check
under load).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGE = ROOT / "tests" / "engines" / "data" / "dcgm_exporter_h200.txt"


def dcgm_page(gpus: int) -> str:
    """The recorded page's GPU 0 samples repeated for ``gpus`` GPUs."""
    lines = PAGE.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("#"):
            out.append(line)
        elif 'gpu="0"' in line:
            for g in range(gpus):
                out.append(re.sub(r'gpu="0"', f'gpu="{g}"', line).replace("nvidia0", f"nvidia{g}"))
    return "\n".join(out) + "\n"


class Page:
    def __init__(self, text: str) -> None:
        body = text.encode()

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def one(
    source: str, gpus: int, interval: float, seconds: float, folder: Path, load: str | None = None
) -> dict[str, Any]:
    from agent_replay.analysis.gpu_energy import summarize
    from agent_replay.engines.telemetry import Source, TelemetryProcess
    from agent_replay.engines.telemetry.fake import FakeNvml

    page = None
    nvml = None
    if source == "fake":
        src = Source("nvml")
        nvml = FakeNvml(gpus)
    elif source == "real":
        src = Source("nvml")  # every GPU the host has
    else:
        page = Page(dcgm_page(gpus))
        src = Source("dcgm", url=page.url)
    out = folder / f"{source}.parquet"
    tel = TelemetryProcess(src, interval, out, nvml=nvml)
    t_start = time.monotonic()
    loader = None
    if load and source == "real":
        loader = subprocess.Popen(load, shell=True, start_new_session=True)
        time.sleep(min(5.0, seconds / 4))  # the load is running before the sampler starts
    try:
        if not tel.start():
            return {"source": source, "off": tel.off_reason}
        proc = psutil.Process(tel._proc.pid)  # the sampler process, seen from outside
        cpu0 = proc.cpu_times()
        t0 = time.monotonic_ns()
        tel.set_t0(t0)
        time.sleep(seconds)
        cpu1 = proc.cpu_times()
        info = tel.stop()
    finally:
        if page is not None:
            page.close()
        if loader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(loader.pid, signal.SIGTERM)
            loader.wait(timeout=30)
    outside = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / seconds
    table = pq.read_table(out)
    row: dict[str, Any] = {
        "source": source,
        "gpus": len(info["gpus"]),
        "interval_s": interval,
        "seconds": seconds,
        "rows": table.num_rows,
        **info["cost"],
        "cpu_percent_outside": round(100 * outside, 3),
        "start_to_stop_s": round(time.monotonic() - t_start, 2),
        "gpu_names": sorted({g["name"] for g in info["gpus"]}),
        "load": bool(loader),
    }
    ts = table.column("t_ns").to_pylist()
    if source != "dcgm" and len(ts) > 2:
        g = summarize(table, (min(ts), max(ts)), output_tokens=0, requests_ok=0)
        row["energy_counter_j"] = g["energy_counter_j"]
        row["energy_power_j"] = g["energy_power_j"]
        row["energy_diff_pct"] = g["energy_diff_pct"]
        row["energy_diff_pct_per_gpu"] = [x["energy_diff_pct"] for x in g["gpus"]]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="fake,dcgm", help="comma list of fake, real, dcgm")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of fake and dcgm (real: all)")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write every row here")
    ap.add_argument(
        "--load",
        default=None,
        metavar="CMD",
        help="a shell command run beside each 'real' round (e.g. a GPU load), "
        "killed when the round ends",
    )
    args = ap.parse_args(argv)
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    bad = [s for s in sources if s not in ("fake", "real", "dcgm")]
    if bad:
        print(f"error: --source {bad[0]!r}: expected fake, real or dcgm", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            order = sources[r % len(sources) :] + sources[: r % len(sources)]
            for s in order:
                row = one(s, args.gpus, args.interval, args.seconds, Path(tmp), args.load)
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        f"# GPU telemetry sampler cost ({platform.node()}, {psutil.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; {args.seconds:g} s per round, "
        f"interval {args.interval:g} s)\n"
    )
    print(
        "| source | GPUs | rounds | reads/s | CPU % of a core (own / outside) | read ms mean "
        "(max) | missed ticks | energy counter vs power |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in sources:
        got = [x for x in rows if x["source"] == s and "off" not in x]
        if not got:
            off = next((x["off"] for x in rows if x["source"] == s), "?")
            print(f"| {s} | - | 0 | off: {off} | | | | |")
            continue

        def med(key: str, got: list[dict[str, Any]] = got) -> float:
            return statistics.median(x[key] for x in got)

        diffs = [x.get("energy_diff_pct") for x in got if x.get("energy_diff_pct") is not None]
        print(
            f"| {s} | {got[0]['gpus']} | {len(got)} | {med('samples_per_s'):.2f} | "
            f"{med('cpu_percent'):.2f} / {med('cpu_percent_outside'):.2f} | "
            f"{med('read_ms_mean'):.3f} ({max(x['read_ms_max'] for x in got):.3f}) | "
            f"{sum(x['missed_ticks'] for x in got)} | "
            + (f"{statistics.median(diffs):+.2f}% (median)" if diffs else "-")
            + " |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
