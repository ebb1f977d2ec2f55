"""Hostile inputs against a checkout of agent-replay: each probe's exit code, stderr lines,
whether a traceback reached the user, peak RSS and wall time, in a child capped at
``--cap-gib`` of address space (RLIMIT_AS). Compare two checkouts:

    PYTHONPATH=$PWD /work/venv/bin/python benchmarks/probe_hostile_input.py --root OLD
    PYTHONPATH=$PWD /work/venv/bin/python benchmarks/probe_hostile_input.py --root .

The files are built by ``tests.faults.hostile`` (this checkout) into ``--work``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

SWEEP = """
trace = "t.parquet"
output = "out"
repeats = 1
[load]
axis = "concurrent_sessions"
points = [1]
[warmup]
enabled = false
[[targets]]
name = "down"
url = "http://127.0.0.1:9"
"""


MAKE = """
import sys
from pathlib import Path
from tests.faults import hostile
from tests.replay.helpers import chain_rows, write_rows
w = Path(sys.argv[1])
hostile.string_bomb(w / "string.parquet")
hostile.long_name(w / "name.parquet")
hostile.list_bomb(w / "list.parquet")
hostile.nan_arrival(w / "nan.parquet")
if not (w / "rows.parquet").exists():
    hostile.many_rows(w / "rows.parquet", 3_000_000, 300_000)
write_rows(w / "t.parquet", chain_rows(1, 1))
"""


def probe(root: Path, args: list[str], cap: int, timeout: float) -> tuple[str, ...]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)  # this child's own peak RSS
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    if wall >= timeout:
        err += "\n<killed at the timeout>"
    rss = ru.ru_maxrss / 1024
    lines = [x for x in err.splitlines() if x.strip()]
    tb = "yes" if "Traceback" in err else "no"
    last = lines[-1][:110] if lines else ""
    return str(p.returncode), str(len(lines)), tb, f"{rss:.0f}", f"{wall:.1f}", last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(HERE), help="checkout to run (default: this one)")
    ap.add_argument("--cap-gib", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    root = Path(a.root).resolve()
    work = Path(a.work or tempfile.mkdtemp(prefix="probe-"))
    work.mkdir(parents=True, exist_ok=True)
    cap = int(a.cap_gib * (1 << 30))
    # made in a child: a child's peak RSS starts at its parent's when forked
    subprocess.run(
        [sys.executable, "-c", MAKE, str(work)],
        cwd=HERE,
        check=True,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    files = {
        "string": work / "string.parquet",
        "long-name": work / "name.parquet",
        "list": work / "list.parquet",
        "nan": work / "nan.parquet",
    }
    rows = work / "rows.parquet"
    sweeps = {
        "nested": SWEEP.replace("[warmup]", "[run]\nx = " + "[" * 3000 + "]" * 3000 + "\n[warmup]"),
        "1e308": SWEEP.replace("points = [1]", "points = [1e308]"),
        "repeats=1e9": SWEEP.replace("repeats = 1", "repeats = 1000000000"),
        "duration=-5": SWEEP.replace("[warmup]", "[run]\nduration_s = -5\n[warmup]"),
        "speedup=0": SWEEP.replace("[warmup]", "[run]\nspeedup = 0\n[warmup]"),
    }
    probes: list[tuple[str, list[str]]] = []
    for name, f in files.items():
        kb = f.stat().st_size // 1024
        for cmd in (["traces", "validate"], ["traces", "inspect"]):
            probes.append((f"{name} ({kb} KB) {cmd[1]}", [*cmd, str(f)]))
        probes.append(
            (
                f"{name} ({kb} KB) run",
                [
                    "run",
                    str(f),
                    "--target",
                    "http://127.0.0.1:9",
                    "-o",
                    str(work / f"r-{name}"),
                    "--force",
                ],
            )
        )
    probes.append(
        (
            f"3M rows ({rows.stat().st_size >> 20} MB) run --max-sessions 1000",
            [
                "run",
                str(rows),
                "--target",
                "http://127.0.0.1:9",
                "--max-sessions",
                "1000",
                "-o",
                str(work / "r-rows"),
                "--force",
            ],
        )
    )
    for name, text in sweeps.items():
        (work / f"{name}.toml").write_text(text)
        probes.append((f"sweep {name}", ["sweep", str(work / f"{name}.toml"), "--force"]))
    print(f"root {root}, RLIMIT_AS {a.cap_gib:g} GiB")
    print("| probe | exit | stderr lines | traceback | peak RSS MiB | wall s | last line |")
    print("|---|---|---|---|---|---|---|")
    for name, args in probes:
        out = probe(root, args, cap, a.timeout)
        print(f"| {name} | " + " | ".join(out[:5]) + f" | {out[5].replace('|', '/')} |", flush=True)


if __name__ == "__main__":
    main()
