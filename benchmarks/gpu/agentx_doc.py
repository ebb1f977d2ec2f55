"""Every measured figure of docs/gpu.md, computed from the committed files of the one-H100
AgentX runs: the three servers co-resident on the GPU
(benchmarks/results/gpu/2026-12-06-h100-agentx/) and each deployment alone on it
(benchmarks/results/gpu/2026-12-06-h100-agentx-solo/): each replay's results folder
(per-request Parquet, run.json, the server's /metrics series), the servers' startup logs and
commands, and the model's config.

    python benchmarks/gpu/agentx_doc.py                    # print the doc's figure blocks
    python benchmarks/gpu/agentx_doc.py --check docs/gpu.md --readme README.md
                                                          # exit 1 naming each block it lacks
    python benchmarks/gpu/agentx_doc.py --sweep DIR        # the solo runs as a sweep folder

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
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from agent_replay.analysis.replicates import holm, t_two_sided_p

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx"
PROFILES = ("standard", "mtp", "dedicated-decode")
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

@dataclass(frozen=True)
class RunFigures:
    """One replay's figures, as `agent-replay report` computes them (None: no measured
    request gave one)."""

    requests: int
    p90_tps: float | None
    north_star: float | None
    interactivity: float | None
    total_per_gpu: float | None
    ttft_p50_ms: float | None
    status: str
    measured_s: float | None
    duration_s: float
    kv_peak: float | None
    waiting_peak: float | None
    ttft_p90_ms: float | None = None
    output_per_gpu: float | None = None
    preemptions: float | None = None


def run_dir(profile: str, lanes: int | str, repeat: int, run: Path = RUN) -> Path:
    return run / "results/runs" / profile / f"c{lanes}" / f"r{repeat}"


@cache
def figures(folder: Path) -> RunFigures:
    from agent_replay.analysis.render import report_dict
    from agent_replay.analysis.report import build_report

    rep = report_dict(build_report(folder))
    meta = json.loads((folder / "run.json").read_text())
    head, lat = rep["headline"], rep["latency_ms"]
    t = pq.read_table(folder / "server_metrics.parquet", columns=["name", "value"]).to_pydict()

    def peak(name: str) -> float | None:
        v = [x for n, x in zip(t["name"], t["value"], strict=True) if n == name]
        return max(v) if v else None

    def grew(name: str) -> float | None:  # a counter's growth over the run's scrapes
        v = [x for n, x in zip(t["name"], t["value"], strict=True) if n == name]
        return max(v) - min(v) if v else None

    return RunFigures(
        requests=int(rep["requests"]["counted"]), p90_tps=head.get("p90_tps"),
        north_star=head.get("north_star"), interactivity=head.get("agentx_interactivity"),
        total_per_gpu=rep["throughput"].get("total_tokens_per_s_per_gpu"),
        ttft_p50_ms=lat["ttft"].get("p50"), status=str(meta["status"]),
        measured_s=(meta.get("agentx") or {}).get("measured_s"),
        duration_s=float(meta["options"]["duration_s"]),
        kv_peak=peak("vllm:kv_cache_usage_perc"), waiting_peak=peak("vllm:num_requests_waiting"),
        ttft_p90_ms=lat["ttft"].get("p90"),
        output_per_gpu=rep["throughput"].get("output_tokens_per_s_per_gpu"),
        preemptions=grew("vllm:num_preemptions_total"))


def repeats(profile: str, run: Path = RUN) -> list[RunFigures]:
    """The single-user repeats of ``profile``, in repeat order."""
    out = []
    for r in (1, 2, 3):
        folder = run_dir(profile, 1, r, run)
        if folder.is_dir():
            out.append(figures(folder))
    return out


def non_default_args(server_log: Path) -> dict[str, object]:
    """vLLM's 'non-default args' of a server log (its settings as vLLM parsed them), read by
    the launcher's own parser (``engines.vllm.resolved``)."""
    from agent_replay.engines.vllm.resolved import parse_log

    return dict(parse_log(server_log.read_text(errors="replace")).args)


def setting_checks(name: str, run: Path = RUN) -> list[Any]:
    """Every flag ``agent-replay engines vllm-cmd`` gave server NAME, checked against what
    that server reported running (``engines.vllm.resolved``: its engine config line, the
    graphs it captured, its KV reservation), as ``engines launch`` checks a launch."""
    from agent_replay.engines.vllm.resolved import check, parse_log

    text = (run / "logs" / f"{name}.server.log").read_text(errors="replace")
    return check(requested(name, run)[3:], parse_log(text))


