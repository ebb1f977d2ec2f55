"""Every measured figure of docs/gpu.md, computed from the committed files of the one-H200 run
(benchmarks/results/gpu/2026-12-03-h200-mtp/): the per-run index of the sweep (which
``agent-replay sweep ... --report-only --reindex`` rebuilds from the per-run folders), the
per-request Parquet files, the servers' /metrics and logs, and `vllm bench serve`'s JSON.

    python benchmarks/gpu/mtp_doc.py                     # print the doc's figure blocks
    python benchmarks/gpu/mtp_doc.py --check docs/gpu.md --readme README.md
                                                          # exit 1 naming each block it lacks

Each block is a table or sentence that docs/gpu.md must contain verbatim; a changed number
in the doc (or in the data) makes ``--check`` fail.

Paired effects: per repeat r, ``ln(B_r / A_r)``; the estimate is ``exp(mean) - 1`` and the
interval ``exp(mean +- t * sd / sqrt(n)) - 1`` (Student-t, n - 1 degrees of freedom). The
p-values (two-sided paired t on the log ratios) are Holm-adjusted over every comparison of
the table; each interval is at Holm's level for its rank (1 - 0.05 / (m - k + 1) for the
k-th smallest p of m), so it excludes 0 where Holm rejects, up to the first non-rejection.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from agent_replay.analysis.replicates import holm, t_two_sided_p

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-03-h200-mtp"
TARGETS = ("standard", "mtp", "dedicated-decode")
POINTS = (1, 2, 8, 32)
METRICS = (("p90_tps", "P90 TPS"), ("output_tps_per_gpu", "output tok/s"),
           ("ttft_p99_ms", "TTFT p99"))
ALPHA = 0.05


# ---- statistics (pure functions) --------------------------------------------------------

def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value: P(|T| >= q) = 1 - level (bisection on the CDF)."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > 1 - level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Effect:
    """``other`` relative to ``base`` (ratio - 1), with its interval at ``level``."""

    estimate: float
    low: float
    high: float
    p: float
    p_holm: float
    level: float
    n: int


def log_ratio_effects(pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
                      alpha: float = ALPHA) -> list[Effect]:
    """Paired log-ratio effects of each (base, other) pair of per-repeat values, with
    Holm-adjusted p-values and intervals at Holm's level for each one's rank."""
    stats = []
    for base, other in pairs:
        d = np.log(np.asarray(other, dtype=np.float64) / np.asarray(base, dtype=np.float64))
        n = int(d.size)
        mean, sd = float(d.mean()), float(d.std(ddof=1))
        t = math.inf if sd == 0 else mean / (sd / math.sqrt(n))
        stats.append((mean, sd, n, t_two_sided_p(t, n - 1)))
    adjusted = [float(q or 0.0) for q in holm([s[3] for s in stats])]
    rank = {i: k for k, i in enumerate(sorted(range(len(stats)), key=lambda i: stats[i][3]))}
    out = []
    for i, (mean, sd, n, p) in enumerate(stats):
        level = 1 - alpha / (len(stats) - rank[i])
        half = t_quantile(level, n - 1) * sd / math.sqrt(n)
        out.append(Effect(math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half),
                          p, adjusted[i], level, n))
    return out


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Geometric mean with its 95% Student-t interval on the logs (the frontier's
    definition, ``analysis.replicates.mean_ci``)."""
    from agent_replay.analysis.replicates import mean_ci as _mean_ci

    ci = _mean_ci(list(values))
    assert ci.estimate is not None and ci.low is not None and ci.high is not None
    return ci.estimate, ci.low, ci.high


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``values``."""
    v = sorted(values)
    return v[max(0, math.ceil(q / 100 * len(v)) - 1)]


# ---- data --------------------------------------------------------------------------------

def index(run: Path = RUN) -> list[dict[str, object]]:
    return pq.read_table(run / "mtp/index.parquet").to_pylist()


def per_repeat(rows: list[dict[str, object]], target: str, point: int, metric: str
               ) -> list[float]:
    """The metric of each repeat 0..4, in repeat order."""
    got = {int(str(r["repeat"])): float(str(r[metric])) for r in rows
           if r["target"] == target and float(str(r["point"])) == point}
    return [got[k] for k in sorted(got)]


def request_tpots(run_dir: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """(sent_ns, TPOT ms) of the measured requests of a run (ok, >= 2 tokens, not warm-up),
    and the run's warm-up length in ns."""
    t = pq.read_table(run_dir / "requests", columns=["sent_ns", "first_token_ns", "end_ns",
                                                     "completion_tokens", "status", "warmup"])
    d = t.to_pydict()
    sent, tpot = [], []
    for s, f, e, n, st, w in zip(d["sent_ns"], d["first_token_ns"], d["end_ns"],
                                 d["completion_tokens"], d["status"], d["warmup"], strict=True):
        if st == "ok" and not w and n and n >= 2 and f is not None and e is not None:
            sent.append(s)
            tpot.append((e - f) / (n - 1) / 1e6)
    meta = json.loads((run_dir / "run.json").read_text())
    return np.asarray(sent, dtype=np.float64), np.asarray(tpot), float(meta["warmup_ns"])


