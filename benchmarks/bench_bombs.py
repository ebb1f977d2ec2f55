"""Compressed request bodies beside live streams: the recorder's memory and the other
streams' chunk gaps.

The recorder (``agent-replay record``) runs as a process in front of
``tests.faults.streamserver``; ``--streams`` clients stream 100 chunks 5 ms apart, one
request after another, and half a second into each phase other bodies are posted:

* ``plain``: ``--bombs`` ordinary small chat bodies, uncompressed (the baseline);
* ``bombs``: a brotli, a zstd and a gzip bomb, each ``--bomb-mib`` MiB of zeros once decoded;
* ``big-plain`` / ``big-gzip``: a ``--big-mb`` MB chat body of word salad, as is and gzip.

Per phase: the live streams' chunk gaps (p50, p99, max, ms), the recorder's resident set
at the start of the phase and its peak during it (``VmHWM``, reset at the start), and what
each posted body got. The phases alternate ``--rounds`` times; the gap comparison is each
phase's against its baseline in the same run (bombs against plain, big-gzip against
big-plain). Timing numbers need a quiet host; on a shared one they say little below a few
ms.

    .venv/bin/python benchmarks/bench_bombs.py
    .venv/bin/python benchmarks/bench_bombs.py --rounds 1 --bomb-mib 256 --json out.json
    .venv/bin/python benchmarks/bench_bombs.py --recorder-arg=--max-decoded --recorder-arg=8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.bombs import BOMBS, Phase, Rig, gzipped, ordinary_body, pct, phase


def _row(p: Phase) -> dict[str, object]:
    return {
        "phase": p.name,
        "gaps": len(p.gaps),
        "p50_ms": round(pct(p.gaps, 50) * 1e3, 2),
        "p99_ms": round(pct(p.gaps, 99) * 1e3, 2),
        "max_ms": round(max(p.gaps, default=float("nan")) * 1e3, 1),
        "rss_start_mb": round(p.rss_before / 1e6),
        "rss_peak_mb": round(p.rss_peak / 1e6),
        "posted": [f"{x.name}: {x.status} in {x.seconds:.2f} s" for x in p.posted],
    }


async def main(args: argparse.Namespace) -> list[dict[str, object]]:
    t = time.monotonic()
    bombs = [(name, make(args.bomb_mib << 20), name) for name, make in BOMBS.items()]
    small = ordinary_body(2000)
    plain = [(f"plain-{i}", small, None) for i in range(len(bombs))]
    big = ordinary_body(int(args.big_mb * 1e6))
    big_gz = gzipped(big)
    print(
        f"bodies made in {time.monotonic() - t:.1f} s: bombs "
        + ", ".join(f"{n} {len(d):,} B" for n, d, _ in bombs)
        + f"; big {len(big):,} B, gzip {len(big_gz):,} B",
        file=sys.stderr,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        async with Rig(Path(tmp) / "trace", "--max-body", "64", *args.recorder_arg) as rig:
            for _ in range(args.rounds):
                for name, sends in (
                    ("plain", plain),
                    ("bombs", bombs),
                    ("big-plain", [("big", big, None)]),
                    ("big-gzip", [("big-gz", big_gz, "gzip")]),
                ):
                    p = await phase(rig, name, sends, streams=args.streams, seconds=args.seconds)
                    rows.append(_row(p))
                    print(json.dumps(rows[-1]), file=sys.stderr)
            code = await rig.stop()
        print(
            f"recorder exit {code}; its last line: {rig.stderr.decode().strip().splitlines()[-1:]}",
            file=sys.stderr,
        )
    return rows


def _table(rows: list[dict[str, object]]) -> str:
    out = [
        "| phase | gaps | p50 ms | p99 ms | max ms | RSS start MB | RSS peak MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['phase']} | {r['gaps']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['max_ms']} | {r['rss_start_mb']} | {r['rss_peak_mb']} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=3.0, help="per phase")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bomb-mib", type=int, default=1024)
    ap.add_argument("--big-mb", type=float, default=30.0)
    ap.add_argument(
        "--recorder-arg", action="append", default=[], help="passed to agent-replay record (repeat)"
    )
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    result = asyncio.run(main(a))
    print(_table(result))
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1))
