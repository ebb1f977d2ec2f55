"""The library entry of a replay run: ``run(config) -> RunSummary`` and ``arun`` (async).

Order of work: check the options, read and validate the trace and build the plan (bad
input fails here, before anything is sent), probe the target (unreachable: one line, exit
3), create the results folder (never over an existing one without ``force``), write
run.json, start the /metrics scraper, run the workers from one shared t0, merge their
summaries, write run.json again with the outcome and the load generator's self-check.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import importlib
import importlib.util
import multiprocessing as mp
import os
import platform
import queue
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent_replay import __version__
from agent_replay.analysis.selfcheck import MachineMeter
from agent_replay.engines import aio
from agent_replay.engines.metrics_scrape import metrics_url
from agent_replay.errors import AgentReplayError
from agent_replay.redact import redact, redact_url, split_userinfo
from agent_replay.replay.affinity import kept_affinity, pin, pin_loop_thread, rest_cpus, worker_cpus
from agent_replay.replay.config import RunConfig
from agent_replay.replay.lifeline import (
    die_with_parent,
    parent_alive,
    sigterm_as_sigint,
    sigterm_received,
)
from agent_replay.replay.messages import Progress
from agent_replay.replay.plan import Plan, build_plan
from agent_replay.replay.provenance import code_version, provenance
from agent_replay.replay.results import prepare_folder, write_json_atomic
from agent_replay.replay.selfmon import SelfReport, stall_distribution, verdict
from agent_replay.replay.target import TargetInfo, base_url, probe
from agent_replay.replay.worker import WorkerSummary, arun_shard, run_shard
from agent_replay.results_schema import RESULTS_SCHEMA_VERSION, ErrorKind
from agent_replay.traces.failed import drop_failed
from agent_replay.traces.io import read_trace, trace_files

Reporter = Callable[[str], None]


@dataclass
class RunSummary:
    output: str
    total: int = 0
    sent: int = 0
    ok: int = 0
    skipped: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    mismatches: int = 0
    inexact: int = 0
    chunks: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    interrupted: bool = False
    self_check: SelfReport = field(default_factory=SelfReport)
    workers: list[WorkerSummary] = field(default_factory=list)
    loop_stalls: dict[str, Any] = field(default_factory=dict)  # selfmon.stall_distribution
    gc: dict[str, int] = field(default_factory=dict)  # worst worker's QuietRuntime.stats()
    partial: bool = False  # workers died (Ray actors): some sessions were not replayed
    lost_sessions: int = 0
    lost_requests: int = 0
    aborted: bool = False  # --abort-after-failures stopped it
    max_failure_rate: float = 0.1

    @property
    def status(self) -> str:
        """The run's final status: ``interrupted`` (Ctrl-C, SIGTERM), ``aborted``
        (``--abort-after-failures``), ``partial`` (workers lost), ``failed`` (more than
        ``max_failure_rate`` of the sent requests failed) or ``ok``."""
        if self.interrupted:
            return "interrupted"
        if self.aborted:
            return "aborted"
        if self.partial:
            return "partial"
        if self.failed and self.failed > self.max_failure_rate * max(1, self.sent - self.cancelled):
            return "failed"
        return "ok"

    @property
    def exit_code(self) -> int:
        """130 interrupted, 1 aborted, partial or failed, else 0."""
        return {"ok": 0, "interrupted": 130}.get(self.status, 1)

    def partial_line(self) -> str | None:
        """The one line a partial run ends with (None when the run is not partial)."""
        if not self.partial:
            return None
        return (f"error: partial run: {self.lost_sessions} sessions ({self.lost_requests} "
                f"requests) were lost with their workers; partial results (every recorded "
                f"request) are in {self.output}, the lost sessions are listed in "
                f"{Path(self.output) / 'run.json'} under ray.lost")

    @property
    def failed(self) -> int:
        """Failed requests; those cancelled by the run's own stop are not failures."""
        return sum(v for k, v in self.errors.items() if k != ErrorKind.CANCELLED)

    @property
    def cancelled(self) -> int:
        """In flight when the run was stopped (Ctrl-C, abort)."""
        return self.errors.get(ErrorKind.CANCELLED, 0)

    @property
    def warnings(self) -> list[str]:
        return self.self_check.warnings


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in trace_files(path):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def load_and_validate(config: RunConfig) -> Plan:
    table, meta = read_trace(config.trace)
    try:
        validate = importlib.import_module("agent_replay.traces.validate").validate_or_raise
    except (ImportError, AttributeError):  # pragma: no cover - validator ships with traces
        validate = None
    if validate is not None:
        validate(table, meta, config.trace)
    if not config.include_failed:
        table, _ = drop_failed(table)
    return build_plan(table, meta.block_size, config.plan_options())


