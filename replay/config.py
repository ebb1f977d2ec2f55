"""``RunConfig``: everything a replay run needs, as one frozen, picklable value. Its
``option`` fields are the run options: the CLI, the sweep's ``[run]`` keys and run.json's
``options`` are made from them (``replay.options``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from agent_replay.engines.aio import LOOP_KINDS
from agent_replay.engines.dialects import API_PATHS, DIALECTS
from agent_replay.engines.telemetry.source import check_spec as check_gpu_metrics
from agent_replay.errors import InputError
from agent_replay.replay.affinity import parse_cpu_list
from agent_replay.replay.options import (
    CLOSED,
    LOAD,
    MEASUREMENT,
    OFFERED,
    OPTION,
    OUTPUT,
    PRESENTATION,
    SEED,
    Option,
    above,
    at_least,
    check_fields,
    internal,
    option,
    plan_values,
    within,
)
from agent_replay.replay.plan import ARRIVALS, TIMING_MODES, PlanOptions
from agent_replay.replay.presets import AGENTX_GROUP, AgentXSettings

TIMESTAMPS = ("auto", "kernel", "loop")
DEMO_SPEEDUP = 5.0
"""``agent-replay demo``'s default ``--speedup``."""
HTTP_CLIENTS = ("fast", "aiohttp")


