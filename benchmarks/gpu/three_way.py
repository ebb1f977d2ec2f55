"""Our numbers beside vLLM's own /metrics and beside ``vllm bench serve``'s, from a GPU run.

    python benchmarks/gpu/three_way.py RESULTS_DIR > three-way.md   (also writes three-way.json)

RESULTS_DIR is the ``results`` folder of ``run_gpu.sh``: ``NAME.report.json`` per replay
(``agent-replay report --format json``), ``SRV-bench-cN.json`` (``vllm bench serve
--save-result --save-detailed``) and ``SRV-bench-cN.metrics-{before,after}.txt`` (/metrics
around the bench run). ``SRV-same-cN`` is our replay of bench's own prompts (recorded through
``agent-replay record --content full``), ``SRV-fixed-cN`` our replay of a token-id workload
of the same shape.

Means are compared, not percentiles: vLLM's TPOT histogram has its first bucket at 10 ms, so
at 2-4 ms per token every sample lands in that bucket and a bucket percentile says only
"under 10 ms"; the histogram's ``_sum / _count`` is the exact mean over the same requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent_replay.analysis.server_metrics import summarize  # noqa: E402
from agent_replay.engines.metrics_scrape import parse_metrics, rows_to_table  # noqa: E402

SERVERS = {"std": "standard", "ded": "dedicated-decode (MTP 3, synthetic 2.8)"}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _hist_mean_ms(server: dict[str, Any] | None, name: str) -> float | None:
    h = ((server or {}).get("histograms") or {}).get(name)
    if not h or not h.get("count"):
        return None
    return 1000.0 * float(h["sum"]) / float(h["count"])


def _metrics_delta(before: Path, after: Path) -> dict[str, Any] | None:
    rows = []
    for p in (before, after):
        try:
            text = p.read_text()
        except OSError:
            return None
        first, _, body = text.partition("\n")
        t_ns = int(first.split()[-1]) if first.startswith("# t_ns") else 0
        rows += parse_metrics(body if first.startswith("# t_ns") else text, t_ns)
    return summarize(rows_to_table(rows))


def ours(report: dict[str, Any]) -> dict[str, Any]:
    lat = report.get("latency_ms") or {}
    tpc = {int(k): int(v) for k, v in (report.get("tokens_per_chunk") or {}).items()}
    chunks = sum(tpc.values())
    server = report.get("server") or {}
    spec = server.get("spec_decode") or {}
    return {
        "requests_ok": (report.get("requests") or {}).get("ok"),
        "tpot_mean_ms": (lat.get("tpot") or {}).get("mean"),
        "tpot_p50_ms": (lat.get("tpot") or {}).get("p50"),
        "tpot_p90_ms": (lat.get("tpot") or {}).get("p90"),
        "itl_mean_ms": (lat.get("itl") or {}).get("mean"),
        "itl_p50_ms": (lat.get("itl") or {}).get("p50"),
        "chunk_gap_mean_ms": (lat.get("chunk_gap") or {}).get("mean"),
        "chunk_gap_p50_ms": (lat.get("chunk_gap") or {}).get("p50"),
        "ttft_mean_ms": (lat.get("ttft") or {}).get("mean"),
        "ttft_p50_ms": (lat.get("ttft") or {}).get("p50"),
        "ttft_p90_ms": (lat.get("ttft") or {}).get("p90"),
        "p90_tps": (report.get("headline") or {}).get("p90_tps"),
        "tokens_per_chunk_mean": (sum(k * v for k, v in tpc.items()) / chunks) if chunks else None,
        "output_tokens_per_s": (report.get("throughput") or {}).get("output_tokens_per_s"),
        "server_tpot_mean_ms": _hist_mean_ms(server, "tpot"),
        "server_itl_mean_ms": _hist_mean_ms(server, "itl"),
        "server_ttft_mean_ms": _hist_mean_ms(server, "ttft"),
        "server_tpot_count": ((server.get("histograms") or {}).get("tpot") or {}).get("count"),
        "server_acceptance_length": spec.get("acceptance_length"),
    }


def bench(result: dict[str, Any], server: dict[str, Any] | None) -> dict[str, Any]:
    itls = result.get("itls") or []
    outs = result.get("output_lens") or []
    chunks = sum(len(i) + 1 for i, o in zip(itls, outs, strict=False) if o)
    spec = (server or {}).get("spec_decode") or {}
    return {
        "requests_ok": result.get("completed"),
        "tpot_mean_ms": result.get("mean_tpot_ms"),
        "tpot_p50_ms": result.get("median_tpot_ms"),
        "tpot_p90_ms": result.get("p90_tpot_ms"),
        "itl_mean_ms": result.get("mean_itl_ms"),
        "itl_p50_ms": result.get("median_itl_ms"),
        "ttft_mean_ms": result.get("mean_ttft_ms"),
        "ttft_p50_ms": result.get("median_ttft_ms"),
        "ttft_p90_ms": result.get("p90_ttft_ms"),
        "tokens_per_chunk_mean": (sum(outs) / chunks) if chunks else None,
        "output_tokens_per_s": result.get("output_throughput"),
        "server_tpot_mean_ms": _hist_mean_ms(server, "tpot"),
        "server_itl_mean_ms": _hist_mean_ms(server, "itl"),
        "server_ttft_mean_ms": _hist_mean_ms(server, "ttft"),
        "server_tpot_count": (((server or {}).get("histograms") or {}).get("tpot") or {}).get(
            "count"
        ),
        "server_acceptance_length": spec.get("acceptance_length"),
    }


def _f(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None else f"{float(x):,.{digits}f}"


def _ratio(a: Any, b: Any) -> str:
    if a is None or b is None or not b:
        return "n/a"
    return f"{float(a) / float(b):.3f}"


def collect(res: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"fixed": {}, "replays": {}}
    for srv in SERVERS:
        for c in (1, 16):
            key = f"{srv}-c{c}"
            rep = _load(res / f"{srv}-fixed-c{c}.report.json")
            same = _load(res / f"{srv}-same-c{c}.report.json")
            br = _load(res / f"{srv}-bench-c{c}.json")
            bm = _metrics_delta(
                res / f"{srv}-bench-c{c}.metrics-before.txt",
                res / f"{srv}-bench-c{c}.metrics-after.txt",
            )
            out["fixed"][key] = {
                "same": ours(same) if same else None,
                "ours": ours(rep) if rep else None,
                "bench": bench(br, bm) if br else None,
            }
    for p in sorted(res.glob("*.report.json")):
        rep = _load(p)
        if rep:
            out["replays"][p.name[: -len(".report.json")]] = ours(rep)
    return out


CLIENTS = (
    ("same", "agent-replay, bench's prompts"),
    ("ours", "agent-replay, token ids"),
    ("bench", "vllm bench serve"),
)


def same_prompts(data: dict[str, Any]) -> list[str]:
    """Ours vs bench's TPOT on the same prompts, raw and with each divided by the server's own
    mean over its requests (what is left is the measurement's difference, not the server's
    run-to-run speed)."""
    rows = []
    for key, both in data["fixed"].items():
        same, b = both.get("same"), both.get("bench")
        if not same or not b:
            continue
        srv, c = key.rsplit("-c", 1)
        o_rel = _div(same["tpot_mean_ms"], same["server_tpot_mean_ms"])
        b_rel = _div(b["tpot_mean_ms"], b["server_tpot_mean_ms"])
        rows.append(
            f"| {srv} | {c} | {_f(same['tpot_mean_ms'], 3)} | {_f(b['tpot_mean_ms'], 3)} | "
            f"{_ratio(same['tpot_mean_ms'], b['tpot_mean_ms'])} | {_f(o_rel, 3)} | "
            f"{_f(b_rel, 3)} | {_ratio(o_rel, b_rel)} |"
        )
    if not rows:
        return []
    return [
        "## Same prompts: our TPOT beside vllm bench serve's",
        "",
        "Our replay of bench's recorded prompts, then bench with the same seed. 'vs server' "
        "= the client's mean TPOT / vLLM's histogram mean over that client's requests.",
        "",
        "| server | c | ours TPOT mean | bench TPOT mean | ours / bench | ours vs server | "
        "bench vs server | ours / bench, server speed divided out |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _div(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return float(a) / float(b)


def render(data: dict[str, Any]) -> str:
    lines = [
        "# Our numbers, vLLM's /metrics and `vllm bench serve`, same servers",
        "",
        "Fixed workload: 2048 prompt / 256 output tokens, no shared prefix, ignore_eos, "
        "max-rate at concurrency c. Times in ms; means unless marked. "
        "'server' = vLLM's own histogram over the same requests (sum/count).",
        "",
        "| server | c | client | TPOT mean | server TPOT mean | ratio | TPOT p50 | "
        "ITL mean | ITL p50 | ITL mean / TPOT mean | chunk gap p50 | tok/chunk | "
        "TTFT mean | server TTFT mean | accept. len | out tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, both in data["fixed"].items():
        srv, c = key.rsplit("-c", 1)
        for client, label in CLIENTS:
            r = both.get(client)
            if not r and client == "same":
                continue  # runs made before bench's prompts were recorded
            if not r:
                lines.append(f"| {srv} | {c} | {label} | (not run) |||||||||||||")
                continue
            gap = r.get("itl_p50_ms") if client == "bench" else r.get("chunk_gap_p50_ms")
            lines.append(
                f"| {srv} | {c} | {label} | {_f(r['tpot_mean_ms'], 3)} | "
                f"{_f(r['server_tpot_mean_ms'], 3)} | "
                f"{_ratio(r['tpot_mean_ms'], r['server_tpot_mean_ms'])} | "
                f"{_f(r['tpot_p50_ms'], 3)} | {_f(r['itl_mean_ms'], 3)} | "
                f"{_f(r['itl_p50_ms'], 3)} | {_ratio(r['itl_mean_ms'], r['tpot_mean_ms'])} | "
                f"{_f(gap, 3)} | {_f(r['tokens_per_chunk_mean'])} | "
                f"{_f(r['ttft_mean_ms'])} | {_f(r['server_ttft_mean_ms'])} | "
                f"{_f(r['server_acceptance_length'])} | {_f(r['output_tokens_per_s'], 0)} |"
            )
    lines += [
        "",
        "For vllm bench serve, 'ITL' is its per-chunk inter-token latency and the "
        "chunk-gap column repeats its ITL p50 (it has no per-token ITL).",
        "",
    ]
    lines += same_prompts(data)
    lines += [
        "## Every replay: ours beside the server's histograms",
        "",
        "| run | ok | P90 TPS | TPOT mean | server TPOT mean | ratio | ITL mean (per token) "
        "| server ITL mean (per step) | chunk gap mean | tok/chunk | TTFT p50 | TTFT p90 | "
        "TTFT mean | server TTFT mean | accept. len | out tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["replays"].items():
        lines.append(
            f"| {name} | {r['requests_ok']} | {_f(r['p90_tps'], 0)} | {_f(r['tpot_mean_ms'], 3)} | "
            f"{_f(r['server_tpot_mean_ms'], 3)} | "
            f"{_ratio(r['tpot_mean_ms'], r['server_tpot_mean_ms'])} | "
            f"{_f(r['itl_mean_ms'], 3)} | {_f(r['server_itl_mean_ms'], 3)} | "
            f"{_f(r['chunk_gap_mean_ms'], 3)} | {_f(r['tokens_per_chunk_mean'])} | "
            f"{_f(r['ttft_p50_ms'])} | {_f(r['ttft_p90_ms'])} | {_f(r['ttft_mean_ms'])} | "
            f"{_f(r['server_ttft_mean_ms'])} | {_f(r['server_acceptance_length'])} | "
            f"{_f(r['output_tokens_per_s'], 0)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: three_way.py RESULTS_DIR", file=sys.stderr)
        return 2
    res = Path(argv[0])
    data = collect(res)
    (res / "three-way.json").write_text(json.dumps(data, indent=2))
    sys.stdout.write(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
