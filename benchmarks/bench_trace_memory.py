"""Peak RSS and wall time of ``traces inspect`` and ``run --duration`` on large synthetic
traces, each in a child process whose peak RSS is read back with ``wait4`` (a child killed
past ``--kill-gib`` is reported as such, so that a shared host is not taken down).

    .venv/bin/python benchmarks/bench_trace_memory.py --requests 1000000
    .venv/bin/python benchmarks/bench_trace_memory.py --subagents 100000

``--requests N``: a ``traces synth`` trace of about N requests (made once into ``--work``),
then ``traces inspect`` on it and ``run --duration 10 --max-think 0`` on it against the
simulated engine, with the seconds from the run's start to the engine's first request
(its ``/metrics`` polled every 50 ms); CPU seconds (user + system) beside wall time, as
the fairer figure on a shared host. ``--subagents N``: one session of N subagent streams
(2N+1 requests), then ``traces inspect``. The targets: inspect under 1 GiB and 60 s on
1M requests, and under 10 s on 100k subagents; the run under 1 GiB with its first
request within 10 s.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS_PER_REQUEST = 115_000 / 1_168_920
"""``traces synth`` (seed 1, defaults) makes about 10.2 requests per session."""


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(
    args: list[str], kill_gib: float, timeout: float, watch: object = None
) -> dict[str, object]:
    """Run ``agent-replay ARGS`` in a child: exit code, peak RSS (MiB), wall seconds, the
    last stderr line, and whether it was killed at the RSS cap or the timeout."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed: list[str] = []
    first: list[float] = []
    done = threading.Event()

    def guard() -> None:  # never reaps the child: wait4 below does, for its rusage
        while not done.is_set():
            if _rss_kb(p.pid) > kill_gib * (1 << 20):
                killed.append(f"RSS past {kill_gib:g} GiB")
                p.kill()
                return
            if time.monotonic() - t0 > timeout:
                killed.append(f"timeout {timeout:g} s")
                p.kill()
                return
            if watch is not None and not first and watch():  # type: ignore[operator]
                first.append(time.monotonic() - t0)
            time.sleep(0.05)

    g = threading.Thread(target=guard, daemon=True)
    g.start()
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    done.set()
    g.join()
    lines = [x for x in err.splitlines() if x.strip()]
    return {
        "rc": os.waitstatus_to_exitcode(status),
        "rss_mib": ru.ru_maxrss / 1024,
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "killed": killed[0] if killed else "",
        "first_request_s": first[0] if first else None,
        "last": lines[-1][:120] if lines else "",
    }


def synth(work: Path, requests: int) -> Path:
    sessions = max(1, round(requests * SESSIONS_PER_REQUEST))
    path = work / f"synth-{sessions}.parquet"
    if not path.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "traces",
                "synth",
                "-o",
                str(path),
                "--sessions",
                str(sessions),
                "--seed",
                "1",
            ],
            cwd=ROOT,
            check=True,
        )
    return path


def subagent_trace(work: Path, n: int) -> Path:
    path = work / f"subagents-{n}.parquet"
    if not path.exists():
        code = (
            "import sys; from pathlib import Path; "
            "from tests.traces.bigtraces import write_subagent_session; "
            "write_subagent_session(Path(sys.argv[1]), int(sys.argv[2]))"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(path), str(n)],
            cwd=ROOT,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seen_requests(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return False
    for line in text.splitlines():
        counted = line.startswith(
            (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting{",
                "vllm:request_success_total",
            )
        )
        if counted and float(line.rsplit(" ", 1)[1]) > 0:
            return True
    return False


def run_against_sim(
    trace: Path, work: Path, duration: float, kill_gib: float, timeout: float
) -> dict[str, object]:
    port = _free_port()
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "engines",
            "sim",
            "--port",
            str(port),
            "--profile",
            "fast",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return measure(
            [
                "run",
                str(trace),
                "--target",
                f"http://127.0.0.1:{port}",
                "--duration",
                f"{duration:g}",
                "--max-think",
                "0",
                "--no-progress",
                "-o",
                str(work / "run"),
                "--force",
            ],
            kill_gib,
            timeout,
            watch=lambda: _seen_requests(port),
        )
    finally:
        sim.terminate()
        sim.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, help="synth trace of about this many requests")
    ap.add_argument("--subagents", type=int, help="one session of this many subagents")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--work", default="/tmp/agent-replay-bench-memory")
    ap.add_argument("--kill-gib", type=float, default=4.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--skip-run", action="store_true")
    ap.add_argument("--skip-inspect", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    print(
        "| command | exit | peak RSS MiB | wall s | CPU s | first request s | killed | last line |"
    )
    print("|---|---|---|---|---|---|---|---|", flush=True)

    def row(name: str, r: dict[str, object]) -> None:
        fr = r["first_request_s"]
        print(
            f"| {name} | {r['rc']} | {r['rss_mib']:.0f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{'-' if fr is None else f'{fr:.1f}'} | {r['killed'] or '-'} | "
            f"{str(r['last']).replace('|', '/')} |",
            flush=True,
        )

    if a.requests:
        trace = synth(work, a.requests)
        if not a.skip_inspect:
            row(
                f"inspect {trace.name}",
                measure(["traces", "inspect", str(trace)], a.kill_gib, a.timeout),
            )
        if not a.skip_run:
            row(
                f"run --duration {a.duration:g} {trace.name}",
                run_against_sim(trace, work, a.duration, a.kill_gib, a.timeout),
            )
    if a.subagents:
        trace = subagent_trace(work, a.subagents)
        row(
            f"inspect {trace.name}",
            measure(["traces", "inspect", str(trace)], a.kill_gib, a.timeout),
        )


if __name__ == "__main__":
    main()
