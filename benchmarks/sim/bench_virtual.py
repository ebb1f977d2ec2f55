"""Virtual-time replay speed: virtual seconds replayed per host second (and per CPU second).

    python benchmarks/sim/bench_virtual.py TRACE [--profile P] [--lanes 32] [--duration 3600]

Runs ``agent-replay run TRACE --engine sim:PROFILE --virtual`` with the InferenceX AgentX
preset and prints the run's virtual span, the host's wall and CPU seconds for the replay
(run.json's ``prediction``) and their ratios; then opens the folder with ``agent-replay
report --html`` (exit 0 and a page written, or the benchmark fails) and times that too.
The target: a 1-hour AgentX replay at 32 lanes in under a minute of host time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument(
        "--profile", default=str(ROOT / "benchmarks/results/sim/h100-solo-standard-ladder.json")
    )
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--duration", type=float, default=3600.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "v"
        t = time.monotonic()
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "run",
                args.trace,
                "--engine",
                f"sim:{args.profile}",
                "--virtual",
                "--api",
                "completions",
                "--preset",
                "inferencex-agentx",
                "--concurrency",
                str(args.lanes),
                "--duration",
                str(args.duration),
                "--min-duration",
                "0",
                "-o",
                str(out),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
        )
        command_s = time.monotonic() - t
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        meta = json.loads((out / "run.json").read_text())
        html = Path(tmp) / "report.html"
        t = time.monotonic()
        rep = subprocess.run(
            [sys.executable, "-m", "agent_replay", "report", str(out), "--html", str(html)],
            capture_output=True,
            text=True,
        )
        report_s = time.monotonic() - t
        if rep.returncode != 0 or not html.is_file() or html.stat().st_size == 0:
            print(f"report failed ({rep.returncode}): {rep.stderr}", file=sys.stderr)
            return rep.returncode or 1
        html_bytes = html.stat().st_size
    pred = meta["prediction"]
    span = meta["summary"]["wall_s"]
    print(
        json.dumps(
            {
                "virtual_s": round(span, 1),
                "requests_ok": meta["summary"]["ok"],
                "host_wall_s": pred["host_wall_s"],
                "host_cpu_s": pred["host_cpu_s"],
                "command_wall_s": round(command_s, 1),
                "report_html_s": round(report_s, 1),
                "html_bytes": html_bytes,
                "virtual_per_host_s": round(span / pred["host_wall_s"], 1),
                "virtual_per_cpu_s": round(span / pred["host_cpu_s"], 1),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
