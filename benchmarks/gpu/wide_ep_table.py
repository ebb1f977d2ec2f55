"""Single-GPU `standard` beside `wide-ep` with and without EPLB, from report JSONs.

    python benchmarks/gpu/wide_ep_table.py GPU_RESULTS WIDE_EP_RESULTS > wide-ep-vs-standard.md

GPU_RESULTS holds ``std-WORKLOAD.report.json`` (run_gpu.sh, one GPU), WIDE_EP_RESULTS holds
``wep-eplb-WORKLOAD.report.json`` and ``wep-noeplb-WORKLOAD.report.json`` (run_wide_ep.sh;
reports made with ``--gpus N``). Workloads: mooncake, agents, max-c64, max-c128.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from three_way import _load

WORKLOADS = {
    "mooncake": "Mooncake conversation slice, 240 s at x8 (same offered load everywhere)",
    "agents": "16 agents (4 mini-swe-agent sessions x4), session timing x2",
    "max-c64": "2048 in / 256 out at max rate, 64 in flight",
    "max-c128": "2048 in / 256 out at max rate, 128 in flight",
}
SERVERS = (
    ("std", "standard, 1 GPU"),
    ("wep-noeplb", "wide-ep, 2 GPUs, no EPLB"),
    ("wep-eplb", "wide-ep, 2 GPUs, EPLB"),
)


def _f(x: Any, digits: int = 0) -> str:
    return "n/a" if x is None else f"{float(x):,.{digits}f}"


def row(label: str, rep: dict[str, Any]) -> str:
    tp = rep.get("throughput") or {}
    gpus = tp.get("gpus") or 1
    out = tp.get("output_tokens_per_s")
    lat = rep.get("latency_ms") or {}
    ttft, tpot = lat.get("ttft") or {}, lat.get("tpot") or {}
    req = rep.get("requests") or {}
    return (
        f"| {label} | {req.get('ok')}/{req.get('total')} | {_f(out)} | "
        f"{_f(None if out is None else out / gpus)} | "
        f"{_f((rep.get('headline') or {}).get('p90_tps'))} | "
        f"{_f((rep.get('headline') or {}).get('median_tps'))} | {_f(ttft.get('p50'))} | "
        f"{_f(ttft.get('p90'))} | {_f(ttft.get('p99'))} | {_f(tpot.get('mean'), 2)} |"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    one, wide = Path(argv[0]), Path(argv[1])
    lines = [
        "# Wide-EP (2 GPUs) beside the single-GPU standard server",
        "",
        "Output tokens/s over the run; P90 TPS = the per-user decode speed 90% of requests "
        "reach; TTFT and TPOT in ms.",
        "",
    ]
    for w, title in WORKLOADS.items():
        rows = []
        for name, label in SERVERS:
            rep = _load((one if name == "std" else wide) / f"{name}-{w}.report.json")
            if rep:
                rows.append(row(label, rep))
        if not rows:
            continue
        lines += [
            f"## {w}: {title}",
            "",
            "| server | ok | out tok/s | out tok/s per GPU | P90 TPS | median TPS | "
            "TTFT p50 | TTFT p90 | TTFT p99 | TPOT mean |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    sys.stdout.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