def with_credentials(config: RunConfig, plan: Plan) -> RunConfig:
    """``config`` whose headers carry the credentials: the API key (``RunConfig.auth_headers``,
    for the API most of the plan's requests use), or the target URL's user-info as Basic
    auth; the target is the server's root without user-info (``target.base_url``)."""
    apis: dict[str, int] = {}
    for session in plan.sessions:
        for q in session.requests:
            apis[q.api] = apis.get(q.api, 0) + 1
    api = config.api or max(apis, key=lambda a: apis[a], default="completions")
    target, basic = split_userinfo(base_url(config.target))
    headers = config.auth_headers(api)
    if basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
        headers += (("Authorization", basic),)  # user-info in the URL: Basic auth
    return replace(config, target=target, headers=headers)


def default_output(trace: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return str(Path("results") / f"{Path(trace).stem}-{stamp}")


def resolve(config: RunConfig, info: TargetInfo) -> RunConfig:
    model = config.model
    if model is None:
        if not info.models:
            raise AgentReplayError(f"{info.url}/v1/models lists no model; pass --model")
        model = info.models[0]
    salt = config.salt if config.salt is not None else secrets.randbits(63)
    vocab = config.vocab_size
    if vocab is None:  # a server that reports its vocabulary size is believed; else 32000
        reported = [m.get("vocab_size") for m in info.raw_models if m.get("id") == model]
        vocab = next((v for v in reported if isinstance(v, int) and v > config.low_token_id), 32000)
    return replace(config, model=model, salt=salt, vocab_size=vocab,
                   output=config.output or default_output(config.trace),
                   run_id=config.run_id if config.run_id != "run" else secrets.token_hex(4))


def _environment(config: RunConfig) -> dict[str, Any]:
    import aiohttp
    import pyarrow

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return {
        "agent_replay": __version__, "commit": code_version(), "python": platform.python_version(), "aiohttp": aiohttp.__version__,
        "pyarrow": pyarrow.__version__, "numpy": np.__version__, "uvloop": uv,
        "host": socket.gethostname(), "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "loop": config.loop if (config.loop != "uvloop" or uv) else "asyncio",
        "http_client": config.effective_http_client(),
        "timestamps": config.effective_timestamps(),
    }


def _meta(config: RunConfig, info: TargetInfo, plan: Plan, trace_sha: str, t0: int,
          wall_t0: int, status: str) -> dict[str, Any]:
    opts = redact(asdict(config))
    opts.pop("t0_ns", None)
    return {
        "results_schema_version": RESULTS_SCHEMA_VERSION, "status": status, "run_id": config.run_id,
        "trace": {"path": str(Path(config.trace).resolve()), "sha256": trace_sha,
                  "block_size": plan.block_size},
        "target": {"url": redact_url(config.target), "model": config.model, "models": info.models,
                   "max_model_len": info.max_model_len, "has_metrics": info.has_metrics},
        "options": opts, "salt": config.salt, "environment": _environment(config),
        "clock": {"kind": "CLOCK_MONOTONIC", "t0_monotonic_ns": t0, "t0_wall_ns": wall_t0},
        "warmup_ns": int(config.warmup_s * 1e9),
        "planned": {"sessions": len(plan.sessions), "requests": plan.n_requests},
    }


class _Scrape:
    """The /metrics scraper (engines.metrics_scrape) in its own process, so that parsing
    Prometheus text never takes the GIL from the measuring event loop."""

    def __init__(self, url: str, interval_s: float, out: Path) -> None:
        self.url, self.interval_s, self.out = url, interval_s, out
        ctx = mp.get_context("spawn")
        self.gauges: Any = None  # analysis.dashboard.SharedGauges: the dashboard's, from each scrape
        try:
            from agent_replay.analysis.dashboard import SharedGauges
        except ImportError:  # pragma: no cover - rich is a core dependency
            pass
        else:
            self.gauges = SharedGauges()
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._errq: Any = ctx.Queue()
        self.t0: Any = ctx.Value("q", 0)
        self._proc = ctx.Process(target=_scrape_main, name="agent-replay-scrape", daemon=True,
                                 args=(url, interval_s, str(out), self._stop, self._ready, self._errq,
                                       self.t0, self.gauges))
        self.error: str | None = None

    def start(self) -> bool:
        if importlib.util.find_spec("agent_replay.engines.metrics_scrape") is None:
            return False
        self._proc.start()
        self._ready.wait(timeout=20)  # the baseline scrape precedes t0
        return True

    def stop(self) -> None:
        if self._proc.pid is None:
            return
        self._stop.set()
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.terminate()
        with contextlib.suppress(queue.Empty):
            self.error = self._errq.get_nowait()


def gpu_source(config: RunConfig, launch_info: dict[str, Any] | None) -> tuple[Any, str]:
    """``engines.telemetry.resolve`` for this run: a server counts as launched when ``run
    --launch`` or a sweep's launch target started it (not a sweep's URL or sim target), and
    then its CUDA_VISIBLE_DEVICES (else this process's) picks the GPUs ``auto`` samples;
    for a server on this host reached by URL, the listening process's CUDA_VISIBLE_DEVICES."""
    from agent_replay.engines.telemetry import resolve
    from agent_replay.engines.telemetry.source import server_visible_devices

    launched = launch_info is not None and launch_info.get("kind", "launch") == "launch"
    visible = None
    if launch_info is not None and launched:
        visible = (launch_info.get("env") or {}).get("CUDA_VISIBLE_DEVICES",
                                                     os.environ.get("CUDA_VISIBLE_DEVICES"))
    elif config.gpu_metrics == "auto":
        visible = server_visible_devices(config.target)
    return resolve(config.gpu_metrics, config.target, launched, visible)


def _start_gpu_telemetry(config: RunConfig, out: Path, launch_info: dict[str, Any] | None,
                         progress: Reporter | None) -> tuple[Any, dict[str, Any]]:
    """The GPU sampler (engines.telemetry) started before t0 in its own process, or None
    and the run.json block that says why (also said in one line). A launched server's
    CUDA_VISIBLE_DEVICES limits ``auto`` to its GPUs."""
    from agent_replay.engines.telemetry import FILE_NAME, TelemetryProcess
    from agent_replay.engines.telemetry.source import nvml_unavailable

    source, why = gpu_source(config, launch_info)
    if source is not None and source.kind == "nvml":
        why = nvml_unavailable() or ""
        if why:
            source = None
    if source is not None:
        tel = TelemetryProcess(source, config.gpu_interval_s, out / FILE_NAME)
        if tel.start():
            return tel, {}
        why = tel.off_reason or ""
    if progress is not None:
        progress(f"GPU telemetry off: {why}")
    return None, {"enabled": False, "reason": why}


def _scrape_main(url: str, interval_s: float, out: str, stop: Any, ready: Any, errq: Any,
                 t0: Any, gauges: Any = None) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    die_with_parent(signal.SIGTERM)  # ...or its end does
    from agent_replay.engines.metrics_scrape import Scraper

    async def go() -> None:
        on_scrape = None
        if gauges is not None:
            from agent_replay.analysis.dashboard import gauge_sums

            def on_scrape(rows: list[tuple[int, str, str, float]]) -> None:
                gauges.write(gauge_sums((name, value) for _, name, _, value in rows))

        scraper = Scraper(url, interval_s, time.monotonic_ns, on_scrape=on_scrape)
        await scraper.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        table = await scraper.stop()
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        # Scrape times as offsets from the run's t0, like every time in requests/.
        t_ns = pc.subtract(table.column("t_ns"), pa.scalar(int(t0.value), pa.int64()))
        table = table.set_column(table.schema.get_field_index("t_ns"), table.schema.field("t_ns"), t_ns)

        dest = Path(out)
        tmp = dest.with_name(f".{dest.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, dest)

    try:
        asyncio.run(go())
    except Exception as exc:  # reported in run.json, never fatal to the run
        ready.set()
        errq.put(f"{type(exc).__name__}: {exc}")


class _Progress:
    """Progress while the run goes: the analysis dashboard (its own process; it reads the
    request statistics from the part files, or takes the Ray pool's merged snapshots) when
    available, else a plain line every few seconds."""

    def __init__(self, out: Reporter | None, every_s: float = 2.0, dashboard: Any = None) -> None:
        self.out = out
        self.every_ns = int(every_s * 1e9)
        self.last: dict[int, Progress] = {}
        self._printed = 0
        self._chunks0 = (0, time.monotonic_ns())
        self.dashboard = dashboard
        self._snaps: dict[int, bytes] = {}
        self._own: Any = None  # LiveStats of progress and loop lag, when the dashboard reads the parts
        self._sent_ns = 0

    @classmethod
    def create(cls, out: Reporter | None, total: int, title: str, gauges_url: str | None,
               results_dir: str | None = None, shared_gauges: Any = None,
               gpu_gauges: Any = None) -> _Progress:
        """With ``results_dir``, the dashboard computes the request statistics from the
        part files there, and ``update`` sends it progress and loop lag only; without it,
        ``live`` sends it complete snapshots (the Ray pool's). ``shared_gauges``: the
        server gauges from the run's scraper (then the dashboard does not scrape itself)."""
        if out is None:
            return cls(None)
        try:
            from agent_replay.analysis.dashboard import DashboardProcess
        except ImportError:
            return cls(out)
        dash = DashboardProcess(total, title=title, server_gauges_url=gauges_url, results_dir=results_dir,
                                shared_gauges=shared_gauges, gpu_gauges=gpu_gauges)
        dash.start()
        prog = cls(out, dashboard=dash)
        if results_dir is not None:
            from agent_replay.analysis.live import LiveStats

            prog._own = LiveStats()
        return prog

    def live(self, shard: int, snapshot: bytes) -> None:
        """A worker's cumulative LiveStats snapshot: merge all workers', show the result."""
        if self.dashboard is None:
            return
        self._snaps[shard] = snapshot
        if len(self._snaps) == 1:
            self.dashboard.update(snapshot)
            return
        from agent_replay.analysis.live import LiveStats

        merged: Any = None
        for raw in self._snaps.values():
            st = LiveStats.decode(raw)
            if merged is None:
                merged = st
            else:
                merged.merge(st)
        self.dashboard.update(merged.encode())

    def _to_dashboard(self, msg: Progress | None, now: int) -> None:
        """Progress summed over the workers, and their loop-lag samples; sent at most every
        0.25 s (with one worker this runs on its measuring loop, so it is kept rare)."""
        st = self._own
        if msg is not None:
            st.observe_loop_lags(msg.loop_lags)
        if now - self._sent_ns < 250_000_000 and msg is not None and msg.done != msg.total:
            return
        self._sent_ns = now
        last = self.last.values()
        st.done, st.total = sum(m.done for m in last), sum(m.total for m in last)
        st.in_flight, st.active_sessions = sum(m.in_flight for m in last), sum(m.sessions for m in last)
        st.elapsed_ns = max(m.elapsed_ns for m in last)
        st.cpu_percent = [m.cpu * 100 for m in last]
        assert self.dashboard is not None
        self.dashboard.update(st.encode())

    def close(self) -> None:
        if self.dashboard is not None:
            if self._own is not None and self.last:
                self._sent_ns = 0
                self._to_dashboard(None, time.monotonic_ns())
            self.dashboard.stop()
            self.dashboard = None

    def update(self, msg: Progress) -> None:
        self.last[msg.shard] = msg
        now = time.monotonic_ns()
        if self._own is not None:
            self._to_dashboard(msg, now)
        if self.out is None or self.dashboard is not None or now - self._printed < self.every_ns:
            return
        self._printed = now
        agg = {k: sum(getattr(m, k) for m in self.last.values()) for k in
               ("total", "done", "errors", "in_flight", "sessions", "chunks", "output_tokens")}
        c0, t0 = self._chunks0
        rate = (agg["chunks"] - c0) / max((now - t0) / 1e9, 1e-9)
        self._chunks0 = (agg["chunks"], now)
        elapsed = max(m.elapsed_ns for m in self.last.values()) / 1e9
        self.out(f"[{elapsed:7.1f}s] {agg['done']}/{agg['total']} done, {agg['errors']} failed, "
                 f"{agg['in_flight']} in flight, {agg['sessions']} sessions, "
                 f"{rate:,.0f} chunks/s, {agg['output_tokens']:,} tokens")


def run(config: RunConfig, *, progress: Reporter | None = _stderr,
        launch_info: dict[str, Any] | None = None) -> RunSummary:
    """Replay ``config.trace`` against ``config.target`` (or against the vLLM that
    ``config.launch`` describes, started first and stopped after); see the module docs.
    ``launch_info``: what the caller knows of a server it started (for run.json)."""
    with kept_affinity(), sigterm_as_sigint():  # --cpus pins this process for the run only
        if config.launch is None:
            return _run(config, progress, launch_info=launch_info)
        from agent_replay.replay.launch import launched

        with launched(config.launch) as (url, info):
            return _run(replace(config, target=url), progress, launch_info=info)


async def arun(config: RunConfig, *, progress: Reporter | None = _stderr) -> RunSummary:
    """``run`` for callers that already have an event loop (notebooks): runs in a thread."""
    return await asyncio.to_thread(run, config, progress=progress)


def _run(config: RunConfig, progress: Reporter | None,
         launch_info: dict[str, Any] | None = None) -> RunSummary:
    config.check()
    plan = load_and_validate(config)
    config = with_credentials(config, plan)
    info = asyncio.run(probe(config.target, headers=dict(config.headers),
                             insecure=config.insecure))
    config = resolve(config, info)
    n = min(config.workers, max(1, len(plan.sessions)))
    if config.cpus is not None:  # check() refuses it with --ray
        config = replace(config, worker_cpus=tuple(worker_cpus(config.cpus, n)))
    out = Path(config.output or ".")
    prepare_folder(out, config.force)
    if config.worker_cpus:
        pin(rest_cpus(config.worker_cpus))  # the scraper and the dashboard start from here: the rest
    trace_sha = _sha256(config.trace)
    # The scraper's baseline is taken before t0 (its process starts first).
    interval = config.scrape_interval_s
    if interval is None:
        interval = 1.0 if info.has_metrics else 0.0
    scrape = _Scrape(config.target, interval, out / "server_metrics.parquet") if interval > 0 else None
    scrape_info = {"interval_s": interval, "available": bool(scrape and scrape.start())}
    gpu_tel, gpu_off = _start_gpu_telemetry(config, out, launch_info, progress)
    start_delay_ns = 200_000_000
    pool = None
    spawned: _Spawned | None = None
    if config.ray is None and n > 1:
        spawned = _Spawned(config, n)
        spawned.wait_ready()
        start_delay_ns = 300_000_000
    if config.ray is not None:
        from agent_replay.replay.distributed import RayPool

        pool = RayPool.start(config, plan, config.ray, config.ray_actors_per_node)
        n, start_delay_ns = pool.size, pool.start_delay_ns
    # The dashboard starts before t0 and says when it is ready: its start-up is not the run's.
    prog = _Progress.create(progress if config.progress else None, plan.n_requests,
                            f"agent-replay {Path(config.trace).name} -> {redact_url(config.target)}",
                            metrics_url(config.target) if info.has_metrics else None,
                            results_dir=None if pool is not None else str(out),
                            shared_gauges=scrape.gauges if scrape is not None and scrape_info["available"] else None,
                            gpu_gauges=gpu_tel.gauges if gpu_tel is not None else None)
    if pool is not None and prog.dashboard is not None:
        # The pool merges its actors' snapshots itself: one stream for the dashboard.
        pool.on_snapshot = lambda snap: prog.live(0, snap)
    t0 = time.monotonic_ns() + start_delay_ns
    wall_t0 = time.time_ns() + start_delay_ns
    config = replace(config, t0_ns=t0, workers=n)
    meta = _meta(config, info, plan, trace_sha, t0, wall_t0, "running")
    meta["scrape"] = scrape_info
    if launch_info is not None:
        meta["launch"] = launch_info
    meta["provenance"] = provenance(config.target, launch_info)
    if scrape is not None:
        scrape.t0.value = t0
    if gpu_tel is not None:
        gpu_tel.set_t0(t0)
    meta["gpu_telemetry"] = gpu_tel.describe() if gpu_tel is not None else gpu_off
    write_json_atomic(out / "run.json", meta)
    too_long = _over_context(plan, info.max_model_len)
    if too_long:
        meta.setdefault("warnings_before_run", []).append(
            f"{too_long} requests need more than the target's max_model_len ({info.max_model_len}) "
            "tokens: the server will refuse them")
        if progress is not None:
            progress(f"warning: {meta['warnings_before_run'][-1]}")
    if progress is not None:
        progress(f"replaying {plan.n_requests} requests in {len(plan.sessions)} sessions "
                 f"({config.timing} timing, x{config.speedup:g}) against {redact_url(config.target)} "
                 f"model {config.model}; results: {out}")
    summaries: list[WorkerSummary] = []
    interrupted = False
    host = MachineMeter()
    try:
        if pool is not None:
            summaries = pool.run(config, prog.update, progress)
        elif n == 1:
            summaries = [_in_process(config, plan, prog)]
        else:
            assert spawned is not None
            summaries = spawned.run(t0, prog)
    except KeyboardInterrupt:
        interrupted = True
        if spawned is not None:  # the workers that reported before the stop
            summaries = [spawned.results[i] for i in sorted(spawned.results)]
    except Exception as exc:  # a worker failed (a dead server, say): a final status first
        meta.update({"status": "failed", "error": redact_url(str(exc))[:500]})
        write_json_atomic(out / "run.json", meta)
        raise
    finally:
        if scrape is not None:  # first: its final scrape is the dashboard's last gauges
            scrape.stop()
            if scrape.error:
                meta["scrape"]["error"] = scrape.error
        if gpu_tel is not None:
            meta["gpu_telemetry"] = gpu_tel.stop()
        prog.close()
        if pool is not None:
            meta["ray"] = pool.describe()
            pool.close()
    summary = _merge(str(out), summaries, config, interrupted or any(s.interrupted for s in summaries),
                     machine=host.machine(sum(w.cpu_s for w in summaries)) if pool is None else None)
    if pool is not None and pool.lost:
        summary.self_check.warnings.extend(x.line() for x in pool.lost)
    meta.update(_outcome(summary))
    if config.timing == "agentx":
        _agentx_meta(meta, out, summary)
    if pool is not None and pool.lost:
        summary.lost_sessions = sum(len(x.sessions) for x in pool.lost)
        summary.lost_requests = sum(x.planned_requests - x.recorded_requests for x in pool.lost)
        if meta["status"] in ("ok", "failed"):
            summary.partial = True
            meta["status"] = summary.status
    write_json_atomic(out / "run.json", meta)
    if summary.interrupted and progress is not None:
        progress(f"interrupted: partial results (every completed request) are in {out}")
    elif summary.partial and progress is not None:
        progress(summary.partial_line() or "")
    return summary


def _agentx_meta(meta: dict[str, Any], out: Path, summary: RunSummary) -> None:
    """run.json's ``agentx`` block: validity (context overflows, warm-up excluded) and the
    idle time skipped; an invalid run says so first among the warnings."""
    import pyarrow.parquet as pq

    from agent_replay.replay.agentx import agentx_validity

    cols = ["warmup", "http_status", "error"]
    rows: list[tuple[bool, int | None, str | None]] = []
    for f in sorted((out / "requests").glob("*.parquet")):
        d = pq.read_table(f, columns=cols).to_pydict()
        rows += zip(d["warmup"], d["http_status"], d["error"], strict=True)
    block = agentx_validity(rows)
    block["idle_skipped_s"] = sum(w.idle_skipped_ns for w in summary.workers) / 1e9
    meta["agentx"] = block
    meta["valid"] = block["valid"]
    if not block["valid"]:
        meta["warnings"] = [f"INVALID run (AgentX rule): {block['invalid_reason']}",
                            *meta.get("warnings", [])]


def _in_process(config: RunConfig, plan: Plan, prog: _Progress) -> WorkerSummary:
    if config.worker_cpus:
        pin_loop_thread(config.worker_cpus, 0)
    return aio.run(arun_shard(config, 0, 1, prog.update, plan=plan), config.loop)


class _Spawned:
    """Local worker processes. They start, build their plan and say ready before t0 is
    chosen, then all start from the one t0 the parent hands them (CLOCK_MONOTONIC is
    shared by every process on the host), so slow process start-up is never schedule lag."""

    def __init__(self, config: RunConfig, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.q: Any = ctx.Queue()
        self.go = ctx.Event()
        self.t0: Any = ctx.Value("q", 0)
        self.procs = [ctx.Process(target=_proc_main, args=(config, i, n, self.q, self.go, self.t0),
                                  name=f"replay-worker-{i}") for i in range(n)]
        for p in self.procs:
            p.start()
        self.results: dict[int, WorkerSummary] = {}
        self.failures: list[str] = []

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(ready) < self.n:
            try:
                kind, shard, payload = self.q.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.stop()
                    raise AgentReplayError(f"worker processes did not start: {', '.join(dead) or 'timeout'}") from None
                continue
            if kind == "ready":
                ready.add(shard)
            elif kind == "error":
                self.stop()
                raise AgentReplayError(payload)

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)

    def run(self, t0: int, prog: _Progress) -> list[WorkerSummary]:
        self.t0.value = t0
        self.go.set()
        n, procs, results, failures = self.n, self.procs, self.results, self.failures
        try:
            while len(results) + len(failures) < n:
                try:
                    kind, shard, payload = self.q.get(timeout=0.5)
                except queue.Empty:
                    dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead and self.q.empty():
                        failures.extend(f"worker {p.name} exited with code {p.exitcode}" for p in dead
                                        if f"worker {p.name} exited with code {p.exitcode}" not in failures)
                        if len(results) + len(failures) >= n:
                            break
                    continue
                if kind == "progress":
                    prog.update(payload)
                elif kind == "done":
                    results[shard] = payload
                elif kind == "error":
                    failures.append(payload)
        except KeyboardInterrupt:
            # A Ctrl-C at a terminal reached the workers too; a SIGTERM to this process did
            # not: pass it on. Then let them write what they have.
            if sigterm_received():
                for p in procs:
                    if p.is_alive() and p.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p.pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while len(results) < n and time.monotonic() < deadline:
                try:
                    kind, shard, payload = self.q.get(timeout=0.5)
                except queue.Empty:
                    if not any(p.is_alive() for p in procs):
                        break
                    continue
                if kind == "done":
                    results[shard] = payload
            for p in procs:
                p.join(timeout=5)
            raise
        for p in procs:
            p.join(timeout=30)
        if failures:
            raise AgentReplayError("; ".join(failures))
        return [results[i] for i in sorted(results)]


def _proc_main(config: RunConfig, shard: int, n: int, q: Any, go: Any, t0: Any) -> None:
    from agent_replay.replay.worker import load_plan

    parent = os.getppid()
    die_with_parent(signal.SIGINT, parent)  # a parent killed outright: stop as on Ctrl-C
    try:
        plan = load_plan(config)
        q.put(("ready", shard, None))
        go.wait()
        if config.worker_cpus:
            pin_loop_thread(config.worker_cpus, shard)
        summary = run_shard(replace(config, t0_ns=int(t0.value)), shard, n, q, plan=plan)
        if parent_alive(parent):
            q.put(("done", shard, summary))
    except KeyboardInterrupt:
        pass
    except AgentReplayError as exc:
        q.put(("error", shard, f"worker {shard}: {exc}"))
    except Exception as exc:
        q.put(("error", shard, f"worker {shard}: {type(exc).__name__}: {exc}"))
    finally:
        # The work is over: a parent's death from here on (its SIGINT) must not break the
        # exit half-way through the queue's own finalizers, which would then wait forever.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not parent_alive(parent):  # nobody reads the queue: do not wait to flush it
            q.cancel_join_thread()


def _over_context(plan: Plan, max_model_len: int | None) -> int:
    if not max_model_len:
        return 0
    return sum(1 for s in plan.sessions for q in s.requests
               if q.input_tokens + q.output_tokens > max_model_len)


def _merge(out: str, ws: list[WorkerSummary], config: RunConfig, interrupted: bool,
           machine: Any = None) -> RunSummary:
    s = RunSummary(output=out, workers=ws, interrupted=interrupted,
                   aborted=any(w.aborted for w in ws), max_failure_rate=config.max_failure_rate)
    for w in ws:
        s.total += w.total
        s.sent += w.sent
        s.ok += w.ok
        s.skipped += w.skipped
        s.mismatches += w.mismatches
        s.inexact += w.inexact
        s.chunks += w.chunks
        s.output_tokens += w.output_tokens
        s.cpu_s += w.cpu_s
        s.wall_s = max(s.wall_s, w.wall_s)
        for k, v in w.errors.items():
            s.errors[k] = s.errors.get(k, 0) + v
    lag = np.concatenate([w.schedule_lag_ns() for w in ws]) if ws else np.zeros(0, np.int64)
    loop_lag = np.concatenate([w.loop_lag_ns() for w in ws]) if ws else np.zeros(0, np.int64)
    cpu = max((w.cpu_s / w.wall_s for w in ws if w.wall_s > 0), default=0.0)
    s.self_check = verdict(lag, loop_lag, cpu, config.timing, machine)
    s.loop_stalls = stall_distribution(loop_lag)
    for w in ws:
        for k, v in w.gc.items():
            s.gc[k] = v + s.gc.get(k, 0) if k in ("gc_young_collections", "gc_end_collected") \
                else max(v, s.gc.get(k, 0))
    if s.mismatches:
        s.self_check.warnings.append(
            f"{s.mismatches} requests were not served with the trace's token counts (see error "
            "column, error_kind 'mismatch' or 'inexact'): check ignore_eos/min_tokens support "
            "and --vocab-size")
    return s


def _outcome(s: RunSummary) -> dict[str, Any]:
    sc = s.self_check
    bottleneck = [sc.line] if sc.kind == "saturated" and sc.line else []
    return {
        "status": s.status,
        "summary": {"total": s.total, "sent": s.sent, "ok": s.ok, "failed": s.failed,
                    "cancelled": s.cancelled,
                    "errors": s.errors, "skipped": s.skipped, "mismatches": s.mismatches,
                    "inexact": s.inexact,
                    "chunks": s.chunks, "output_tokens": s.output_tokens, "wall_s": s.wall_s,
                    "cpu_s": s.cpu_s},
        "self_check": asdict(sc),
        "loop_stalls": s.loop_stalls,
        "gc": s.gc,
        "worker_cpus": [w.cpus for w in sorted(s.workers, key=lambda w: w.shard)],
        "load_generator_bottleneck": bool(bottleneck),
        "load_generator_warning": bottleneck[0] if bottleneck else None,
        "machine_contention": sc.kind == "contention",
        "warnings": sc.warnings,
    }
