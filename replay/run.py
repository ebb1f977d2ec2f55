"""The library entry of a replay run: ``run(config) -> RunSummary`` and ``arun`` (async).

Order of work: check the options, read and validate the rows the run can send (bad input
fails here, before anything is sent), probe the target (unreachable: one line, exit 3),
build the plan, create the results folder and lock it (replay.folderlock: one writer;
``force`` moves earlier results aside), start the /metrics scraper and the GPU sampler
(replay.scrape), the worker pool (replay.pools) and the progress feed (replay.feed), choose
t0 and write run.json, run the workers from that one t0, merge their summaries and write
run.json again with the outcome and the load generator's self-check (replay.runrecord).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.analysis.selfcheck import MachineMeter
from agent_replay.engines.metrics_scrape import metrics_url
from agent_replay.errors import AgentReplayError, InputError
from agent_replay.redact import redact_url, split_userinfo
from agent_replay.replay.affinity import kept_affinity, pin, rest_cpus, worker_cpus
from agent_replay.replay.config import RunConfig
from agent_replay.replay.feed import ProgressFeed, Reporter
from agent_replay.replay.folderlock import acquire, refuse_if_busy
from agent_replay.replay.lifeline import sigterm_as_sigint
from agent_replay.replay.plan import (
    Plan,
    PlanOptions,
    build_plan,
    set_shared_prefix,
    speedup_warning,
)
from agent_replay.replay.pools import WorkerPool, start_pool
from agent_replay.replay.provenance import provenance
from agent_replay.replay.results import SpaceReserve, remove_unfinished_parts
from agent_replay.replay.runrecord import (
    RunSummary,
    finish,
    merge,
    record_failure,
    run_meta,
    write_run_json,
)
from agent_replay.replay.scrape import (
    FILE_NAME,
    MetricsScraper,
    scrape_interval,
    start_gpu_telemetry,
)
from agent_replay.replay.source import read_replayed
from agent_replay.replay.target import TargetInfo, base_url, probe
from agent_replay.replay.worker import WorkerSummary
from agent_replay.results_schema import RESULTS_SCHEMA_VERSION
from agent_replay.runmeta import Counts, RunMeta
from agent_replay.traces.failed import drop_failed
from agent_replay.traces.io import trace_files
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.validate import validate_or_raise


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


def prefix_tokens(extra: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(session, agent) -> tools + system prefix tokens, as a weka import recorded them."""
    out: dict[tuple[str, str], int] = {}
    for t in extra.get("weka") or ():
        for agent, n in (t.get("prefix_tokens") or {}).items():
            out[(str(t.get("id")), str(agent))] = int(n)
    return out


def load_and_validate(config: RunConfig) -> Plan:
    return plan_of(config, *read_checked(config))


def read_checked(config: RunConfig) -> tuple[pa.Table, TraceMeta, int]:
    """The rows the run can send, validated, without failed rows unless
    ``--include-failed``; the trace's metadata; how many failed rows were left out."""
    table, meta, rows = read_replayed(config)
    validate_or_raise(table, meta, config.trace, rows)
    dropped = 0
    if not config.include_failed:
        table, dropped = drop_failed(table)
    if table.num_rows == 0:
        raise _nothing_to_replay(config, dropped, table)
    return table, meta, dropped


def plan_of(config: RunConfig, table: pa.Table, meta: TraceMeta, dropped: int) -> Plan:
    plan = build_plan(table, meta.block_size, config.plan_options())
    set_shared_prefix(plan, prefix_tokens(meta.extra))
    if plan.n_requests == 0:
        raise _nothing_to_replay(config, dropped, table)
    return plan


def _nothing_to_replay(config: RunConfig, dropped: int, table: pa.Table) -> InputError:
    """A run of nothing would end "ok" with no results to report."""
    why = (
        f"its {dropped} requests all failed when recorded (--include-failed replays them)"
        if dropped and table.num_rows == 0
        else "no request is left to send"
    )
    return InputError(f"{config.trace}: nothing to replay: {why}")


def with_credentials(config: RunConfig, table: pa.Table) -> RunConfig:
    """``config`` whose headers carry the credentials: the API key (``RunConfig.auth_headers``,
    for the API most of the rows to send use), or the target URL's user-info as Basic
    auth; the target is the server's root without user-info (``target.base_url``)."""
    api = config.api or most_used_api(table)
    target, basic = split_userinfo(base_url(config.target))
    headers = config.auth_headers(api)
    if basic is not None and not any(k.lower() == "authorization" for k, _ in headers):
        headers += (("Authorization", basic),)  # user-info in the URL: Basic auth
    return replace(config, target=target, headers=headers)


