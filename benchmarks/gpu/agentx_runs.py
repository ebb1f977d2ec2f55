"""The committed one-H100 AgentX runs as values, for the scripts that write docs/gpu.md
(``agentx_doc.py``, ``agentx_solo.py``): each replay's figures as `agent-replay report`
computes them, the server's own counters over a run, and each server's settings as it parsed
and reported them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx"
"""The co-resident run: three servers sharing the GPU."""
PROFILES = ("standard", "mtp", "dedicated-decode")


# ---- runs --------------------------------------------------------------------------------


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
        requests=int(rep["requests"]["counted"]),
        p90_tps=head.get("p90_tps"),
        north_star=head.get("north_star"),
        interactivity=head.get("agentx_interactivity"),
        total_per_gpu=rep["throughput"].get("total_tokens_per_s_per_gpu"),
        ttft_p50_ms=lat["ttft"].get("p50"),
        status=str(meta["status"]),
        measured_s=(meta.get("agentx") or {}).get("measured_s"),
        duration_s=float(meta["options"]["duration_s"]),
        kv_peak=peak("vllm:kv_cache_usage_perc"),
        waiting_peak=peak("vllm:num_requests_waiting"),
        ttft_p90_ms=lat["ttft"].get("p90"),
        output_per_gpu=rep["throughput"].get("output_tokens_per_s_per_gpu"),
        preemptions=grew("vllm:num_preemptions_total"),
    )


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


# ---- shared pieces of the doc's blocks ---------------------------------------------------


def _n(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v: float) -> str:
    return f"{v * 100:+.1f}%"


SETTINGS = (
    ("kv_cache_memory_bytes", "KV cache GiB"),
    ("max_num_seqs", "max-num-seqs"),
    ("speculative_config", "speculative decoding"),
    ("compilation_config", "CUDA graphs"),
    ("performance_mode", "performance mode"),
    ("quantization", "weights"),
    ("max_model_len", "max-model-len"),
)


def _setting(key: str, value: object) -> str:
    if value is None:
        return "vLLM's default"
    if key == "kv_cache_memory_bytes":
        return f"{int(str(value)) / 2**30:g}"
    if key == "speculative_config" and isinstance(value, dict):
        return (
            f"{value['method']} {value['num_speculative_tokens']}, acceptance "
            f"{value.get('synthetic_acceptance_length', 'real')}"
        )
    if key == "compilation_config" and isinstance(value, dict):
        sizes = value["cudagraph_capture_sizes"]
        mode = value["cudagraph_mode"]
        return (
            f"{mode}, sizes {sizes[0]}..{sizes[-1]} step {sizes[1] - sizes[0]}, "
            f"compile mode {value['mode']}"
        )
    return str(value)


def settings_table(run: Path, servers: dict[str, str]) -> str:
    """Each profile's settings as its server (``servers[profile]``) parsed them (vLLM's
    'non-default args'), and how many requested settings the server reported running
    (``setting_checks``)."""
    lines = [
        "| profile | "
        + " | ".join(h for _, h in SETTINGS)
        + " | requested settings: in effect / parsed, not reported / differ |",
        "|---" * (len(SETTINGS) + 2) + "|",
    ]
    for prof in PROFILES:
        name = servers[prof]
        log = run / "logs" / f"{name}.server.log"
        got = non_default_args(log)
        checks = setting_checks(name, run)
        count = {
            st: [c.flag for c in checks if c.status == st]
            for st in ("in effect", "not reported", "differs")
        }
        lines.append(
            f"| {prof} | "
            + " | ".join(_setting(k, got.get(k)) for k, _ in SETTINGS)
            + f" | {len(count['in effect'])} / {len(count['not reported'])} "
            f"({', '.join(count['not reported']) or '-'}) / {len(count['differs'])} |"
        )
    return "\n".join(lines)


def acceptance_length(folder: Path) -> tuple[float, float]:
    """(accepted draft tokens, verify steps) the server counted during one replay: the
    growth of vllm:spec_decode_num_accepted_tokens_total and ..._num_drafts_total between
    the run's first and last scrape."""
    t = pq.read_table(
        folder / "server_metrics.parquet", columns=["t_ns", "name", "value"]
    ).to_pydict()

    def grew(name: str) -> float:
        seen = [
            x for _, n, x in sorted(zip(t["t_ns"], t["name"], t["value"], strict=True)) if n == name
        ]
        return seen[-1] - seen[0] if seen else 0.0

    return (
        grew("vllm:spec_decode_num_accepted_tokens_total"),
        grew("vllm:spec_decode_num_drafts_total"),
    )