def parse_headers(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--header NAME=VALUE`` values as (name, value) pairs."""
    out = []
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--header {item!r}: expected NAME=VALUE")
        out.append((name.strip(), value))
    return tuple(out)


@dataclass(frozen=True)
class RunConfig:
    """Every field made with ``option`` is a run option (``replay.options``): its CLI flag,
    sweep key, run.json entry and meaning (``kind``) come from the field, and its ``help``
    is its one description."""

    trace: str = field(metadata={OPTION: Option(cli=False)})
    target: str = field(metadata={OPTION: Option(cli=False)})
    output: str | None = option(
        None, kind=OUTPUT, short="-o", help="results folder (default results/<trace>-<time>)"
    )
    force: bool = option(False, kind=OUTPUT, help="replace an existing results folder")
    timing: str = option(
        "session",
        kind=LOAD,
        choices=TIMING_MODES,
        sweep=True,
        help="session: wait for the dependencies, then the think time (default); absolute: "
        "every request at its recorded arrival; max-rate: as fast as --concurrency allows; "
        "agentx: --concurrency live session trees, recycled, AgentX rules (default "
        "--duration-s 1800)",
    )
    speedup: float = option(
        1.0,
        kind=LOAD,
        checks=(above(0),),
        sweep=True,
        axis=OFFERED,
        plan=True,
        help="divide all times by this (default 1)",
    )
    concurrency: int | None = option(
        None,
        kind=LOAD,
        checks=(at_least(1),),
        axis=CLOSED,
        axis_sets=(("timing", "max-rate"),),
        help="max-rate and agentx: requests (session trees) in flight, all workers together",
    )
    sessions_multiplier: int = option(
        1,
        kind=LOAD,
        metavar="N",
        checks=(at_least(1),),
        sweep=True,
        plan=True,
        help="replay N copies of every session with disjoint prompts (default 1)",
    )
    rate: float | None = option(
        None,
        kind=LOAD,
        metavar="SESSIONS_PER_S",
        checks=(above(0),),
        axis=OFFERED,
        plan=True,
        help="sessions start as an arrival process at this rate instead of at the "
        "trace's times (see --arrival)",
    )
    arrival: str = option(
        "poisson",
        kind=LOAD,
        choices=ARRIVALS,
        sweep=True,
        plan=True,
        help="with --rate: exponential gaps (seeded by --arrival-seed) or fixed ones",
    )
    concurrent_sessions: int | None = option(
        None,
        kind=LOAD,
        metavar="N",
        checks=(at_least(1),),
        axis=OFFERED,
        plan=True,
        help="replay N sessions at once (the trace's, cloned with disjoint prompts "
        "as needed), started within --ramp-s seconds",
    )
    ramp_s: float = option(
        1.0,
        kind=LOAD,
        metavar="SECONDS",
        checks=(at_least(0),),
        sweep=True,
        plan=True,
        help="with --concurrent-sessions: spread the starts over this long (default 1)",
    )
    arrival_seed: int = option(0, kind=SEED, plan=True, help="seed of the Poisson arrivals")
    max_sessions: int | None = option(
        None,
        kind=LOAD,
        checks=(at_least(1),),
        sweep=True,
        plan=True,
        help="replay only the first N sessions",
    )
    duration_s: float | None = option(
        None,
        kind=LOAD,
        metavar="SECONDS",
        checks=(above(0),),
        sweep=True,
        plan=True,
        help="send nothing after this many seconds",
    )
    warmup_s: float = option(
        0.0,
        kind=LOAD,
        metavar="SECONDS",
        checks=(at_least(0),),
        sweep=True,
        help="requests sent in the first SECONDS are flagged warm-up (kept, not in stats)",
    )
    api: str | None = option(
        None,
        kind=LOAD,
        choices=tuple(API_PATHS),
        sweep=True,
        plan="api_override",
        help="override the trace's api column",
    )
    tokenizer: str | None = option(
        None,
        kind=MEASUREMENT,
        metavar="NAME_OR_PATH",
        help="the target's tokenizer (tokenizer.json, its folder, or a model name) "
        "for chat/messages/responses prompts when the target has no /tokenize "
        "(needs the tokenizer extra)",
    )
    include_failed: bool = option(
        False, kind=LOAD, help="also replay the requests the recording marked failed (error column)"
    )
    # the served model is compared from run.json's target block, not from this option
    model: str | None = option(
        None, kind=MEASUREMENT, sweep=True, help="model name (default: the target's first model)"
    )
    salt: int | None = option(
        None,
        kind=SEED,
        help="prompt salt (default: random per run, recorded in run.json; "
        "give the same salt to hit a previous run's prefix cache, 0 to reproduce)",
    )
    vocab_size: int | None = option(
        None, kind=MEASUREMENT, sweep=True, help="token ids stay below this (default 32000)"
    )
    low_token_id: int = option(
        1000,
        kind=MEASUREMENT,
        metavar="ID",
        checks=(at_least(0),),
        sweep=True,
        help="prompt token ids start at this id, above the special tokens of common "
        "vocabularies (default 1000)",
    )
    request_timeout_s: float = option(
        600.0,
        kind=MEASUREMENT,
        metavar="SECONDS",
        checks=(above(0),),
        sweep=True,
        help="a request not ended after this long fails (default 600)",
    )
    workers: int = option(
        1,
        kind=MEASUREMENT,
        checks=(at_least(1),),
        sweep=True,
        help="local worker processes (default 1)",
    )
    cpus: str | None = option(
        None,
        kind=MEASUREMENT,
        metavar="auto|LIST",
        sweep=True,
        help="pin each worker to a CPU of its own (Linux): auto = one per physical "
        "core, hyperthread siblings left out; or a list like 2,4,6-9. The dashboard "
        "and scraper get the CPUs left over (default: no pinning)",
    )
    worker_cpus: tuple[int, ...] = internal(())
    """The CPU of each worker, resolved from ``cpus`` by ``run``."""
    scrape_interval_s: float | None = option(
        None,
        kind=MEASUREMENT,
        metavar="SECONDS",
        checks=(at_least(0),),
        sweep=True,
        help="/metrics scrape period (default 1 when the target has /metrics; 0: off)",
    )
    vllm_extras: bool = option(
        True,
        kind=LOAD,
        flag="--no-vllm-extras",
        sweep=True,
        help="do not send ignore_eos, min_tokens, return_token_ids, continuous usage "
        "(for servers that reject them; a server that then sends no token counts "
        "per chunk gives requests marked 'inexact', left out of per-token metrics)",
    )
    headers: tuple[tuple[str, str], ...] = option(
        (),
        kind=MEASUREMENT,
        flag="--header",
        repeat=True,
        parse=parse_headers,
        metavar="NAME=VALUE",
        help="extra HTTP header (repeatable), e.g. Authorization=Bearer\\ KEY; sent with "
        "every request, the /v1/models probe and /tokenize included",
    )
    api_key: str | None = option(
        None,
        kind=MEASUREMENT,
        metavar="KEY",
        help="sent as Authorization: Bearer KEY (and the API's own key header: "
        "x-api-key for messages, x-goog-api-key for gemini) on every request, the "
        "probe included, unless --header names them (default: $OPENAI_API_KEY, or the "
        "API's own variable, $ANTHROPIC_API_KEY or $GEMINI_API_KEY, when set); never "
        "written to results",
    )
    insecure: bool = option(
        False, kind=MEASUREMENT, help="accept any TLS certificate (self-signed servers)"
    )
    max_failure_rate: float = option(
        0.1,
        kind=MEASUREMENT,
        metavar="FRACTION",
        checks=(within(0, 1),),
        help="exit 1 (status failed) when more than this fraction of the sent "
        "requests failed (default 0.1)",
    )
    abort_after_failures: int | None = option(
        None,
        kind=MEASUREMENT,
        metavar="N",
        checks=(at_least(1),),
        help="stop the run (status aborted, exit 1) after N failed requests in a row",
    )
    write_retry_s: float = option(
        10.0,
        kind=OUTPUT,
        metavar="SECONDS",
        checks=(at_least(0),),
        help="at the end, retry part files that cannot be written (a full disk) "
        "this long before their rows count as unwritten (exit 5; default 10)",
    )
    loop: str = option(
        "uvloop",
        kind=MEASUREMENT,
        choices=LOOP_KINDS,
        sweep=True,
        help="the workers' event loop (default uvloop)",
    )
    http_client: str = option(
        "fast",
        kind=MEASUREMENT,
        choices=HTTP_CLIENTS,
        sweep=True,
        help="fast: HTTP/1.1 on asyncio.Protocol, per-read work in the read callback "
        "(default; https targets use aiohttp); aiohttp: the aiohttp client",
    )
    timestamps: str = option(
        "auto",
        kind=MEASUREMENT,
        choices=TIMESTAMPS,
        sweep=True,
        help="kernel: a chunk's time is the kernel's receive time of its packet "
        "(SO_TIMESTAMPNS; fast client on Linux), so the load generator's own loop lag "
        "does not move it; loop: when the event loop reads it; auto (default): kernel "
        "where it can be had, else loop",
    )
    progress: bool = option(True, kind=PRESENTATION, flag="--no-progress", help="no progress lines")
    gpu_metrics: str = option(
        "auto",
        kind=MEASUREMENT,
        metavar="auto|nvml[:0,1]|URL|off",
        sweep=True,
        help="GPU telemetry beside the run: auto (default) = NVML when the server "
        "is on this host or launched (needs the gpu extra); nvml:0,1 = those GPUs; "
        "URL = a DCGM exporter's /metrics; off",
        aliases=(("--no-gpu-metrics", "off", "no GPU telemetry (same as --gpu-metrics off)"),),
    )
    gpu_interval_s: float = option(
        0.1,
        kind=MEASUREMENT,
        metavar="SECONDS",
        checks=(above(0),),
        sweep=True,
        help="GPU telemetry sample period (default 0.1)",
    )
    launch: str | None = field(
        default=None,
        metadata={
            OPTION: Option(
                cli=False,
                kind=MEASUREMENT,
                help="a deployment profile to start before the run (the "
                "arguments of engines launch in one string; see replay.launch)",
            )
        },
    )
    ray: str | None = option(
        None,
        kind=MEASUREMENT,
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run the shards on Ray actors (needs the ray extra): no ADDRESS = "
        "RAY_ADDRESS or the running local cluster; 'local' = a private one-node Ray; "
        "else the cluster address. Put it after TRACE, or write --ray=ADDRESS",
    )
    ray_actors_per_node: int = option(
        1,
        kind=MEASUREMENT,
        metavar="N",
        checks=(at_least(1),),
        help="with --ray: shard actors on every node (default 1)",
    )
    t0_ns: int | None = internal(None, record=False)
    """The run's start on CLOCK_MONOTONIC; set by ``run`` for its workers."""
    run_id: str = internal("run")
    warmed_up: bool = internal(False)
    """A warm-up replay ran against the target just before this run (``agent-replay sweep``)."""
    max_think_s: float | None = option(
        None,
        kind=LOAD,
        metavar="SECONDS",
        checks=(at_least(0),),
        plan=True,
        help="cap every recorded think time, in trace seconds before --speedup (tool "
        "timeouts of minutes are not load)",
    )
    rebase_sessions: bool = option(
        False,
        kind=LOAD,
        plan=True,
        help="start every session at time zero instead of its recorded offset",
    )
    keep_overlaps: bool = option(
        False,
        kind=LOAD,
        plan=True,
        help="a request also waits for every request of its session that had ended "
        "before it started in the recording (with --speedup: no overlaps the "
        "recording did not have)",
    )
    agentx: AgentXSettings = field(
        default_factory=AgentXSettings,
        metadata={
            OPTION: Option(
                nested=True,
                kind=LOAD,
                help="--timing agentx settings (replay.presets: --preset and its options)",
            )
        },
    )
    gpus: int | None = option(
        None,
        kind=MEASUREMENT,
        metavar="N",
        checks=(at_least(1),),
        group=AGENTX_GROUP,
        help="GPUs serving the target, prefill + decode when disaggregated (tokens/s "
        "per GPU; default: the launch profile's, else unknown)",
    )

    def plan_options(self) -> PlanOptions:
        """The request plan's options: every option declared ``plan``."""
        values = plan_values(self)
        if self.timing == "agentx":  # agentx recycles every session: the duration cuts lanes
            values["duration_s"] = None
        return PlanOptions(**values)

    def check(self) -> None:
        check_fields(self)  # every option's choices and rules
        if self.timing == "max-rate" and not self.concurrency:
            raise InputError("--timing max-rate needs --concurrency N")
        if self.timing == "agentx" and not self.concurrency:
            raise InputError("--timing agentx needs --concurrency N (live session trees)")
        if self.agentx.preset is not None and self.timing != "agentx":
            raise InputError(f"--preset {self.agentx.preset} needs --timing agentx")
        self.agentx.check()
        if self.cpus is not None and self.ray is not None:
            raise InputError("--cpus pins local workers; it does not apply with --ray")
        if self.cpus is not None and self.cpus != "auto":
            parse_cpu_list(self.cpus)
        if self.timestamps == "kernel" and (
            self.effective_http_client() != "fast" or not sys.platform.startswith("linux")
        ):
            raise InputError(
                "--timestamps kernel needs the fast client on Linux (an http:// "
                "target, --http-client fast)"
            )
        check_gpu_metrics(self.gpu_metrics)
        if self.vocab_size is not None and self.vocab_size <= self.low_token_id:
            raise InputError(
                f"--vocab-size ({self.vocab_size}) must be > the lowest token id "
                f"used ({self.low_token_id})"
            )
        if not self.target.startswith(("http://", "https://")):
            raise InputError(f"--target must be an http(s) URL, got {self.target!r}")
        self.plan_options().check()

    def auth_headers(self, api: str) -> tuple[tuple[str, str], ...]:
        """``headers`` with the API key added for ``api`` (see ``api_key``)."""
        d = DIALECTS.get(api)
        key = self.api_key
        if key is None:
            key = os.environ.get(d.key_env if d else "OPENAI_API_KEY") or None
        if not key:
            return self.headers
        names = {k.lower() for k, _ in self.headers}
        extra = []
        if "authorization" not in names:
            extra.append(("Authorization", f"Bearer {key}"))
        if d is not None and d.key_header and d.key_header.lower() not in names:
            extra.append((d.key_header, key))
        return self.headers + tuple(extra)

    def effective_timestamps(self) -> str:
        """``kernel`` or ``loop``: what a worker stamps chunks with."""
        if self.timestamps != "auto":
            return self.timestamps
        kernel = self.effective_http_client() == "fast" and sys.platform.startswith("linux")
        return "kernel" if kernel else "loop"

    def effective_http_client(self) -> str:
        """The client a worker uses: the fast one speaks plain http only."""
        if self.http_client == "fast" and self.target.startswith("https://"):
            return "aiohttp"
        return self.http_client