def most_used_api(table: pa.Table) -> str:
    """The API most rows name (a row without one: completions, as the plan replays it)."""
    default = PlanOptions().default_api
    if "api" not in table.column_names or table.num_rows == 0:
        return default
    counts = pc.value_counts(pc.fill_null(table.column("api").cast(pa.string()), default))
    return str(max(counts.to_pylist(), key=lambda c: c["counts"])["values"])


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
    return replace(
        config,
        model=model,
        salt=salt,
        vocab_size=vocab,
        output=config.output or default_output(config.trace),
        run_id=config.run_id if config.run_id != "run" else secrets.token_hex(4),
    )


def _planned_end(plan: Plan, timing: str) -> int:
    """The last intended send of a plan that follows the trace's schedule (ns after t0),
    0 for max-rate timing (no schedule): the dashboard's ETA is never before it."""
    if timing not in ("session", "absolute"):
        return 0
    return max((q.offset_ns for s in plan.sessions for q in s.requests), default=0)


def _over_context(plan: Plan, max_model_len: int | None) -> int:
    if not max_model_len:
        return 0
    return sum(
        1
        for s in plan.sessions
        for q in s.requests
        if q.input_tokens + q.output_tokens > max_model_len
    )


def _short_agentx(config: RunConfig) -> str | None:
    """The warning for an ``agentx`` run whose duration cannot reach its minimum."""
    low = config.agentx.min_duration_s
    if (
        config.timing != "agentx"
        or low is None
        or config.duration_s is None
        or config.duration_s >= low
    ):
        return None
    return (
        f"--duration {config.duration_s:g} s is below the minimum of {low:g} s "
        f"({config.agentx.preset or '--min-duration'}): the run will be invalid"
    )


def gpu_count(config: RunConfig) -> tuple[int | None, str]:
    """The GPUs serving the target and where that comes from: ``--gpus``, the ``--launch``
    profile's ``--gpus``, or unknown."""
    if config.gpus is not None:
        return config.gpus, "--gpus"
    if config.launch is not None:
        from agent_replay.replay.launch import parse_spec

        return int(parse_spec(config.launch).gpus), "--launch profile"
    return None, "unknown (give --gpus N)"


def run(
    config: RunConfig,
    *,
    progress: Reporter | None = _stderr,
    launch_info: dict[str, Any] | None = None,
) -> RunSummary:
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


def _run(
    config: RunConfig, progress: Reporter | None, launch_info: dict[str, Any] | None = None
) -> RunSummary:
    config.check()
    if config.output:
        refuse_if_busy(Path(config.output))  # a live run's folder: one line before any work
    table, meta, dropped = read_checked(config)
    config = with_credentials(config, table)
    info = asyncio.run(
        probe(config.target, headers=dict(config.headers), insecure=config.insecure)
    )  # unreachable: before the plan
    plan = plan_of(config, table, meta, dropped)
    del table
    config = resolve(config, info)
    n = min(config.workers, max(1, len(plan.sessions)))
    if config.cpus is not None:  # check() refuses it with --ray
        config = replace(config, worker_cpus=tuple(worker_cpus(config.cpus, n)))
    out = Path(config.output or ".")
    lock = acquire(out, config.force)  # one writer per folder; --force moves old results aside
    if lock.moved_to is not None and progress is not None:
        progress(f"--force: the earlier results in {out} were moved to {lock.moved_to}")
    try:
        reserve = SpaceReserve(out)  # a disk full before the start: one line, exit 5, nothing sent
        try:
            return _replay(config, plan, info, n, out, reserve, progress, launch_info)
        finally:
            reserve.release()
    finally:
        lock.release()