def requested(name: str, run: Path = RUN) -> list[str]:
    """The vLLM arguments profile ``name`` asked for (its vllm-cmd output)."""
    cmd = json.loads((run / f"results/{name}.command.json").read_text())
    return list(cmd["commands"][0]["argv"])


# ---- blocks ------------------------------------------------------------------------------

def _n(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v: float) -> str:
    return f"{v * 100:+.1f}%"


def model_sentence(run: Path = RUN) -> str:
    from agent_replay.engines.vllm.tiny_model import deepseek_parameters

    cfg = json.loads((run / "results/model-config.json").read_text())
    p = deepseek_parameters(cfg)
    return (f"The model: the shape of {cfg['agent_replay_shape']} ({cfg['num_hidden_layers']} "
            f"layers, hidden {cfg['hidden_size']}, {cfg['n_routed_experts']} routed experts + "
            f"{cfg['n_shared_experts']} shared, {cfg['num_experts_per_tok']} per token, MLA "
            f"kv_lora {cfg['kv_lora_rank']}, {cfg['num_nextn_predict_layers']} MTP layer, "
            f"vocabulary {cfg['vocab_size']:,}): {p['main'] / 1e9:.2f}B parameters served, "
            f"{p['mtp'] / 1e9:.2f}B in the MTP layer, {p['active'] / 1e9:.2f}B active per token.")


SETTINGS = (("kv_cache_memory_bytes", "KV cache GiB"), ("max_num_seqs", "max-num-seqs"),
            ("speculative_config", "speculative decoding"),
            ("compilation_config", "CUDA graphs"), ("performance_mode", "performance mode"),
            ("quantization", "weights"), ("max_model_len", "max-model-len"))


def _setting(key: str, value: object) -> str:
    if value is None:
        return "vLLM's default"
    if key == "kv_cache_memory_bytes":
        return f"{int(str(value)) / 2**30:g}"
    if key == "speculative_config" and isinstance(value, dict):
        return (f"{value['method']} {value['num_speculative_tokens']}, acceptance "
                f"{value.get('synthetic_acceptance_length', 'real')}")
    if key == "compilation_config" and isinstance(value, dict):
        sizes = value["cudagraph_capture_sizes"]
        mode = value["cudagraph_mode"]
        return (f"{mode}, sizes {sizes[0]}..{sizes[-1]} step {sizes[1] - sizes[0]}, "
                f"compile mode {value['mode']}")
    return str(value)


def settings_table(run: Path = RUN, servers: dict[str, str] | None = None) -> str:
    """Each profile's settings as its server parsed them (vLLM's 'non-default args' of the
    server that ran the single-user repeats), and how many requested settings the server
    reported running (``setting_checks``)."""
    lines = ["| profile | " + " | ".join(h for _, h in SETTINGS)
             + " | requested settings: in effect / parsed, not reported / differ |",
             "|---" * (len(SETTINGS) + 2) + "|"]
    for prof in PROFILES:
        name = (servers or SERVER)[prof]
        log = run / "logs" / f"{name}.server.log"
        got = non_default_args(log)
        checks = setting_checks(name, run)
        count = {st: [c.flag for c in checks if c.status == st]
                 for st in ("in effect", "not reported", "differs")}
        lines.append(f"| {prof} | " + " | ".join(_setting(k, got.get(k)) for k, _ in SETTINGS)
                     + f" | {len(count['in effect'])} / {len(count['not reported'])} "
                     f"({', '.join(count['not reported']) or '-'}) / {len(count['differs'])} |")
    return "\n".join(lines)


def acceptance_length(folder: Path) -> tuple[float, float]:
    """(accepted draft tokens, verify steps) the server counted during one replay: the
    growth of vllm:spec_decode_num_accepted_tokens_total and ..._num_drafts_total between
    the run's first and last scrape."""
    t = pq.read_table(folder / "server_metrics.parquet",
                      columns=["t_ns", "name", "value"]).to_pydict()

    def grew(name: str) -> float:
        seen = [x for _, n, x in sorted(zip(t["t_ns"], t["name"], t["value"], strict=True))
                if n == name]
        return seen[-1] - seen[0] if seen else 0.0

    return (grew("vllm:spec_decode_num_accepted_tokens_total"),
            grew("vllm:spec_decode_num_drafts_total"))


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
    return ("Mean acceptance length the servers counted over the single-user repeats "
            "(1 + accepted draft tokens per verify step, from /metrics): "
            + "; ".join(parts) + ".")


