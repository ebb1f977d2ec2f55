"""One worker: one event loop replaying one shard of the plan, writing its own part files.

``run_shard(config, shard_index, n_shards, report_queue)`` is the entry point for local
worker processes and for any other executor (it only needs a picklable ``RunConfig`` with
``t0_ns``, ``model`` and ``salt`` resolved, and a queue-like object with ``put``). Sessions
go to shards in turn by start time (``Plan.shard``), so every worker builds the same plan,
takes its own part, and gets an even share of the arrivals.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np

from agent_replay.analysis.counters import (
    Counters,
    add,
    counter,
    either,
    first,
    keyed,
    keyed_by,
    largest,
    merged_by,
)
from agent_replay.engines import aio
from agent_replay.engines.dialects import dialect, encode_body
from agent_replay.engines.sse import SSEParser
from agent_replay.errors import TargetError
from agent_replay.redact import redact_url
from agent_replay.replay.affinity import allowed_cpus
from agent_replay.replay.client import (
    Prepared,
    Sender,
    inexact_counts_differ,
    make_session,
    usage_disagrees,
)
from agent_replay.replay.clock import Clock, MonotonicClock
from agent_replay.replay.config import RunConfig
from agent_replay.replay.driver import Driver
from agent_replay.replay.failfast import FirstFailures, server_message
from agent_replay.replay.fastclient import IDLE_S, KEEPALIVE_S, FastSender
from agent_replay.replay.lifeline import StopSignals
from agent_replay.replay.messages import Progress
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import Plan, PlannedRequest, build_plan
from agent_replay.replay.prepare import Preparer, text_prompt
from agent_replay.replay.results import ResultWriter
from agent_replay.replay.selfmon import CpuMeter, LoopWatchdog, QuietRuntime, reserve_fds
from agent_replay.replay.source import read_replayed
from agent_replay.results_schema import ErrorKind
from agent_replay.traces.failed import drop_failed

GC_MERGE = keyed_by({"gc_young_collections": add, "gc_end_collected": add}, largest)
"""QuietRuntime.stats() across workers: collections and objects collected add up; the
other figures (pauses, thresholds) are the worst worker's."""

T = TypeVar("T")


@dataclass
class WorkerSummary(Counters):
    """One worker's counts; they merge across workers by the rules declared on the fields
    (``analysis.counters``)."""

    shard: int
    total: int = counter(0)
    sent: int = counter(0)
    done: int = counter(0)
    skipped: int = counter(0)
    ok: int = counter(0)
    errors: dict[str, int] = field(default_factory=dict, metadata=merged_by(keyed))
    mismatches: int = counter(0)
    inexact: int = counter(
        0
    )  # ok requests whose tokens per chunk were not exact (error_kind "inexact")
    chunks: int = counter(0)
    resent: int = counter(0)  # sent again on a new connection: the kept one was closed (fastclient)
    output_tokens: int = counter(0)
    text_misses: int = counter(0)
    cpu_s: float = counter(0.0)
    cpu_run_s: float = counter(
        0.0
    )  # from the start of the replay on (set-up and plan building excluded)
    wall_s: float = counter(0.0, largest)
    schedule_lag: bytes = counter(b"")  # int64 ns, one per sent request
    loop_lag: bytes = counter(b"")  # int64 ns, one per watchdog tick
    interrupted: bool = counter(False, either)
    aborted: bool = counter(False, either)  # --abort-after-failures: this worker stopped its shard
    abort_reason: str | None = counter(None, first)  # why it stopped (replay.failfast), if it said
    gc: dict[str, int] = field(
        default_factory=dict, metadata=merged_by(GC_MERGE)
    )  # QuietRuntime.stats()
    cpus: list[int] = field(
        default_factory=list, metadata=merged_by(add)
    )  # the CPUs it was allowed to run on
    fd_table: int = counter(
        0, largest
    )  # file descriptors reserved before the run (selfmon.reserve_fds)
    idle_skipped_ns: int = counter(0)  # agentx timing: idle gaps skipped
    overflow_dropped: int = counter(0)  # agentx timing: not sent, their stream ended on an overflow
    unwritten: int = counter(0)  # recorded requests whose row could not be written (ResultWriter)
    write_error: str | None = counter(None, first)  # the first part-file write error, if any
    usage_disagree: int = counter(
        0
    )  # rows whose usage disagrees with their stream (client.usage_disagrees)
    cut: str | None = counter(None, first)  # the worker died mid-run: what its parent saw (pools)

    def schedule_lag_ns(self) -> np.ndarray:
        return np.frombuffer(self.schedule_lag, dtype=np.int64)

    def loop_lag_ns(self) -> np.ndarray:
        return np.frombuffer(self.loop_lag, dtype=np.int64)