def _replay(
    config: RunConfig,
    plan: Plan,
    info: TargetInfo,
    n: int,
    out: Path,
    reserve: SpaceReserve,
    progress: Reporter | None,
    launch_info: dict[str, Any] | None,
) -> RunSummary:
    """From the fresh results folder on: the samplers, the pool, t0, the run, run.json.
    Whatever ends it, every process it started is ended and run.json gets a final status."""
    if config.worker_cpus:
        pin(
            rest_cpus(config.worker_cpus)
        )  # the scraper and the dashboard start from here: the rest
    trace_sha = _sha256(config.trace)
    # The samplers take their baseline before t0 (their processes start first).
    scrape = MetricsScraper(config.target, scrape_interval(config, info), out / FILE_NAME)
    scrape.start()
    gpu_tel, gpu_off = start_gpu_telemetry(config, out, launch_info, progress)
    pool: WorkerPool | None = None
    prog: ProgressFeed | None = None
    meta: RunMeta | None = None
    summaries: list[WorkerSummary] = []
    interrupted = False
    host = MachineMeter()
    try:
        pool = start_pool(config, plan, n, warn=progress)  # its workers are ready when it returns
        # The dashboard starts before t0 and says when it is ready: its start-up is not the run's.
        prog = ProgressFeed.create(
            progress if config.progress else None,
            plan.n_requests,
            f"agent-replay {Path(config.trace).name} -> {redact_url(config.target)}",
            metrics_url(config.target) if info.has_metrics else None,
            results_dir=None if pool.feeds_snapshots else str(out),
            shared_gauges=scrape.gauges,
            gpu_gauges=gpu_tel.gauges if gpu_tel is not None else None,
            planned_ns=_planned_end(plan, config.timing),
            warn=progress,
        )
        t0 = time.monotonic_ns() + pool.start_delay_ns
        wall_t0 = time.time_ns() + pool.start_delay_ns
        config = replace(config, t0_ns=t0, workers=pool.size)
        meta = run_meta(config, info, plan, trace_sha, t0, wall_t0, "running")
        meta.gpus, meta.gpus_source = gpu_count(config)
        meta.extra["scrape"] = scrape.describe()
        meta.launch = launch_info
        meta.provenance = provenance(config.target, launch_info)
        scrape.set_t0(t0)
        if gpu_tel is not None:
            gpu_tel.set_t0(t0)
        meta.gpu_telemetry = gpu_tel.describe() if gpu_tel is not None else gpu_off
        write_run_json(out, meta, reserve)
        _warn_before_run(config, plan, info, meta, progress)
        if progress is not None:
            progress(
                f"replaying {plan.n_requests} requests in {len(plan.sessions)} sessions "
                f"({config.timing} timing, x{config.speedup:g}) against {redact_url(config.target)} "
                f"model {config.model}; results: {out}"
            )
        try:
            summaries = pool.run(config, prog)
        except KeyboardInterrupt:
            interrupted = True
            summaries = pool.arrived()  # the workers that reported before the stop
    except KeyboardInterrupt:  # before t0: nothing was sent
        _stopped_before_start(out, meta, reserve)
        raise
    except Exception as exc:  # a worker failed (a dead server, say): a final status first
        if meta is not None:
            record_failure(out, meta, exc, reserve)
        raise
    finally:
        scrape.stop()  # first: its final scrape is the dashboard's last gauges
        telemetry = gpu_tel.stop() if gpu_tel is not None else None
        if prog is not None:
            prog.close()
        _record_end(meta, scrape.describe(), telemetry, pool)
    summary = merge(
        str(out),
        summaries,
        config,
        interrupted or any(s.interrupted for s in summaries),
        machine=host.machine(sum(w.cpu_s for w in summaries)) if pool.meters_host else None,
        lost=pool.lost,
    )
    assert meta is not None  # written before the workers ran
    return _finish_run(out, meta, summary, config, reserve, progress)


def _warn_before_run(
    config: RunConfig, plan: Plan, info: TargetInfo, meta: RunMeta, progress: Reporter | None
) -> None:
    """What the plan lets one foresee before t0 (a speedup that packs requests, an AgentX
    run too short for its rules, prompts over the target's length), in run.json and said."""
    before = meta.extra.setdefault("warnings_before_run", [])
    too_long = _over_context(plan, info.max_model_len)
    lines = [
        speedup_warning(plan, config.plan_options()),
        _short_agentx(config),
        f"{too_long} requests need more than the target's max_model_len "
        f"({info.max_model_len}) tokens: the server will refuse them"
        if too_long
        else None,
    ]
    for w in lines:
        if w:
            before.append(w)
            if progress is not None:
                progress(f"warning: {w}")


def _finish_run(
    out: Path,
    meta: RunMeta,
    summary: RunSummary,
    config: RunConfig,
    reserve: SpaceReserve,
    progress: Reporter | None,
) -> RunSummary:
    """The merged run's end: unfinished parts removed, run.json's final write, the lines
    that say what is missing."""
    leftovers = remove_unfinished_parts(out)
    if leftovers:
        summary.self_check.warnings.append(
            f"{leftovers} unfinished part files (.tmp) of stopped workers were removed"
        )
    finish(out, meta, summary, config.timing, config, reserve)
    if progress is not None:
        if summary.unwritten:
            progress(f"error: {summary.unwritten_line()}")
        if summary.interrupted:
            progress(f"interrupted: partial results (every completed request) are in {out}")
        elif summary.partial:
            progress(summary.partial_line() or "")
    return summary


def _record_end(
    meta: RunMeta | None,
    scraped: dict[str, Any],
    telemetry: dict[str, Any] | None,
    pool: WorkerPool | None,
) -> None:
    """The blocks of run.json known once the workers stopped (the scraper's, the GPU
    telemetry's, the pool's); the pool is closed."""
    if meta is not None:
        meta.extra["scrape"] = scraped
        if telemetry is not None:
            meta.gpu_telemetry = telemetry
        if pool is not None:
            meta.merge(pool.describe())
    if pool is not None:
        pool.close()


def _stopped_before_start(out: Path, meta: RunMeta | None, reserve: SpaceReserve) -> None:
    """run.json of a run stopped before its t0 (or before its replay sent anything)."""
    meta = meta or RunMeta()
    meta.results_schema_version = RESULTS_SCHEMA_VERSION
    meta.status = "interrupted"
    meta.summary = Counts(extra={"unwritten": 0})
    meta.extra["stopped_before_start"] = True
    with contextlib.suppress(AgentReplayError):
        write_run_json(out, meta, reserve)