def single_table(run: Path = RUN) -> str:
    lines = ["| profile | repeats | measured requests per run | P90 TPS | North Star "
             "| AgentX interactivity | TTFT p50 ms |", "|---|---|---|---|---|---|---|"]
    for prof in PROFILES:
        reps = repeats(prof, run)
        cells = []
        for key in ("p90_tps", "north_star", "interactivity", "ttft_p50_ms"):
            vals = [float(getattr(f, key)) for f in reps]
            est, lo, hi = mean_ci(vals)
            cells.append(f"{_n(est)} [{_n(lo)}, {_n(hi)}]")
        counts = sorted({f.requests for f in reps})
        lines.append(f"| {prof} | {len(reps)} | {', '.join(map(str, counts))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


COMPARISONS = (("mtp", "standard"), ("dedicated-decode", "standard"),
               ("dedicated-decode", "mtp"))


def effects(run: Path = RUN) -> dict[tuple[str, str, str], Effect]:
    keys, pairs = [], []
    for other, base in COMPARISONS:
        for metric, _ in SPEEDS:
            keys.append((other, base, metric))
            pairs.append(([float(getattr(f, metric)) for f in repeats(base, run)],
                          [float(getattr(f, metric)) for f in repeats(other, run)]))
    return dict(zip(keys, log_ratio_effects(pairs), strict=True))


def _verdict(e: Effect) -> str:
    if e.p_holm >= ALPHA:
        return "no claim"
    return "faster" if e.estimate > 0 else "slower"


def effects_table(run: Path = RUN) -> str:
    eff = effects(run)
    lines = ["| comparison | " + " | ".join(h for _, h in SPEEDS) + " |",
             "|---|" + "---|" * len(SPEEDS)]
    for other, base in COMPARISONS:
        cells = []
        for metric, _ in SPEEDS:
            e = eff[(other, base, metric)]
            cells.append(f"{_pct(e.estimate)} [{_pct(e.low)}, {_pct(e.high)}] "
                         f"p={e.p_holm:.3f} {_verdict(e)}")
        lines.append(f"| {other} vs {base} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_sentence(run: Path = RUN) -> str:
    e = effects(run)[("dedicated-decode", "standard", "p90_tps")]
    return (f"Dedicated decode over standard at one user, P90 TPS: {_pct(e.estimate)} "
            f"[{_pct(e.low)}, {_pct(e.high)}] (Holm p={e.p_holm:.3f}), beside the seeds' "
            f"{_pct(SEEDS_SPEEDUP)} (829 tok/s on 4 x B300 against the GB300 standard path).")


LADDER = (("standard", (1, 2, 3, 4, 6)), ("dedicated-decode", (1, 2, 3, 4, 8)))


def frontier_table(run: Path = RUN) -> str:
    """The ladder: lanes, what was measured and the AgentX axes; concurrency 1 is the mean of
    its repeats (geometric), the other points one run each."""
    lines = ["| profile | lanes | measured s | requests | AgentX tok/s per GPU | North Star "
             "| 1/P90 ITL (AgentX interactivity) | P90 TPS | KV cache peak | waiting peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
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
            lines.append(f"| {prof} | {c} | {_n(min(meas), 0)} | {sum(f.requests for f in reps)} | "
                         f"{g('total_per_gpu')} | {g('north_star')} | {g('interactivity')} | "
                         f"{g('p90_tps')} | {kv * 100:.0f}% | {wait:.0f} |")
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
            empty.append(f"{folder.parent.parent.name} at {where}: warm-up "
                         f"{warmup_span_s(folder):.1f} s, duration {f.duration_s:g} s")
    return (f"Runs that measured no request ({len(empty)}): " + "; ".join(empty) + ".")


# ---- the solo ladders: each deployment alone on the GPU ---------------------------------

SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo"
SOLO_SERVER = {"standard": "std", "mtp": "mtp", "dedicated-decode": "ded"}
"""The server (logs/NAME.server.log, results/NAME.command.json) of each profile's solo
ladder: one at a time, each with the GPU to itself."""
SOLO_LANES = (1, 2, 4, 6, 8)
REFERENCE = ROOT / "benchmarks/references/agentx.json"
THRESHOLDS = (100, 150, 200)
"""Per-user P90 TPS floors of the capacity answer (tok/s/user)."""


def solo_folders(run: Path = SOLO) -> list[tuple[str, int, Path]]:
    """(profile, lanes, results folder) of every solo run, in table order."""
    return [(prof, c, run_dir(prof, c, 1, run)) for prof in PROFILES for c in SOLO_LANES
            if run_dir(prof, c, 1, run).is_dir()]


@cache
def index_row(folder: Path, profile: str, lanes: int, order: int) -> dict[str, Any]:
    """One run as a row of a sweep index (``replay.sweep.index``): the figures
    ``analysis.points.point_metrics`` gives a sweep's run, so ``agent-replay frontier`` reads
    these runs as a sweep of lanes per profile."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report, self_check

    meta = json.loads((folder / "run.json").read_text())
    rep = build_report(folder, gpus=1)
    row: dict[str, Any] = dict(point_metrics(rep, 1))
    row.update(phase="sweep", order=order, repeat=1, target=profile, axis="concurrency",
               point=float(lanes), status="complete" if meta["status"] == "ok" else meta["status"],
               reason=meta.get("error"), path=str(folder), salt=meta.get("salt"),
               gpus=1, cold_start=bool(rep.cold_start),
               machine_contention=self_check(rep.meta, rep.stats).contention)
    return row


def solo_rows(run: Path = SOLO) -> list[dict[str, Any]]:
    return [index_row(f, prof, c, i) for i, (prof, c, f) in enumerate(solo_folders(run))]


def write_sweep(out: Path, run: Path = SOLO) -> Path:
    """The solo runs as a sweep folder (index.parquet, sweep.json) at ``out``, whose rows
    point at the committed results folders: ``agent-replay frontier OUT --reference
    benchmarks/references/agentx.json`` draws their frontier with the published points.
    The axis is offered load: AgentX lanes think between turns, so the throughput a point
    draws is what its lanes asked for, not the server's capacity."""
    from agent_replay.analysis.frontier import OFFERED
    from agent_replay.replay.sweep.index import write_index

    out.mkdir(parents=True, exist_ok=True)
    write_index(out, solo_rows(run))
    (out / "sweep.json").write_text(json.dumps({
        "axis": "concurrency", "axis_kind": OFFERED, "points": list(SOLO_LANES), "repeats": 1,
        "targets": [{"name": p} for p in PROFILES], "source": str(run)}, indent=2) + "\n")
    return out


def solo_points(run: Path = SOLO) -> list[Any]:
    from agent_replay.analysis.frontier import points

    return points(solo_rows(run))


def frontier_solo_table(run: Path = SOLO) -> str:
    """The frontier table `agent-replay frontier` writes for the solo runs, with its note."""
    from agent_replay.analysis.frontier import OFFERED, to_markdown

    return to_markdown(solo_points(run), "concurrency", kind=OFFERED).strip()


def cards(run: Path) -> list[str]:
    """The GPU names every run of ``run`` recorded (run.json ``provenance.gpus``)."""
    names = set()
    for meta in (run / "results/runs").glob("*/c*/r*/run.json"):
        for g in json.loads(meta.read_text())["provenance"].get("gpus") or []:
            names.add(f"{g['name']} (driver {g['driver']})")
    return sorted(names)


def cards_sentence(run: Path = SOLO) -> str:
    both = {str(r.relative_to(ROOT)): cards(r) for r in (RUN, run)}
    return ("The card of every run, as its run.json records it: "
            + "; ".join(f"{name}: {', '.join(c) or 'not recorded'}" for name, c in both.items())
            + ".")


def ours(run: Path = SOLO) -> list[str]:
    return [f"1x {c.partition(' (')[0]}" for c in cards(run)]


def reference_section(run: Path = SOLO) -> str:
    """The reference table `agent-replay frontier --reference` writes (its title line aside),
    with this frontier's card from the runs' run.json."""
    import dataclasses

    from agent_replay.analysis.frontier import X_AXES, Y_AXES
    from agent_replay.analysis.references import load, to_markdown

    ref = load(REFERENCE, [*X_AXES, *Y_AXES])
    ref = dataclasses.replace(ref, path=str(REFERENCE.relative_to(ROOT)))
    md = to_markdown(ref, ours(run), {**X_AXES, **Y_AXES})
    return "\n".join(md.splitlines()[2:]).strip()


def ladder_solo_table(run: Path = SOLO) -> str:
    """Per profile and lane count: what was measured, the per-user speeds, TTFT, the
    throughput per GPU and the server's own gauges over the run."""
    from agent_replay.analysis.hist import FEW, min_count_for

    lines = ["| profile | lanes | measured s | requests | P90 TPS | North Star "
             "| 1/P90 ITL (AgentX interactivity) | TTFT p50 ms | TTFT p90 ms "
             "| output tok/s per GPU | AgentX tok/s per GPU | KV cache peak | preemptions "
             "| waiting peak |", "|---" * 14 + "|"]
    for prof, c, folder in solo_folders(run):
        f = figures(folder)
        few = FEW if f.requests < min_count_for(90) else ""
        lines.append(
            f"| {prof} | {c} | {_n(f.measured_s, 0)} | {f.requests} | {_n(f.p90_tps)}{few} | "
            f"{_n(f.north_star)}{few} | {_n(f.interactivity)}{few} | {_n(f.ttft_p50_ms, 0)} | "
            f"{_n(f.ttft_p90_ms, 0)}{few} | {_n(f.output_per_gpu, 0)} | {_n(f.total_per_gpu, 0)} | "
            f"{(f.kv_peak or 0.0) * 100:.0f}% | {_n(f.preemptions, 0)} | {_n(f.waiting_peak, 0)} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Capacity:
    """The lanes a profile holds at a per-user floor, from one run per lane count: ``meets``
    the largest tested count up to which every tested count met it (0: not even one lane),
    ``fails`` the next tested count and its P90 TPS (None: none above was tested),
    ``later`` tested counts above ``fails`` that met it again (a ladder that is not
    monotone), ``few`` whether a run that decides it had too few requests for its P90."""

    meets: int
    fails: tuple[int, float] | None
    later: tuple[int, ...]
    few: bool


def capacity(run: Path, profile: str, floor: float) -> Capacity:
    return capacity_of(solo_points(run), profile, floor)


def capacity_of(points: Sequence[Any], profile: str, floor: float) -> Capacity:
    """`agent-replay sweep --find-capacity`'s test of a point (``replay.sweep.capacity``:
    the mean of its runs meets ``p90_tps>=floor``) over the frontier points
    (``analysis.frontier.Point``) of ``profile``, in lane order."""
    from agent_replay.replay.sweep.capacity import meets, parse_slo

    slo = parse_slo(f"p90_tps>={floor:g}")
    pts = sorted((p for p in points if p.target == profile), key=lambda p: p.point)
    best, fails, deciding = 0, None, []
    for p in pts:
        if not meets(p.runs, slo):
            fails = (int(p.point), float(p.mean("p90_tps") or 0.0))
            deciding.append(p)
            break
        best = int(p.point)
        deciding = [p]
    later = tuple(int(p.point) for p in pts
                  if fails is not None and p.point > fails[0] and meets(p.runs, slo))
    return Capacity(best, fails, later, any(p.few("p90_tps") for p in deciding))


def _capacity_cell(cap: Capacity) -> str:
    from agent_replay.analysis.hist import FEW

    mark = FEW if cap.few else ""
    if cap.fails is None:
        return f"{cap.meets} or more{mark} (the most tested)"
    at = f"at {cap.fails[0]}: {_n(cap.fails[1])}"
    text = f"none{mark} ({at})" if cap.meets == 0 else f"{cap.meets}{mark} ({at})"
    return text + (f"; meets again at {', '.join(map(str, cap.later))}" if cap.later else "")


def capacity_table(run: Path = SOLO) -> str:
    lines = ["| P90 TPS per user at least | " + " | ".join(PROFILES) + " |",
             "|---" * (len(PROFILES) + 1) + "|"]
    for floor in THRESHOLDS:
        lines.append(f"| {floor} tok/s | " + " | ".join(
            _capacity_cell(capacity(run, prof, floor)) for prof in PROFILES) + " |")
    return "\n".join(lines)


def ladder_sentence(run: Path = SOLO) -> str:
    """Each profile's P90 TPS at the ends of its ladder and its range over the ladder."""
    parts = []
    for prof in PROFILES:
        got = [(c, figures(f).p90_tps) for p, c, f in solo_folders(run) if p == prof]
        vals = [float(v) for _, v in got if v is not None]
        parts.append(f"{prof} {_n(got[0][1])} at {got[0][0]} lane, {_n(got[-1][1])} at "
                     f"{got[-1][0]}, between {_n(min(vals))} and {_n(max(vals))}")
    return "P90 TPS along the solo ladder: " + "; ".join(parts) + "."


def leaders_sentence(run: Path = SOLO) -> str:
    """Which profile had the highest P90 TPS, and which the highest AgentX throughput per
    GPU, at each lane count."""
    def best(key: str) -> str:
        out = []
        for c in SOLO_LANES:
            vals = {p: getattr(figures(f), key) for p, n, f in solo_folders(run) if n == c}
            out.append(f"{c}: {max(vals, key=lambda p: vals[p] or 0.0)}")
        return ", ".join(out)

    return (f"Highest P90 TPS per lane count: {best('p90_tps')}. Highest AgentX tok/s per "
            f"GPU: {best('total_per_gpu')}.")


def throughput_sentence(run: Path = SOLO) -> str:
    """How far the frontier's total tok/s per GPU (from the first intended send,
    ``analysis.definitions`` RUN_FIGURES) is from AgentX's (from the first actual send,
    ``total_tokens_per_s_per_gpu``) over the solo runs."""
    gap = max(abs(r["total_tps_per_gpu"] / figures(Path(r["path"])).total_per_gpu - 1)
              for r in solo_rows(run))
    return ("The frontier's total tok/s/GPU counts each run from its first intended send, the "
            "ladder's AgentX tok/s per GPU from its first actual send (AgentX's definition); "
            f"over these runs they differ by {gap * 100:.2f}% at most.")


def flags_sentence(run: Path = SOLO) -> str:
    """The report's cold-start flags of the solo runs, with the warm-up requests each run
    did send (kept out of its figures)."""
    from agent_replay.analysis.report import build_report

    why: dict[str, int] = {}
    warm: dict[int, set[int]] = {}
    for _, lanes, folder in solo_folders(run):
        reason = build_report(folder, gpus=1).cold_start
        if reason:
            key = reason.split(":")[0]
            why[key] = why.get(key, 0) + 1
        w = pq.read_table(folder / "requests", columns=["warmup"]).column("warmup").to_pylist()
        warm.setdefault(lanes, set()).add(sum(1 for x in w if x))
    per_lane = sorted({n // lanes for lanes, ns in warm.items() for n in ns})
    return ("Flags: " + "; ".join(f"'{k}' on {n} of {len(solo_folders(run))} runs"
                                  for k, n in why.items())
            + f". Each run sent {' or '.join(map(str, per_lane))} warm-up requests per lane "
            "before its measured window (AgentX's warm-up, kept out of the figures), which "
            "the report's cold-start check does not read.")


def steps(run: Path = SOLO) -> list[tuple[str, int, float]]:
    """(step, rc, seconds) of logs/steps.tsv: the phase's steps as the script timed them."""
    rows = (run / "logs/steps.tsv").read_text().splitlines()[1:]
    return [(a, int(b), float(c)) for a, b, c, *_ in (r.split("\t") for r in rows)]


def interval_sentence(run: Path = SOLO) -> str:
    """What an interval per point would take: more runs per point (``replay.sweep.capacity``
    calls a point sure only when the 95% interval of its runs' mean clears the floor, which
    needs 2 runs at least), and runs long enough for a P90 of 10 or more requests."""
    from agent_replay.analysis.hist import min_count_for

    runs = [(n, s) for n, _, s in steps(run) if n.startswith("c") and "-r1-" in n]
    few = [n for n, _ in runs if figures(run_dir(_profile(n), int(n[1:].split("-")[0]), 1, run))
           .requests < min_count_for(90)]
    total = sum(s for _, s in runs)
    return (f"One run per point: the {len(runs)} runs took {total:,.0f} s of wall time "
            f"(logs/steps.tsv), so two more repeats of every point, the least that gives each "
            f"mean a Student-t interval with 2 degrees of freedom, take about "
            f"{2 * total:,.0f} s more, server starts aside; {len(few)} of the runs "
            f"({', '.join(few)}) counted fewer than the {min_count_for(90)} requests a P90 "
            f"needs, so their P90 is their slowest request or next to it, and a longer "
            f"measured window is the other half of the fix.")


def _profile(step: str) -> str:
    short = step.rsplit("-", 1)[1]
    return next(p for p, s in SOLO_SERVER.items() if s == short)


def solo_acceptance_sentence(run: Path = SOLO) -> str:
    parts = []
    for prof in ("mtp", "dedicated-decode"):
        acc = n = 0.0
        for c in SOLO_LANES:
            a, m = acceptance_length(run_dir(prof, c, 1, run))
            acc, n = acc + a, n + m
        parts.append(f"{prof} {1 + acc / n:.3f} over {n:,.0f} verify steps")
    return ("Mean acceptance length the servers counted over the solo ladder (1 + accepted "
            "draft tokens per verify step, from /metrics): " + "; ".join(parts) + ".")


def solo_settings_table(run: Path = SOLO) -> str:
    return settings_table(run, SOLO_SERVER)


def trace_sentence(run: Path = SOLO) -> str:
    """The trace folder's hash (run.json ``trace.sha256``) of each setup's runs."""
    def hashes(r: Path) -> list[str]:
        return sorted({json.loads(m.read_text())["trace"]["sha256"][:12]
                       for m in (r / "results/runs").glob("*/c*/r*/run.json")})

    return (f"Trace hash (run.json trace.sha256): co-resident runs {', '.join(hashes(RUN))}; "
            f"solo runs {', '.join(hashes(run))}.")


BLOCKS = {
    "model sentence": model_sentence,
    "settings table": settings_table,
    "acceptance sentence": acceptance_sentence,
    "single-user table": single_table,
    "effects table": effects_table,
    "ratio sentence": ratio_sentence,
    "frontier table": frontier_table,
    "empty runs sentence": empty_runs_sentence,
}
SOLO_BLOCKS = {
    "cards sentence": cards_sentence,
    "solo settings table": solo_settings_table,
    "solo acceptance sentence": solo_acceptance_sentence,
    "trace sentence": trace_sentence,
    "solo ladder table": ladder_solo_table,
    "solo frontier table": frontier_solo_table,
    "reference table": reference_section,
    "ladder sentence": ladder_sentence,
    "leaders sentence": leaders_sentence,
    "throughput sentence": throughput_sentence,
    "flags sentence": flags_sentence,
    "capacity table": capacity_table,
    "interval sentence": interval_sentence,
}


def readme_table(run: Path = RUN) -> str:
    return effects_table(run)


def blocks(run: Path = RUN, solo: Path = SOLO) -> dict[str, str]:
    """Every block: the co-resident run's (``BLOCKS``) from ``run``, the solo ladders'
    (``SOLO_BLOCKS``) from ``solo``."""
    return ({name: fn(run) for name, fn in BLOCKS.items()}
            | {name: fn(solo) for name, fn in SOLO_BLOCKS.items()})


def missing(doc_text: str, run: Path = RUN, solo: Path = SOLO) -> list[str]:
    """The names of the blocks that ``doc_text`` does not contain verbatim (whitespace of
    wrapped sentences aside)."""
    flat = " ".join(doc_text.split())
    return [name for name, text in blocks(run, solo).items()
            if (text if "\n|" in text else " ".join(text.split())) not in
            (doc_text if "\n|" in text else flat)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="DOC", default=None)
    ap.add_argument("--readme", metavar="README", default=None,
                    help="with --check: also the README's table")
    ap.add_argument("--sweep", metavar="DIR", default=None,
                    help="write the solo runs as a sweep folder at DIR, for `agent-replay "
                    "frontier DIR --reference benchmarks/references/agentx.json`")
    args = ap.parse_args(argv)
    if args.sweep is not None:
        print(f"wrote {write_sweep(Path(args.sweep))}")
        return 0
    if args.check is None:
        for name, text in blocks().items():
            print(f"<!-- {name} -->\n{text}\n")
        return 0
    gone = missing(Path(args.check).read_text())
    if args.readme is not None and readme_table() not in Path(args.readme).read_text():
        gone.append(f"README table (in {args.readme})")
    for name in gone:
        src = SOLO if name in SOLO_BLOCKS else RUN
        print(f"{args.check}: lacks the {name} computed from {src.relative_to(ROOT)}",
              file=sys.stderr)
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