def halves_ratio(run_dir: Path) -> float | None:
    """Median TPOT of the requests sent in the second half of the measured window over the
    first half's (None when a half has fewer than 3 requests)."""
    sent, tpot, warm = request_tpots(run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    end = float(meta["options"]["duration_s"]) * 1e9
    mid = (warm + end) / 2
    a, b = tpot[sent < mid], tpot[sent >= mid]
    if a.size < 3 or b.size < 3:
        return None
    return float(np.median(b) / np.median(a))


def gauge(run_dir: Path, name: str) -> np.ndarray:
    """The values of one /metrics gauge scraped during a run's measured window."""
    t = pq.read_table(run_dir / "server_metrics.parquet").to_pydict()
    warm = json.loads((run_dir / "run.json").read_text())["warmup_ns"]
    return np.asarray([v for n, ts, v in zip(t["name"], t["t_ns"], t["value"], strict=True)
                       if n == name and ts >= warm], dtype=np.float64)


def cache_info(metrics_file: Path) -> dict[str, str]:
    """The labels of vllm:cache_config_info in a /metrics snapshot."""
    for line in metrics_file.read_text().splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line))
    raise ValueError(f"{metrics_file}: no vllm:cache_config_info")


def non_default_args(server_log: Path) -> dict[str, str]:
    """vLLM's 'non-default args' line of a server log, as text per key."""
    for line in server_log.read_text().splitlines():
        if "non-default args:" in line:
            body = line.split("non-default args:", 1)[1]
            return dict(re.findall(r"'(\w+)': ('[^']*'|\{[^}]*\}|[^,}]+)", body))
    raise ValueError(f"{server_log}: no 'non-default args' line")


# ---- blocks ------------------------------------------------------------------------------

def _n(v: float, digits: int) -> str:
    return f"{v:,.{digits}f}"


def _pct(v: float) -> str:
    return f"{v * 100:+.1f}%"


def _digits(metric: str) -> int:
    return 0 if metric == "output_tps_per_gpu" else 1


