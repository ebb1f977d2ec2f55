"""Every measured figure of docs/gpu.md, computed from the committed files of the one-H100
AgentX runs: the three servers co-resident on the GPU
(benchmarks/results/gpu/2026-12-06-h100-agentx/) and each deployment alone on it
(benchmarks/results/gpu/2026-12-06-h100-agentx-solo/, with the repeats of some points in
benchmarks/results/gpu/2026-12-06-h100-agentx-solo-repeats/): each replay's results folder
(per-request Parquet, run.json, the server's /metrics series), the servers' startup logs and
commands, and the model's config.

    python benchmarks/gpu/agentx_doc.py                    # print the doc's figure blocks
    python benchmarks/gpu/agentx_doc.py --check docs/gpu.md --readme README.md
                                                          # exit 1 naming each block it lacks
    python benchmarks/gpu/agentx_doc.py --sweep DIR        # the solo runs (repeats included)
                                                          # as a sweep folder

This script holds the co-resident run's blocks and the check; the solo ladders' blocks are
in ``agentx_solo.py`` and the readers both use in ``agentx_runs.py``, beside it.

Each block is a table or sentence that docs/gpu.md must contain verbatim; a changed number
in the doc (or in the data) makes ``--check`` fail. Per-run figures come from the report's
own computation (``analysis.report.build_report``), so they are the numbers `agent-replay
report` prints for that folder.

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
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from agent_replay.analysis.replicates import holm, t_two_sided_p

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agentx_solo as ladders  # the scripts beside this one
from agentx_runs import (
    PROFILES,
    ROOT,
    RUN,
    RunFigures,
    _n,
    _pct,
    acceptance_length,
    figures,
    repeats,
    run_dir,
    settings_table,
)

SERVER = {"standard": "std-kv8", "mtp": "mtp", "dedicated-decode": "ded"}
"""The server (logs/NAME.server.log, results/NAME.command.json) that ran each profile's
single-user repeats: standard was restarted with a larger KV cache for its last ladder
points (logs/std.server.log); its first server's command is std-kv8.command.json."""
SPEEDS = (("p90_tps", "P90 TPS"), ("north_star", "North Star"))
ALPHA = 0.05
SEEDS_SPEEDUP = 0.26
"""The seeds' dedicated-decode over standard at one user: 829 tok/s on 4 x B300 against the
GB300 standard path, +26%."""


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


def log_ratio_effects(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]], alpha: float = ALPHA
) -> list[Effect]:
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
        out.append(
            Effect(
                math.expm1(mean),
                math.expm1(mean - half),
                math.expm1(mean + half),
                p,
                adjusted[i],
                level,
                n,
            )
        )
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


# ---- the co-resident run's blocks -----------------------------------------------------


def model_sentence(run: Path = RUN) -> str:
    from agent_replay.engines.vllm.tiny_model import deepseek_parameters

    cfg = json.loads((run / "results/model-config.json").read_text())
    p = deepseek_parameters(cfg)
    return (
        f"The model: the shape of {cfg['agent_replay_shape']} ({cfg['num_hidden_layers']} "
        f"layers, hidden {cfg['hidden_size']}, {cfg['n_routed_experts']} routed experts + "
        f"{cfg['n_shared_experts']} shared, {cfg['num_experts_per_tok']} per token, MLA "
        f"kv_lora {cfg['kv_lora_rank']}, {cfg['num_nextn_predict_layers']} MTP layer, "
        f"vocabulary {cfg['vocab_size']:,}): {p['main'] / 1e9:.2f}B parameters served, "
        f"{p['mtp'] / 1e9:.2f}B in the MTP layer, {p['active'] / 1e9:.2f}B active per token."
    )


def coresident_settings_table(run: Path = RUN) -> str:
    return settings_table(run, SERVER)