class HttpTransport:
    """The driver's transport over HTTP: ``Preparer`` + ``Sender`` or ``FastSender``."""

    def __init__(self, preparer: Preparer, sender: Sender | FastSender) -> None:
        self.preparer = preparer
        self.sender = sender

    async def prepare(self, q: PlannedRequest, request_id: str, session_key: str) -> Prepared:
        return await self.preparer.prepare(q, request_id, session_key)

    async def send(self, prepared: Prepared, rec: RequestRecord) -> None:
        await self.sender.send(prepared, rec)


def load_plan(config: RunConfig) -> Plan:
    """The plan as ``replay.run.load_and_validate`` builds it (failed rows left out unless
    ``include_failed``), without validating again."""
    table, meta, _ = read_replayed(config)
    if not config.include_failed:
        table, _ = drop_failed(table)
    return build_plan(table, meta.block_size, config.plan_options())


def _tokenizer(session: aiohttp.ClientSession, base_url: str) -> Callable[[Mapping[str, Any]], Any]:
    url = base_url.rstrip("/") + "/tokenize"

    async def tokenize(body: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            async with session.post(url, json=dict(body)) as resp:
                if resp.status != 200:
                    raise TargetError(
                        f"{redact_url(url)}: HTTP {resp.status} ({(await resp.text())[:200]})"
                    )
                data = await resp.json()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise TargetError(
                f"{redact_url(url)}: {type(exc).__name__}: "
                f"{redact_url(str(exc))[:200]} (is the server gone?)"
            ) from exc
        if not isinstance(data, dict) or not isinstance(data.get("count"), int):
            raise TargetError(f"{redact_url(url)}: the answer has no token count")
        return data

    return tokenize


def _prompt_probe(
    session: aiohttp.ClientSession, config: RunConfig, plan: Plan
) -> Callable[[str], Any]:
    """Sends one user message as the plan's first text API (one output token) and returns
    the prompt tokens its usage reports: the chat template's size where no /tokenize is."""
    api = next((q.api for s in plan.sessions for q in s.requests if text_prompt(q.api)), "chat")
    d = dialect(api)
    url = config.target.rstrip("/") + d.url_path(config.model or "")
    headers = {"Content-Type": "application/json", **dict(config.headers)}

    async def probe(text: str) -> int:
        body = d.build(
            model=config.model or "", prompt=text, max_tokens=1, vllm_extras=config.vllm_extras
        )
        try:
            async with session.post(url, data=encode_body(body), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise TargetError(f"{url}: HTTP {resp.status} ({raw[:200]!r})")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise TargetError(f"{url}: {type(exc).__name__}: {exc}") from None
        dec = d.decoder()
        for ev in SSEParser().feed(raw + b"\n\n"):
            dec.feed(ev.data, ev.event)
        prompt = dec.result_usage()[0]
        if prompt is None:
            raise TargetError(f"{url}: no usage in the answer: cannot size the chat template")
        return int(prompt)

    return probe


def _first_lane(concurrency: int, shard: int, n_shards: int) -> int:
    """The run-wide index of shard ``shard``'s first lane (lanes split as ``arun_shard``
    splits the concurrency)."""
    return shard * (concurrency // n_shards) + min(shard, concurrency % n_shards)


class _RecordCounter:
    """What each finished request adds to the worker's summary (the row goes to the writer
    first); it stops the run (``run_task``) after ``abort_after`` failures in a row, or when
    the first requests all fail alike (``replay.failfast``)."""

    def __init__(
        self,
        summary: WorkerSummary,
        writer: ResultWriter,
        abort_after: int | None,
        warmup_abort: bool = False,
    ) -> None:
        self.summary, self.writer = summary, writer
        self.abort_after = abort_after or 1 << 62
        self.warmup_abort = warmup_abort
        self.streak = 0  # failed requests in a row
        self.alike = FirstFailures()
        self.run_task: asyncio.Future[None] | None = None

    def on_record(self, rec: RequestRecord) -> None:
        summary = self.summary
        self.writer.add(rec)
        _count_outcome(summary, rec)
        passed = rec.status == "ok" or rec.error_kind == ErrorKind.CANCELLED
        self.streak = 0 if passed else self.streak + 1
        why = self.alike.observe_record(rec)  # the first requests' one error (replay.failfast)
        if not passed and self.warmup_abort and rec.warmup and (rec.agent_id or "main") == "main":
            why = warmup_failure_line(rec)
        if not summary.aborted and (why or self.streak >= self.abort_after):
            summary.aborted, summary.abort_reason = True, why
            if self.run_task is not None:
                self.run_task.cancel()
        if usage_disagrees(rec):
            summary.usage_disagree += 1
        # tokens per chunk of an inexact stream are one per event: its usage, when sent, is exact
        summary.output_tokens += (
            rec.completion_tokens
            if rec.error_kind == ErrorKind.INEXACT and rec.completion_tokens is not None
            else sum(rec.chunk_tokens)
        )


def warmup_failure_line(rec: RequestRecord) -> str:
    """The one line of a run ended by a main stream's failed warm-up (``--warmup-failure
    abort``, AIPerf's rule: its run ends on the first such failure)."""
    what = f"http {rec.http_status}" if rec.http_status else (rec.error_kind or "error")
    msg = server_message(rec.error)
    return (
        f"warm-up request {rec.session_id}[{rec.request_index}] failed ({what}"
        f"{': ' + msg if msg else ''}); a failed warm-up ends the run, as in AIPerf "
        "(--warmup-failure continue goes on)"
    )


def _count_outcome(summary: WorkerSummary, rec: RequestRecord) -> None:
    """A finished request's outcome in the summary's counts."""
    if rec.status == "ok":
        summary.ok += 1
        if rec.error_kind == ErrorKind.MISMATCH:
            summary.mismatches += 1
        elif rec.error_kind == ErrorKind.INEXACT:
            summary.inexact += 1
            if inexact_counts_differ(rec):
                summary.mismatches += 1
    else:
        kind = rec.error_kind or ErrorKind.UNKNOWN
        summary.errors[kind] = summary.errors.get(kind, 0) + 1


def _make_sender(config: RunConfig, session: aiohttp.ClientSession) -> Sender | FastSender:
    """The HTTP client of ``--http-client``; AgentX runs keep idle connections open as long
    as AIPerf does (``KEEPALIVE_S``)."""
    if config.effective_http_client() == "fast":
        return FastSender(
            config.target,
            config.request_timeout_s,
            kernel_timestamps=config.effective_timestamps() == "kernel",
            keepalive_s=KEEPALIVE_S if config.timing == "agentx" else IDLE_S,
        )
    return Sender(session, config.target)


def _make_driver(
    config: RunConfig,
    plan: Plan,
    transport: HttpTransport,
    clock: MonotonicClock,
    on_record: Callable[[RequestRecord], None],
    concurrency: int | None,
    shard_index: int,
    n_shards: int,
) -> Driver:
    """The driver of ``config.timing`` for this worker's shard."""
    assert config.t0_ns is not None
    duration_ns = None if config.duration_s is None else int(config.duration_s * 1e9)
    if config.timing == "agentx":
        from agent_replay.replay.agentx import AgentXDriver

        ax = config.agentx
        return AgentXDriver(
            plan,
            transport,
            clock,
            t0_ns=config.t0_ns,
            on_record=on_record,
            lanes=concurrency or 1,
            first_lane=_first_lane(config.concurrency or 1, shard_index, n_shards),
            seed=ax.seed if ax.seed is not None else (config.salt or 0),
            worker=shard_index,
            run_id=config.run_id,
            duration_ns=duration_ns,
            start_range=(ax.start_min, ax.start_max),
            warmup_requests=ax.warmup_requests,
            idle_cap_ns=None if ax.idle_cap_s is None else int(ax.idle_cap_s * 1e9),
            tree_idle_cap_ns=None if ax.tree_idle_cap_s is None else int(ax.tree_idle_cap_s * 1e9),
            overflow_rule=ax.overflow_rule,
        )
    return Driver(
        plan,
        transport,
        clock,
        mode=config.timing,
        t0_ns=config.t0_ns,
        on_record=on_record,
        worker=shard_index,
        run_id=config.run_id,
        concurrency=concurrency,
        duration_ns=duration_ns,
        warmup_ns=int(config.warmup_s * 1e9),
    )


async def arun_shard(
    config: RunConfig,
    shard_index: int = 0,
    n_shards: int = 1,
    report: Callable[[Progress], None] | None = None,
    *,
    plan: Plan | None = None,
    journal: bool = False,
) -> WorkerSummary:
    """Replay this worker's shard against ``config.target``; see module docs."""
    assert config.t0_ns is not None and config.model is not None and config.salt is not None
    cpu = CpuMeter()
    wall0 = time.monotonic_ns()
    plan = (plan or load_plan(config)).shard(shard_index, n_shards)
    out = Path(config.output or ".")
    t0 = config.t0_ns
    summary = WorkerSummary(shard=shard_index, total=plan.n_requests, cpus=allowed_cpus())
    writer = ResultWriter(out, t0, shard_index, retry_s=config.write_retry_s, journal=journal)
    concurrency = None
    if config.concurrency:
        concurrency = max(
            1,
            config.concurrency // n_shards
            + (1 if shard_index < config.concurrency % n_shards else 0),
        )
    # AgentX runs keep idle connections open as long as AIPerf does (KEEPALIVE_S)
    agentx = config.timing == "agentx"
    session = make_session(
        config.request_timeout_s,  # /tokenize, and the aiohttp client
        headers=dict(config.headers),
        insecure=config.insecure,
        keepalive_s=KEEPALIVE_S if agentx else None,
    )
    fast: FastSender | None = None
    watchdog = LoopWatchdog()
    quiet = QuietRuntime()
    driver: Driver | None = None
    progress: _ProgressReport | None = None
    clock = MonotonicClock()
    try:
        sender = _make_sender(config, session)
        fast = sender if isinstance(sender, FastSender) else None
        preparer = Preparer(
            model=config.model,
            block_size=plan.block_size,
            salt=config.salt,
            vocab_size=config.vocab_size or 32000,
            low_token_id=config.low_token_id,
            vllm_extras=config.vllm_extras,
            tokenize=_tokenizer(session, config.target),
            headers=dict(config.headers),
            tokenizer=config.tokenizer,
            probe=_prompt_probe(session, config, plan),
        )
        await preparer.calibrate_text(plan)  # before t0: no /tokenize calls per request

        counter = _RecordCounter(
            summary,
            writer,
            config.abort_after_failures,
            warmup_abort=config.timing == "agentx" and config.agentx.warmup_failure == "abort",
        )
        driver = _make_driver(
            config,
            plan,
            HttpTransport(preparer, sender),
            clock,
            counter.on_record,
            concurrency,
            shard_index,
            n_shards,
        )
        summary.fd_table = reserve_fds()
        writer.warm()  # the first Parquet conversion's one-off set-up, before t0
        quiet.enter()
        watchdog.start()
        run_cpu = CpuMeter()
        progress = _ProgressReport(driver, sender, summary, t0, watchdog, writer)
        ticker = asyncio.get_running_loop().create_task(
            _tick(clock, writer, progress, report, quiet)
        )
        try:
            run_task = counter.run_task = asyncio.ensure_future(driver.run())
            try:
                await run_task
            except asyncio.CancelledError:
                if not summary.aborted:  # Ctrl-C, not a stop of its own
                    raise
        finally:
            ticker.cancel()
            await watchdog.stop()
            summary.text_misses = preparer.text_misses
            summary.chunks = sender.chunks
            summary.cpu_run_s = run_cpu.cpu_s()
            summary.idle_skipped_ns = getattr(driver, "idle_skipped_ns", 0)
            summary.overflow_dropped = getattr(driver, "dropped", 0)
    except asyncio.CancelledError:
        # Ctrl-C (the runner cancels this task): keep what was recorded, report it.
        summary.interrupted = True
    finally:
        if driver is not None:
            summary.sent, summary.done, summary.skipped = driver.sent, driver.done, driver.skipped
            summary.schedule_lag = driver.schedule_lag.tobytes()
        summary.loop_lag = watchdog.lags.tobytes()
        # The rows first, on this thread: a stop that comes now (a cancel) cannot cut a
        # blocking call, only the awaits below, which are then left.
        writer.close()
        summary.unwritten, summary.write_error = writer.unwritten, writer.error
        if report is not None and progress is not None:  # the final counts
            report(progress.message(time.monotonic_ns()))
        quiet.exit()
        summary.gc = quiet.stats()
        with contextlib.suppress(asyncio.CancelledError):
            if fast is not None:
                summary.resent = fast.resent
                await fast.close()
            await session.close()
        summary.cpu_s = cpu.cpu_s()
        summary.wall_s = (time.monotonic_ns() - wall0) / 1e9
    return summary


class _ProgressReport:
    """The worker's progress message: counters, its CPU share since the last message, and
    the loop-lag samples taken since then."""

    def __init__(
        self,
        driver: Driver,
        sender: Sender | FastSender,
        summary: WorkerSummary,
        t0: int,
        watchdog: LoopWatchdog,
        writer: ResultWriter,
    ) -> None:
        self.driver, self.sender, self.summary, self.t0, self.watchdog = (
            driver,
            sender,
            summary,
            t0,
            watchdog,
        )
        self.writer = writer
        self.cpu = CpuMeter()
        self.seen_lags = 0

    def message(self, now: int) -> Progress:
        lags = self.watchdog.lags[self.seen_lags :].tolist()
        self.seen_lags += len(lags)
        driver, sender, summary = self.driver, self.sender, self.summary
        return Progress(
            shard=summary.shard,
            elapsed_ns=now - self.t0,
            total=driver.total,
            sent=driver.sent,
            done=driver.done,
            skipped=driver.skipped,
            in_flight=sender.in_flight,
            sessions=driver.active_sessions,
            ok=summary.ok,
            errors=sum(summary.errors.values()),
            chunks=sender.chunks,
            output_tokens=summary.output_tokens,
            cpu=self.cpu.fraction(),
            loop_lags=tuple(lags),
            held_rows=self.writer.held,
            write_error=self.writer.error if self.writer.failing else None,
        )


TICK_NS = 500_000_000


async def _tick(
    clock: Clock,
    writer: ResultWriter,
    progress: _ProgressReport,
    report: Callable[[Progress], None] | None,
    quiet: QuietRuntime,
) -> None:
    while True:
        await clock.pause(TICK_NS)
        quiet.young()
        now = clock.now_ns()
        writer.tick(now)
        if report is not None:
            report(progress.message(now))


def run_shard(
    config: RunConfig,
    shard_index: int,
    n_shards: int,
    report_queue: Any,
    *,
    plan: Plan | None = None,
    stop: StopSignals | None = None,
    journal: bool = False,
) -> WorkerSummary:
    """Process entry: run one shard on a fresh event loop (uvloop when installed).
    ``plan``: the whole plan when the caller built it already (it is sharded here);
    ``stop``: the process's stop signals, which then cancel the shard (a graceful stop);
    ``journal``: keep a row journal (``replay.journal``) for a parent to recover from."""

    def report(msg: Progress) -> None:
        if report_queue is not None:
            report_queue.put(("progress", shard_index, msg))

    return aio.run(
        stoppable(
            arun_shard(config, shard_index, n_shards, report, plan=plan, journal=journal), stop
        ),
        config.loop,
    )


async def stoppable(main: Awaitable[T], stop: StopSignals | None) -> T:
    """``main`` in the running task, which ``stop`` cancels on SIGINT or SIGTERM."""
    if stop is not None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
                loop.call_soon_threadsafe(task.cancel)

        stop.arm(cancel)
    return await main