def means_table(rows: list[dict[str, object]]) -> str:
    head = ("| target | sessions | P90 TPS | output tok/s per GPU | TTFT p99 ms |\n"
            "|---|---|---|---|---|")
    lines = [head]
    for t in TARGETS:
        for p in POINTS:
            cells = []
            for m, _ in METRICS:
                mean, lo, hi = mean_ci(per_repeat(rows, t, p, m))
                d = _digits(m)
                cells.append(f"{_n(mean, d)} [{_n(lo, d)}, {_n(hi, d)}]")
            lines.append(f"| {t} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


COMPARISONS = (("mtp", "standard"), ("dedicated-decode", "mtp"))


def effects(rows: list[dict[str, object]]) -> dict[tuple[str, str, int, str], Effect]:
    keys, pairs = [], []
    for other, base in COMPARISONS:
        for p in POINTS:
            for m, _ in METRICS:
                keys.append((other, base, p, m))
                pairs.append((per_repeat(rows, base, p, m), per_repeat(rows, other, p, m)))
    return dict(zip(keys, log_ratio_effects(pairs), strict=True))


def _verdict(e: Effect, metric: str) -> str:
    if e.p_holm >= ALPHA:
        return "no claim"
    better = (e.estimate > 0) == (metric != "ttft_p99_ms")
    return "better" if better else "worse"


def effects_table(rows: list[dict[str, object]]) -> str:
    eff = effects(rows)
    lines = ["| comparison | sessions | P90 TPS | output tok/s per GPU | TTFT p99 |",
             "|---|---|---|---|---|"]
    for other, base in COMPARISONS:
        for p in POINTS:
            cells = []
            for m, _ in METRICS:
                e = eff[(other, base, p, m)]
                cells.append(f"{_pct(e.estimate)} [{_pct(e.low)}, {_pct(e.high)}] "
                             f"p={e.p_holm:.3f} {_verdict(e, m)}")
            lines.append(f"| {other} vs {base} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_table(rows: list[dict[str, object]]) -> str:
    """The README's short form of the effects table: estimates and Holm verdicts."""
    eff = effects(rows)
    lines = ["| comparison | sessions | P90 TPS | output tok/s per GPU | TTFT p99 |",
             "|---|---|---|---|---|"]
    for other, base in COMPARISONS:
        for p in POINTS:
            cells = [f"{_pct(eff[(other, base, p, m)].estimate)} "
                     f"{_verdict(eff[(other, base, p, m)], m)}" for m, _ in METRICS]
            lines.append(f"| {other} vs {base} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_sentence(rows: list[dict[str, object]]) -> str:
    """Which points another point of the same target beats on both P90 TPS and output
    tokens/s per GPU (means)."""
    beaten = []
    for t in TARGETS:
        m = {p: (mean_ci(per_repeat(rows, t, p, "p90_tps"))[0],
                 mean_ci(per_repeat(rows, t, p, "output_tps_per_gpu"))[0]) for p in POINTS}
        for p in POINTS:
            by = [q for q in POINTS if q != p and m[q][0] > m[p][0] and m[q][1] > m[p][1]]
            if by:
                beaten.append(f"{t} at {p} (beaten by its {', '.join(map(str, by))})")
    return ("Points that another point of the same target beats on both P90 TPS and output "
            "tokens/s per GPU: " + "; ".join(beaten) + ".")


def waiting_sentence(run: Path = RUN) -> str:
    parts = []
    for t in TARGETS:
        running = [float(gauge(run / f"mtp/runs/{t}/concurrent_sessions=32/r{r}",
                               "vllm:num_requests_running").mean()) for r in range(5)]
        waiting = [gauge(run / f"mtp/runs/{t}/concurrent_sessions=32/r{r}",
                         "vllm:num_requests_waiting") for r in range(5)]
        parts.append(f"{t} {np.mean(running):.1f} running and "
                     f"{np.mean([w.mean() for w in waiting]):.1f} waiting "
                     f"(at most {max(w.max() for w in waiting):.0f})")
    return ("At 32 sessions, scraped once a second over the measured windows (mean of the "
            "5 runs): " + "; ".join(parts) + ".")


def steadiness_sentence(rows: list[dict[str, object]], run: Path = RUN) -> str:
    ratios = []
    for r in rows:
        v = halves_ratio(run / "mtp" / str(r["path"]))
        ratios.append(math.nan if v is None else abs(v - 1))
    known = [(r, v) for r, v in zip(rows, ratios, strict=True) if not math.isnan(v)]
    ratios = [v for _, v in known]
    cold = sum(1 for r in rows if r["cold_start"])
    by_point = []
    for p in POINTS:
        vals = [x for r, x in known if float(str(r["point"])) == p]
        by_point.append(f"{sum(1 for x in vals if x <= 0.10)} of {len(vals)} at {p}")
    return (f"Median TPOT of the requests sent in the second half of a measured window "
            f"against the first half's: within 10% in {sum(1 for v in ratios if v <= 0.10)} "
            f"of {len(ratios)} runs ({', '.join(by_point)} sessions; median difference "
            f"{np.median(ratios) * 100:.1f}%, largest {max(ratios) * 100:.1f}%); "
            f"{cold} of {len(rows)} runs flagged as a cold start.")


def kv_usage_sentence(rows: list[dict[str, object]], run: Path = RUN) -> str:
    best = (-1.0, "", 0.0)
    for r in rows:
        u = gauge(run / "mtp" / str(r["path"]), "vllm:kv_cache_usage_perc")
        if u.size and float(u.max()) > best[0]:
            best = (float(u.max()), str(r["target"]), float(str(r["point"])))
    return (f"The highest KV cache use any server reported in a measured window was "
            f"{best[0] * 100:.1f}% ({best[1]} at {best[2]:g} sessions).")


def env_sentence(run: Path = RUN) -> str:
    text = (run / "logs/env.txt").read_text()
    vllm = re.search(r"^vllm (\S+) torch (\S+)$", text, re.M)
    driver = re.search(r"Driver Version: (\S+)", text)
    gpu = re.search(r"\|\s+\d+\s+(NVIDIA \S+)", text)
    cuda = re.search(r"CUDA Version: (\S+)", text)
    python = re.search(r"^Python (\S+)$", text, re.M)
    assert vllm and driver and gpu and cuda and python, f"{run}/logs/env.txt: lines missing"
    return (f"vLLM {vllm.group(1)} (torch {vllm.group(2)}, Python {python.group(1)}), one "
            f"{gpu.group(1)}, driver {driver.group(1)}, CUDA {cuda.group(1)}.")


def kv_table(run: Path = RUN) -> str:
    lines = ["| profile | KV cache bytes | KV tokens | blocks of 16 | gpu-memory-utilization "
             "| max-num-seqs | GPU memory of its engine |", "|---|---|---|---|---|---|---|"]
    mem = [line.split(", ") for line in
           (run / "logs/gpu-memory.csv").read_text().splitlines()[1:]]
    engines = {}
    for name in ("std", "mtp", "ded"):
        for line in (run / f"logs/{name}.server.log.lines").read_text().splitlines():
            m = re.search(r"\(EngineCore pid=(\d+)\)", line)
            if m:
                engines[name] = m.group(1)
                break
    for name, t in zip(("std", "mtp", "ded"), TARGETS, strict=True):
        c = cache_info(run / f"results/{name}.metrics-start.txt")
        args = non_default_args(run / f"logs/{name}.server.log.lines")
        used = next(m for pid, m in mem if pid == engines[name])
        seqs = args.get("max_num_seqs", "vLLM's default")
        lines.append(f"| {t} | {int(c['kv_cache_memory_bytes']) / 2**30:.0f} GiB | "
                     f"{int(c['kv_cache_size_tokens']):,} | {int(c['num_gpu_blocks']):,} | "
                     f"{c['gpu_memory_utilization']} | {seqs} | {used} |")
    return "\n".join(lines)


def bench_overlap(run: Path = RUN) -> dict[str, float]:
    """Both clients' spans on CLOCK_MONOTONIC (s): bench's first request sent to its last
    answer ended, ours likewise, and their overlap."""
    b = json.loads((run / "results/ab-c8-bench.json").read_text())
    b_start = min(b["start_times"])
    b_end = max(s + t + sum(i) for s, t, i in zip(b["start_times"], b["ttfts"], b["itls"],
                                                   strict=True))
    meta = json.loads((run / "results/ab-c8-ours/run.json").read_text())
    t0 = meta["clock"]["t0_monotonic_ns"]
    o = pq.read_table(run / "results/ab-c8-ours/requests", columns=["sent_ns", "end_ns"])
    o_start = (t0 + min(o.column("sent_ns").to_pylist())) / 1e9
    o_end = (t0 + max(o.column("end_ns").to_pylist())) / 1e9
    clock = (run / "results/ab-c8.clock.txt").read_text().splitlines()
    launched = float(clock[0].split(" wall ")[1].split()[0])
    return {"bench_start": b_start, "bench_end": b_end, "ours_start": o_start,
            "ours_end": o_end, "overlap": min(b_end, o_end) - max(b_start, o_start),
            "bench_startup": b_start - launched}


def bench_sentence(run: Path = RUN) -> str:
    o = bench_overlap(run)
    return (f"`vllm bench serve` took {o['bench_startup']:.1f} s from its launch to its first "
            f"request; ours started {o['ours_start'] - o['bench_start']:.1f} s after that "
            f"request. Bench's requests spanned {o['bench_end'] - o['bench_start']:.1f} s, ours "
            f"{o['ours_end'] - o['ours_start']:.1f} s; the two overlapped for "
            f"{o['overlap']:.1f} s (both sides' per-request timestamps, CLOCK_MONOTONIC).")


def bench_table(run: Path = RUN) -> str:
    b = json.loads((run / "results/ab-c8-bench.json").read_text())
    b_tpot = [(sum(i) / (n - 1)) * 1e3 for i, n in zip(b["itls"], b["output_lens"], strict=True)]
    t = pq.read_table(run / "results/ab-c8-ours/requests").to_pydict()
    o_tpot = [(e - f) / (n - 1) / 1e6 for f, e, n in
              zip(t["first_token_ns"], t["end_ns"], t["completion_tokens"], strict=True)]
    tokens = sum(sum(c) for c in t["chunk_tokens"])
    chunks = sum(len(c) for c in t["chunk_tokens"])
    ratio = b["mean_itl_ms"] / b["mean_tpot_ms"]
    # the requests that started and ended while both clients were running
    ov = bench_overlap(run)
    lo, hi = max(ov["bench_start"], ov["ours_start"]), min(ov["bench_end"], ov["ours_end"])
    b_in = [x for x, s, f, i in zip(b_tpot, b["start_times"], b["ttfts"], b["itls"], strict=True)
            if s >= lo and s + f + sum(i) <= hi]
    t0 = json.loads((run / "results/ab-c8-ours/run.json").read_text())["clock"]["t0_monotonic_ns"]
    o_in = [x for x, s, e in zip(o_tpot, t["sent_ns"], t["end_ns"], strict=True)
            if (t0 + s) / 1e9 >= lo and (t0 + e) / 1e9 <= hi]

    def inside(v: list[float]) -> str:
        return f"{nearest_rank(v, 50):.2f} / {nearest_rank(v, 90):.2f} ms ({len(v)})"

    return ("| client | TPOT p50 | TPOT p90 | inside the overlap: p50 / p90 (requests) "
            "| tokens per chunk |\n|---|---|---|---|---|\n"
            f"| agent-replay | {nearest_rank(o_tpot, 50):.2f} ms | {nearest_rank(o_tpot, 90):.2f} ms "
            f"| {inside(o_in)} | {tokens / chunks:.2f} ({tokens:,} tokens in {chunks:,} chunks) |\n"
            f"| vllm bench serve | {nearest_rank(b_tpot, 50):.2f} ms | {nearest_rank(b_tpot, 90):.2f} ms "
            f"| {inside(b_in)} "
            f"| its \"ITL\" mean {b['mean_itl_ms']:.2f} ms = {ratio:.2f}x its TPOT mean "
            f"({b['mean_tpot_ms']:.2f} ms); acceptance length "
            f"{b['spec_decode_acceptance_length']:.2f} |")


def run_sentence(rows: list[dict[str, object]]) -> str:
    secs = [float(str(r["run_s"])) for r in rows]
    reqs = {p: [int(str(r["requests_ok"])) for r in rows if float(str(r["point"])) == p]
            for p in POINTS}
    done = sum(1 for r in rows if r["status"] == "complete")
    status = "all complete" if done == len(rows) else f"{done} complete"
    return (f"{len(rows)} runs, {status}; each took {min(secs):.1f}-{max(secs):.1f} s "
            "of wall time; measured requests per run: " +
            ", ".join(f"{min(v)}-{max(v)} at {p}" for p, v in reqs.items()) + " sessions.")


BLOCKS: dict[str, Callable[[list[dict[str, object]]], str]] = {
    "means table": means_table,
    "effects table": effects_table,
    "frontier sentence": frontier_sentence,
    "waiting sentence": lambda rows: waiting_sentence(),
    "steadiness sentence": steadiness_sentence,
    "kv table": lambda rows: kv_table(),
    "kv usage sentence": kv_usage_sentence,
    "env sentence": lambda rows: env_sentence(),
    "bench sentence": lambda rows: bench_sentence(),
    "bench table": lambda rows: bench_table(),
    "run sentence": run_sentence,
}


def blocks(run: Path = RUN) -> dict[str, str]:
    rows = index(run)
    return {name: fn(rows) for name, fn in BLOCKS.items()}


def missing(doc_text: str, run: Path = RUN) -> list[str]:
    """The names of the blocks that ``doc_text`` does not contain verbatim (whitespace of
    wrapped sentences aside)."""
    flat = " ".join(doc_text.split())
    return [name for name, text in blocks(run).items()
            if (text if "\n|" in text else " ".join(text.split())) not in
            (doc_text if "\n|" in text else flat)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="DOC", default=None)
    ap.add_argument("--readme", metavar="README", default=None,
                    help="with --check: also the README's table")
    args = ap.parse_args(argv)
    if args.check is None:
        for name, text in blocks().items():
            print(f"<!-- {name} -->\n{text}\n")
        print(f"<!-- README table -->\n{readme_table(index())}\n")
        return 0
    gone = missing(Path(args.check).read_text())
    if args.readme is not None and readme_table(index()) not in Path(args.readme).read_text():
        gone.append(f"README table (in {args.readme})")
    for name in gone:
        print(f"{args.check}: lacks the {name} computed from {RUN.relative_to(ROOT)}",
              file=sys.stderr)
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