def acceptance_sentence(run: Path = RUN) -> str:
    """The mean acceptance length (1 + accepted draft tokens per verify step) each MTP
    profile's server counted over its single-user repeats: the synthetic setting at work."""
    parts = []
    for prof in ("mtp", "dedicated-decode"):
        acc = steps = 0.0
        for r in (1, 2, 3):
            a, n = acceptance_length(run_dir(prof, 1, r, run))
            acc, steps = acc + a, steps + n
        parts.append(f"{prof} {1 + acc / steps:.3f} over {steps:,.0f} verify steps")
    return (
        "Mean acceptance length the servers counted over the single-user repeats "
        "(1 + accepted draft tokens per verify step, from /metrics): " + "; ".join(parts) + "."
    )


def single_table(run: Path = RUN) -> str:
    lines = [
        "| profile | repeats | measured requests per run | P90 TPS | North Star "
        "| AgentX interactivity | TTFT p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for prof in PROFILES:
        reps = repeats(prof, run)
        cells = []
        for key in ("p90_tps", "north_star", "interactivity", "ttft_p50_ms"):
            vals = [float(getattr(f, key)) for f in reps]
            est, lo, hi = mean_ci(vals)
            cells.append(f"{_n(est)} [{_n(lo)}, {_n(hi)}]")
        counts = sorted({f.requests for f in reps})
        lines.append(
            f"| {prof} | {len(reps)} | {', '.join(map(str, counts))} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


COMPARISONS = (("mtp", "standard"), ("dedicated-decode", "standard"), ("dedicated-decode", "mtp"))


def effects(run: Path = RUN) -> dict[tuple[str, str, str], Effect]:
    keys, pairs = [], []
    for other, base in COMPARISONS:
        for metric, _ in SPEEDS:
            keys.append((other, base, metric))
            pairs.append(
                (
                    [float(getattr(f, metric)) for f in repeats(base, run)],
                    [float(getattr(f, metric)) for f in repeats(other, run)],
                )
            )
    return dict(zip(keys, log_ratio_effects(pairs), strict=True))


def _verdict(e: Effect) -> str:
    if e.p_holm >= ALPHA:
        return "no claim"
    return "faster" if e.estimate > 0 else "slower"


def effects_table(run: Path = RUN) -> str:
    eff = effects(run)
    lines = [
        "| comparison | " + " | ".join(h for _, h in SPEEDS) + " |",
        "|---|" + "---|" * len(SPEEDS),
    ]
    for other, base in COMPARISONS:
        cells = []
        for metric, _ in SPEEDS:
            e = eff[(other, base, metric)]
            cells.append(
                f"{_pct(e.estimate)} [{_pct(e.low)}, {_pct(e.high)}] p={e.p_holm:.3f} {_verdict(e)}"
            )
        lines.append(f"| {other} vs {base} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_sentence(run: Path = RUN) -> str:
    e = effects(run)[("dedicated-decode", "standard", "p90_tps")]
    return (
        f"Dedicated decode over standard at one user, P90 TPS: {_pct(e.estimate)} "
        f"[{_pct(e.low)}, {_pct(e.high)}] (Holm p={e.p_holm:.3f}), beside the seeds' "
        f"{_pct(SEEDS_SPEEDUP)} (829 tok/s on 4 x B300 against the GB300 standard path)."
    )


LADDER = (("standard", (1, 2, 3, 4, 6)), ("dedicated-decode", (1, 2, 3, 4, 8)))


def frontier_table(run: Path = RUN) -> str:
    """The ladder: lanes, what was measured and the AgentX axes; concurrency 1 is the mean of
    its repeats (geometric), the other points one run each."""
    lines = [
        "| profile | lanes | measured s | requests | AgentX tok/s per GPU | North Star "
        "| 1/P90 ITL (AgentX interactivity) | P90 TPS | KV cache peak | waiting peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for prof, lanes in LADDER:
        for c in lanes:
            reps = repeats(prof, run) if c == 1 else [figures(run_dir(prof, c, 1, run))]
            meas = [f.measured_s or 0.0 for f in reps]

            def g(key: str, reps: list[RunFigures] = reps) -> str:
                vals = [getattr(f, key) for f in reps]
                if any(v is None for v in vals):
                    return "-"
                gmean = math.exp(sum(math.log(float(v)) for v in vals) / len(vals))
                return _n(gmean, 0 if key == "total_per_gpu" else 1)

            kv = max((f.kv_peak or 0.0) for f in reps)
            wait = max((f.waiting_peak or 0.0) for f in reps)
            lines.append(
                f"| {prof} | {c} | {_n(min(meas), 0)} | {sum(f.requests for f in reps)} | "
                f"{g('total_per_gpu')} | {g('north_star')} | {g('interactivity')} | "
                f"{g('p90_tps')} | {kv * 100:.0f}% | {wait:.0f} |"
            )
    return "\n".join(lines)


def warmup_span_s(folder: Path) -> float:
    """Seconds from a run's first warm-up send to its last warm-up end (0: none)."""
    t = pq.read_table(folder / "requests", columns=["sent_ns", "end_ns", "warmup"]).to_pydict()
    sent = [x for x, w in zip(t["sent_ns"], t["warmup"], strict=True) if w]
    ends = [x for x, w in zip(t["end_ns"], t["warmup"], strict=True) if w and x is not None]
    return (max(ends) - min(sent)) / 1e9 if sent and ends else 0.0


def empty_runs_sentence(run: Path = RUN) -> str:
    """The runs that measured nothing, each with its warm-up's length and its duration."""
    empty = []
    for folder in sorted((run / "results/runs").glob("*/c*/r1")):
        f = figures(folder)
        if f.requests == 0:
            lanes, _, kv = folder.parent.name[1:].partition("-kv")
            where = f"{lanes} lanes" + (f" ({kv} GiB KV)" if kv else "")
            empty.append(
                f"{folder.parent.parent.name} at {where}: warm-up "
                f"{warmup_span_s(folder):.1f} s, duration {f.duration_s:g} s"
            )
    return f"Runs that measured no request ({len(empty)}): " + "; ".join(empty) + "."


BLOCKS = {
    "model sentence": model_sentence,
    "settings table": coresident_settings_table,
    "acceptance sentence": acceptance_sentence,
    "single-user table": single_table,
    "effects table": effects_table,
    "ratio sentence": ratio_sentence,
    "frontier table": frontier_table,
    "empty runs sentence": empty_runs_sentence,
}


def readme_table(run: Path = RUN) -> str:
    return effects_table(run)


def blocks(run: Path = RUN, solo: Path = ladders.SOLO) -> dict[str, str]:
    """Every block: the co-resident run's (``BLOCKS``) from ``run``, the solo ladders'
    (``ladders.SOLO_BLOCKS``) from ``solo``."""
    return {name: fn(run) for name, fn in BLOCKS.items()} | {
        name: fn(solo) for name, fn in ladders.SOLO_BLOCKS.items()
    }


def missing(doc_text: str, run: Path = RUN, solo: Path = ladders.SOLO) -> list[str]:
    """The names of the blocks that ``doc_text`` does not contain verbatim (whitespace of
    wrapped sentences aside)."""
    flat = " ".join(doc_text.split())
    return [
        name
        for name, text in blocks(run, solo).items()
        if (text if "\n|" in text else " ".join(text.split()))
        not in (doc_text if "\n|" in text else flat)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="DOC", default=None)
    ap.add_argument(
        "--readme", metavar="README", default=None, help="with --check: also the README's table"
    )
    ap.add_argument(
        "--sweep",
        metavar="DIR",
        default=None,
        help="write the solo runs as a sweep folder at DIR, for `agent-replay "
        "frontier DIR --reference benchmarks/references/agentx.json`",
    )
    args = ap.parse_args(argv)
    if args.sweep is not None:
        print(f"wrote {ladders.write_sweep(Path(args.sweep))}")
        return 0
    if args.check is None:
        for name, text in blocks().items():
            print(f"<!-- {name} -->\n{text}\n")
        return 0
    gone = missing(Path(args.check).read_text())
    if args.readme is not None and readme_table() not in Path(args.readme).read_text():
        gone.append(f"README table (in {args.readme})")
    for name in gone:
        src = ladders.SOLO if name in ladders.SOLO_BLOCKS else RUN
        print(
            f"{args.check}: lacks the {name} computed from {src.relative_to(ROOT)}", file=sys.stderr
        )
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
