"""``RunConfig``: everything a replay run needs, as one frozen, picklable value."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from agent_replay.engines.aio import LOOP_KINDS
from agent_replay.engines.dialects import API_PATHS
from agent_replay.engines.telemetry.source import check_spec as check_gpu_metrics
from agent_replay.errors import InputError
from agent_replay.replay.affinity import parse_cpu_list
from agent_replay.replay.plan import TIMING_MODES, PlanOptions

TIMESTAMPS = ("auto", "kernel", "loop")
HTTP_CLIENTS = ("fast", "aiohttp")


@dataclass(frozen=True)
class RunConfig:
    trace: str
    target: str
    output: str | None = None
    """Results folder; None: ``results/<trace name>-<UTC time>``."""
    force: bool = False
    timing: str = "session"
    speedup: float = 1.0
    concurrency: int | None = None
    """max-rate: requests in flight at most (all workers together)."""
    sessions_multiplier: int = 1
    rate: float | None = None
    """Session arrival rate (sessions/s; ``replay.plan.arrival_offsets``), None: the trace's starts."""
    arrival: str = "poisson"
    concurrent_sessions: int | None = None
    """Replay this many sessions at once (``replay.plan.concurrent_starts``)."""
    ramp_s: float = 1.0
    arrival_seed: int = 0
    max_sessions: int | None = None
    duration_s: float | None = None
    warmup_s: float = 0.0
    api: str | None = None
    """Override the trace's api column (completions, chat, messages, responses)."""
    tokenizer: str | None = None
    """The target's tokenizer (file, folder or model name) for text prompts when the target
    has no /tokenize (needs the ``tokenizer`` extra)."""
    include_failed: bool = False
    """Replay requests the recording marked failed (``error`` set); left out by default."""
    model: str | None = None
    """None: the target's first model from /v1/models."""
    salt: int | None = None
    """Prompt salt; None: random per run (recorded in run.json). 0 reproduces."""
    vocab_size: int | None = None
    low_token_id: int = 1000
    request_timeout_s: float = 600.0
    workers: int = 1
    cpus: str | None = None
    """Pin each local worker to a CPU of its own: ``auto`` (one per physical core) or a list
    like ``2,4,6-9`` (see ``replay.affinity``); None: no pinning."""
    worker_cpus: tuple[int, ...] = ()
    """The CPU of each worker, resolved from ``cpus`` by ``run``."""
    scrape_interval_s: float | None = None
    """/metrics scrape period; None: 1 s when the target has /metrics; 0: off."""
    vllm_extras: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request, the /v1/models probe and /tokenize included."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer`` (and ``x-api-key`` for the messages API) unless
    ``headers`` name them; None: $OPENAI_API_KEY, or $ANTHROPIC_API_KEY for messages, when
    set (``auth_headers``). Never written: run.json shows it redacted."""
    insecure: bool = False
    """Accept any TLS certificate (self-signed test servers)."""
    max_failure_rate: float = 0.1
    """Exit 1 (status ``failed``) when more than this fraction of sent requests failed."""
    abort_after_failures: int | None = None
    """Stop the run (status ``aborted``) after this many failed requests in a row."""
    write_retry_s: float = 10.0
    """At a worker's end, how long part files that cannot be written (a full disk) are
    retried before their rows are counted as unwritten (``ResultWriter``)."""
    loop: str = "uvloop"
    http_client: str = "fast"
    """``fast`` (``replay.fastclient``: HTTP/1.1 on asyncio.Protocol; https targets fall back
    to aiohttp) or ``aiohttp``."""
    timestamps: str = "auto"
    """``loop``: a chunk's time is when the event loop hands over the read; ``kernel``: the
    kernel's receive time (``engines.kstamp``; fast client, Linux); ``auto``: kernel where it
    can be had, else loop (``effective_timestamps``)."""
    progress: bool = True
    gpu_metrics: str = "auto"
    """GPU telemetry (``engines.telemetry.source``): ``auto`` (NVML when the server is on
    this host or launched), ``nvml``, ``nvml:0,1``, a DCGM exporter's URL, or ``off``."""
    gpu_interval_s: float = 0.1
    """GPU telemetry sample period."""
    launch: str | None = None
    """A deployment profile to start before the run (the arguments of ``engines launch`` in one string; see ``replay.launch``)."""
    ray: str | None = None
    """Shards on Ray actors instead of local processes: ``auto`` (RAY_ADDRESS or the running
    local cluster), ``local`` (a private one-node Ray) or a cluster address."""
    ray_actors_per_node: int = 1
    t0_ns: int | None = None
    """The run's start on CLOCK_MONOTONIC; set by ``run`` for its workers."""
    run_id: str = "run"
    warmed_up: bool = False
    """A warm-up replay ran against the target just before this run (``agent-replay sweep``)."""
    max_think_s: float | None = None
    """Cap on every recorded think time, in trace seconds (before --speedup)."""
    rebase_sessions: bool = False
    """Every session starts at time zero instead of its recorded offset."""

    def plan_options(self) -> PlanOptions:
        return PlanOptions(speedup=self.speedup, sessions_multiplier=self.sessions_multiplier,
                           max_sessions=self.max_sessions,
                           # agentx recycles every session: the duration cuts lanes, not the plan
                           duration_s=None if self.timing == "agentx" else self.duration_s,
                           api_override=self.api, rate=self.rate, arrival=self.arrival,
                           concurrent_sessions=self.concurrent_sessions, ramp_s=self.ramp_s,
                           arrival_seed=self.arrival_seed, max_think_s=self.max_think_s,
                           rebase_sessions=self.rebase_sessions)

    def check(self) -> None:
        if self.timing not in TIMING_MODES:
            raise InputError(f"--timing must be one of {', '.join(TIMING_MODES)}, got {self.timing!r}")
        if self.timing == "max-rate" and not self.concurrency:
            raise InputError("--timing max-rate needs --concurrency N")
        if self.timing == "agentx" and not self.concurrency:
            raise InputError("--timing agentx needs --concurrency N (live session trees)")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")
        if self.cpus is not None and self.ray is not None:
            raise InputError("--cpus pins local workers; it does not apply with --ray")
        if self.cpus is not None and self.cpus != "auto":
            parse_cpu_list(self.cpus)
        if self.ray_actors_per_node < 1:
            raise InputError(f"--ray-actors-per-node must be >= 1, got {self.ray_actors_per_node}")
        if self.warmup_s < 0:
            raise InputError(f"--warmup must be >= 0, got {self.warmup_s}")
        if self.request_timeout_s <= 0:
            raise InputError(f"--request-timeout must be > 0, got {self.request_timeout_s}")
        if self.loop not in LOOP_KINDS:
            raise InputError(f"loop must be one of {', '.join(LOOP_KINDS)}")
        if self.http_client not in HTTP_CLIENTS:
            raise InputError(f"--http-client must be one of {', '.join(HTTP_CLIENTS)}, got {self.http_client!r}")
        if self.timestamps not in TIMESTAMPS:
            raise InputError(f"--timestamps must be one of {', '.join(TIMESTAMPS)}, "
                             f"got {self.timestamps!r}")
        if self.timestamps == "kernel" and (self.effective_http_client() != "fast"
                                            or not sys.platform.startswith("linux")):
            raise InputError("--timestamps kernel needs the fast client on Linux (an http:// "
                             "target, --http-client fast)")
        check_gpu_metrics(self.gpu_metrics)
        if self.gpu_interval_s <= 0:
            raise InputError(f"--gpu-interval must be > 0, got {self.gpu_interval_s}")
        if self.api is not None and self.api not in API_PATHS:
            raise InputError(f"--api must be one of {', '.join(API_PATHS)}, got {self.api!r}")
        if self.vocab_size is not None and self.vocab_size <= self.low_token_id:
            raise InputError(f"--vocab-size ({self.vocab_size}) must be > the lowest token id "
                             f"used ({self.low_token_id})")
        if not 0 <= self.max_failure_rate <= 1:
            raise InputError(f"--max-failure-rate must be within 0..1, got {self.max_failure_rate}")
        if self.abort_after_failures is not None and self.abort_after_failures < 1:
            raise InputError(f"--abort-after-failures must be >= 1, got {self.abort_after_failures}")
        if not self.write_retry_s >= 0:
            raise InputError(f"--write-retry must be >= 0, got {self.write_retry_s}")
        if not self.target.startswith(("http://", "https://")):
            raise InputError(f"--target must be an http(s) URL, got {self.target!r}")
        self.plan_options().check()

    def auth_headers(self, api: str) -> tuple[tuple[str, str], ...]:
        """``headers`` with the API key added for ``api`` (see ``api_key``)."""
        key = self.api_key
        if key is None:
            env = "ANTHROPIC_API_KEY" if api == "messages" else "OPENAI_API_KEY"
            key = os.environ.get(env) or None
        if not key:
            return self.headers
        names = {k.lower() for k, _ in self.headers}
        extra = []
        if "authorization" not in names:
            extra.append(("Authorization", f"Bearer {key}"))
        if api == "messages" and "x-api-key" not in names:
            extra.append(("x-api-key", key))
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
