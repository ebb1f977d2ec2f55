"""``agent-replay run`` and ``agent-replay demo``: parse into a RunConfig, call the library,
render the summary."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent_replay.engines.aio import LOOP_KINDS
from agent_replay.engines.dialects import API_PATHS
from agent_replay.errors import InputError
from agent_replay.replay.config import HTTP_CLIENTS, TIMESTAMPS, RunConfig
from agent_replay.replay.plan import ARRIVALS, TIMING_MODES
from agent_replay.replay.presets import PRESETS, resolve


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="replay a trace against an endpoint with its original timing",
                       description="Replay TRACE against --target, streaming every response, and "
                       "write a results folder (run.json + requests/*.parquet).")
    p.add_argument("trace", help="trace file or folder of part files")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="base URL of the OpenAI-compatible server, "
                       "e.g. http://127.0.0.1:8000")
    where.add_argument("--launch", metavar='"PROFILE --model M ..."',
                       help="start a local vLLM for this run (the arguments of 'engines "
                       "launch' in one string), replay against it, then stop it")
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="replay the bundled sample trace on the built-in simulated engine")
    d.add_argument("--output", "-o", default=None, help="results folder (default ./demo-results/<time>)")
    d.add_argument("--profile", default=None, help="simulated engine profile (default: the engine's default)")
    d.add_argument("--speedup", type=float, default=None, help="time compression (default 10)")
    d.add_argument("--trace", default=None, help="a trace to use instead of the bundled sample")
    d.set_defaults(func=cmd_demo)


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", default=None, help="results folder (default results/<trace>-<time>)")
    p.add_argument("--force", action="store_true", help="replace an existing results folder")
    p.add_argument("--timing", choices=TIMING_MODES, default="session",
                   help="session: wait for the dependencies, then the think time (default); absolute: "
                   "every request at its recorded arrival; max-rate: as fast as --concurrency allows; "
                   "agentx: --concurrency live session trees, recycled, AgentX rules (default "
                   "--duration 1800)")
    p.add_argument("--speedup", type=float, default=1.0, help="divide all times by this (default 1)")
    p.add_argument("--concurrency", type=int, default=None, help="max-rate: requests in flight")
    p.add_argument("--sessions-multiplier", type=int, default=1, metavar="N",
                   help="replay N copies of every session with disjoint prompts (default 1)")
    p.add_argument("--rate", type=float, default=None, metavar="SESSIONS_PER_S",
                   help="sessions start as an arrival process at this rate instead of at the "
                   "trace's times (see --arrival)")
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson",
                   help="with --rate: exponential gaps (seeded by --arrival-seed) or fixed ones")
    p.add_argument("--arrival-seed", type=int, default=0, help="seed of the Poisson arrivals")
    p.add_argument("--concurrent-sessions", type=int, default=None, metavar="N",
                   help="replay N sessions at once (the trace's, cloned with disjoint prompts "
                   "as needed), started within --ramp seconds")
    p.add_argument("--ramp", type=float, default=1.0, metavar="SECONDS",
                   help="with --concurrent-sessions: spread the starts over this long (default 1)")
    p.add_argument("--max-sessions", type=int, default=None, help="replay only the first N sessions")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="send nothing after this many seconds")
    p.add_argument("--max-think", type=float, default=None, metavar="SECONDS",
                   help="cap every recorded think time (tool timeouts of minutes are not load)")
    p.add_argument("--rebase-sessions", action="store_true",
                   help="start every session at time zero instead of its recorded offset")
    p.add_argument("--keep-overlaps", action="store_true",
                   help="a request also waits for every request of its session that had ended "
                   "before it started in the recording (with --speedup: no overlaps the "
                   "recording did not have)")
    p.add_argument("--warmup", type=float, default=0.0, metavar="SECONDS",
                   help="requests sent in the first SECONDS are flagged warm-up (kept, not in stats)")
    p.add_argument("--api", choices=tuple(API_PATHS), default=None,
                   help="override the trace's api column")
    p.add_argument("--tokenizer", metavar="NAME_OR_PATH", default=None,
                   help="the target's tokenizer (tokenizer.json, its folder, or a model name) "
                        "for chat/messages/responses prompts when the target has no /tokenize "
                        "(needs the tokenizer extra)")
    p.add_argument("--include-failed", action="store_true",
                   help="also replay the requests the recording marked failed (error column)")
    p.add_argument("--model", default=None, help="model name (default: the target's first model)")
    p.add_argument("--salt", type=int, default=None, help="prompt salt (default: random per run; "
                   "give the same salt to hit a previous run's prefix cache, 0 to reproduce)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="token ids stay below this (default 32000)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS")
    p.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    p.add_argument("--cpus", default=None, metavar="auto|LIST",
                   help="pin each worker to a CPU of its own (Linux): auto = one per physical "
                   "core, hyperthread siblings left out; or a list like 2,4,6-9. The dashboard "
                   "and scraper get the CPUs left over (default: no pinning)")
    p.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="run the shards on Ray actors (needs the ray extra): no ADDRESS = "
                   "RAY_ADDRESS or the running local cluster; 'local' = a private one-node Ray; "
                   "else the cluster address. Put it after TRACE, or write --ray=ADDRESS")
    p.add_argument("--ray-actors-per-node", type=int, default=1, metavar="N",
                   help="with --ray: shard actors on every node (default 1)")
    p.add_argument("--scrape-interval", type=float, default=None, metavar="SECONDS",
                   help="/metrics scrape period (default 1 when the target has /metrics; 0: off)")
    p.add_argument("--gpu-metrics", default="auto", metavar="auto|nvml[:0,1]|URL|off",
                   help="GPU telemetry beside the run: auto (default) = NVML when the server "
                   "is on this host or launched (needs the gpu extra); nvml:0,1 = those GPUs; "
                   "URL = a DCGM exporter's /metrics; off")
    p.add_argument("--no-gpu-metrics", dest="gpu_metrics", action="store_const", const="off",
                   help="no GPU telemetry (same as --gpu-metrics off)")
    p.add_argument("--gpu-interval", type=float, default=0.1, metavar="SECONDS",
                   help="GPU telemetry sample period (default 0.1)")
    p.add_argument("--no-vllm-extras", action="store_true",
                   help="do not send ignore_eos, min_tokens, return_token_ids, continuous usage "
                        "(for servers that reject them; a server that then sends no token counts "
                        "per chunk gives requests marked 'inexact', left out of per-token metrics)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra HTTP header (repeatable), e.g. Authorization=Bearer\\ KEY")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="sent as Authorization: Bearer KEY (and x-api-key for the messages API) "
                   "on every request, the probe included (default: $OPENAI_API_KEY, or "
                   "$ANTHROPIC_API_KEY for messages, when set); never written to results")
    p.add_argument("--insecure", action="store_true",
                   help="accept any TLS certificate (self-signed servers)")
    p.add_argument("--max-failure-rate", type=float, default=0.1, metavar="FRACTION",
                   help="exit 1 (status failed) when more than this fraction of the sent "
                   "requests failed (default 0.1)")
    p.add_argument("--abort-after-failures", type=int, default=None, metavar="N",
                   help="stop the run (status aborted, exit 1) after N failed requests in a row")
    p.add_argument("--loop", choices=LOOP_KINDS, default="uvloop")
    p.add_argument("--http-client", choices=HTTP_CLIENTS, default="fast",
                   help="fast: HTTP/1.1 on asyncio.Protocol, per-read work in the read callback "
                   "(default; https targets use aiohttp); aiohttp: the aiohttp client")
    p.add_argument("--timestamps", choices=TIMESTAMPS, default="auto",
                   help="kernel: a chunk's time is the kernel's receive time of its packet "
                   "(SO_TIMESTAMPNS; fast client on Linux), so the load generator's own loop lag "
                   "does not move it; loop: when the event loop reads it; auto (default): kernel "
                   "where it can be had, else loop")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    a = p.add_argument_group("agentx timing (InferenceX AgentX / AIPerf rules; see docs/agentx.md)")
    a.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help="AgentX parameters as AIPerf's scenario sets them (implies --timing "
                   "agentx); the options below override single values")
    a.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs serving the target, prefill + decode when disaggregated (tokens/s "
                   "per GPU; default: the launch profile's, else unknown)")
    a.add_argument("--start-range", default=None, metavar="LO,HI",
                   help="first play starts at an instant LO..HI of its session's time span "
                   "(default 0.25,0.75)")
    a.add_argument("--warmup-requests", type=int, default=None, metavar="N",
                   help="turns per lane replayed as warm-up before the measured play (default 0)")
    a.add_argument("--idle-cap", type=float, default=None, metavar="SECONDS",
                   help="nothing in flight idles at most this long (default 10)")
    a.add_argument("--tree-idle-cap", type=float, default=None, metavar="SECONDS",
                   help="shorten every recorded stretch where nothing of a session tree was "
                   "in flight to at most this (default none)")
    a.add_argument("--min-duration", type=float, default=None, metavar="SECONDS",
                   help="a run measuring less is invalid")
    a.add_argument("--failure-threshold", type=float, default=None, metavar="FRACTION",
                   help="a run with more failed requests is invalid")
    a.add_argument("--metric-coverage", type=float, default=None, metavar="FRACTION",
                   help="a run whose last first token / token lies less far into --duration is invalid")
    a.add_argument("--seed", type=int, default=None, help="start sampling seed (default: --salt)")


def _headers(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--header {item!r}: expected NAME=VALUE")
        out.append((name.strip(), value))
    return tuple(out)


def _start_range(v: str | None) -> tuple[float | None, float | None]:
    if v is None:
        return None, None
    lo, _, hi = v.partition(",")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise InputError(f"--start-range {v!r}: expected LO,HI (fractions, e.g. 0.25,0.75)") from None


def config_from_args(args: argparse.Namespace, target: str) -> RunConfig:
    preset = getattr(args, "preset", None)
    lo, hi = _start_range(getattr(args, "start_range", None))
    agentx, duration = resolve(preset, {
        "start_min": lo, "start_max": hi,
        "warmup_requests": getattr(args, "warmup_requests", None),
        "idle_cap_s": getattr(args, "idle_cap", None),
        "tree_idle_cap_s": getattr(args, "tree_idle_cap", None),
        "min_duration_s": getattr(args, "min_duration", None),
        "failure_threshold": getattr(args, "failure_threshold", None),
        "metric_coverage": getattr(args, "metric_coverage", None),
        "seed": getattr(args, "seed", None)}, args.duration)
    timing = "agentx" if preset is not None else args.timing
    return RunConfig(agentx=agentx, gpus=getattr(args, "gpus", None),
        trace=args.trace, target=target, output=args.output, force=args.force, timing=timing,
        speedup=args.speedup, concurrency=args.concurrency,
        sessions_multiplier=args.sessions_multiplier, max_sessions=args.max_sessions,
        rate=getattr(args, "rate", None), arrival=getattr(args, "arrival", "poisson"),
        arrival_seed=getattr(args, "arrival_seed", 0),
        concurrent_sessions=getattr(args, "concurrent_sessions", None),
        ramp_s=getattr(args, "ramp", 1.0),
        duration_s=duration, warmup_s=args.warmup, api=args.api, model=args.model,
        include_failed=getattr(args, "include_failed", False),
        tokenizer=getattr(args, "tokenizer", None),
        salt=args.salt, vocab_size=args.vocab_size, request_timeout_s=args.request_timeout,
        workers=args.workers, cpus=args.cpus, scrape_interval_s=args.scrape_interval,
        vllm_extras=not args.no_vllm_extras, headers=_headers(args.header), loop=args.loop,
        http_client=getattr(args, "http_client", "fast"),
        timestamps=getattr(args, "timestamps", "auto"),
        progress=not args.no_progress, launch=getattr(args, "launch", None),
        gpu_metrics=getattr(args, "gpu_metrics", "auto"),
        gpu_interval_s=getattr(args, "gpu_interval", 0.1),
        ray=getattr(args, "ray", None), ray_actors_per_node=getattr(args, "ray_actors_per_node", 1),
        api_key=getattr(args, "api_key", None), insecure=getattr(args, "insecure", False),
        max_failure_rate=getattr(args, "max_failure_rate", 0.1),
        abort_after_failures=getattr(args, "abort_after_failures", None),
        max_think_s=getattr(args, "max_think", None),
        rebase_sessions=getattr(args, "rebase_sessions", False),
        keep_overlaps=getattr(args, "keep_overlaps", False))


def cmd_run(args: argparse.Namespace) -> int:
    from agent_replay.replay.run import run
    from agent_replay.replay.summary import render_summary

    summary = run(config_from_args(args, args.target))
    render_summary(summary, sys.stdout)
    return summary.exit_code  # 130 interrupted, 1 failed/aborted/partial, else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from agent_replay.replay.demo import demo
    from agent_replay.replay.summary import render_summary

    summary = demo(output=args.output, profile=args.profile, speedup=args.speedup, trace=args.trace)
    render_summary(summary, sys.stdout)
    return 130 if summary.interrupted else 0
