"""The run's record: ``RunSummary`` (the workers' summaries merged, its status and exit
code) and run.json, written when t0 is chosen, again with ``failed`` when a worker fails,
and last with the outcome and the load generator's self-check."""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent_replay import __version__
from agent_replay.analysis import outcomes
from agent_replay.analysis.counters import (
    Counters,
    counter,
    first,
    keyed,
    largest,
    merge_all,
    merged_by,
)
from agent_replay.errors import OutputError
from agent_replay.redact import redact_url
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import option_kinds, record_options
from agent_replay.replay.plan import Plan
from agent_replay.replay.provenance import code_version
from agent_replay.replay.results import SpaceReserve, write_json_atomic
from agent_replay.replay.selfmon import SelfReport, stall_distribution, verdict
from agent_replay.replay.target import TargetInfo
from agent_replay.replay.worker import GC_MERGE, WorkerSummary
from agent_replay.results_schema import RESULTS_SCHEMA_VERSION, ErrorKind
from agent_replay.runmeta import (
    ClockAnchor,
    Planned,
    RunMeta,
    TargetRef,
    TraceRef,
    writer_identity,
)

if TYPE_CHECKING:
    from agent_replay.replay.distributed.placement import Lost
    from agent_replay.replay.validity import ValidityInput

RUN_JSON = "run.json"
ROWS_LOST_EXIT = OutputError.exit_code
"""A run's exit code when recorded requests have no row."""


@dataclass
class RunSummary(Counters):
    """The workers' summaries merged: each count by its declared rule (``analysis.counters``;
    the same rules as ``WorkerSummary``'s fields)."""

    output: str
    total: int = counter(0)
    sent: int = counter(0)
    ok: int = counter(0)
    skipped: int = counter(0)
    errors: dict[str, int] = field(default_factory=dict, metadata=merged_by(keyed))
    mismatches: int = counter(0)
    inexact: int = counter(0)
    usage_disagree: int = counter(0)  # the server's usage disagrees with its stream
    chunks: int = counter(0)
    resent: int = counter(0)
    output_tokens: int = counter(0)
    wall_s: float = counter(0.0, largest)
    cpu_s: float = counter(0.0)
    interrupted: bool = False
    self_check: SelfReport = field(default_factory=SelfReport)
    workers: list[WorkerSummary] = field(default_factory=list)
    loop_stalls: dict[str, Any] = field(default_factory=dict)  # selfmon.stall_distribution
    gc: dict[str, int] = field(
        default_factory=dict, metadata=merged_by(GC_MERGE)
    )  # worker.GC_MERGE of QuietRuntime.stats()
    machine: Any = None  # analysis.selfcheck.Machine over the run, where it was metered
    partial: bool = False  # workers died (Ray actors): some sessions were not replayed
    lost_sessions: int = 0
    lost_requests: int = 0
    aborted: bool = False  # --abort-after-failures, or the first requests' one error, stopped it
    abort_reason: str | None = counter(None, first)  # the latter's line (replay.failfast)
    max_failure_rate: float = 0.1
    invalid_reason: str | None = None  # agentx timing: why the run is not a valid AgentX run
    unwritten: int = counter(0)  # recorded requests whose row could not be written (a full disk)
    write_error: str | None = counter(None, first)

    @property
    def conditions(self) -> list[str]:
        """Every status that applies to the run, the most serious first: ``interrupted``
        (Ctrl-C, SIGTERM), ``aborted`` (``--abort-after-failures``), ``partial`` (workers
        lost), ``incomplete`` (requests without a row: ``unwritten``), ``failed`` (more than
        ``max_failure_rate`` of the sent requests failed), ``invalid`` (``agentx`` timing:
        the AgentX rules refuse the run); empty when the run is ok."""
        out = [
            name
            for name, applies in (
                ("interrupted", self.interrupted),
                ("aborted", self.aborted),
                ("partial", self.partial),
                ("incomplete", bool(self.unwritten)),
                (
                    "failed",
                    self.failed > self.max_failure_rate * max(1, self.sent - self.cancelled),
                ),
                ("invalid", self.invalid_reason is not None),
            )
            if applies
        ]
        return out

    @property
    def status(self) -> str:
        """The run's final status: the first of ``conditions``, or ``ok``."""
        return next(iter(self.conditions), "ok")

    @property
    def exit_code(self) -> int:
        """5 when recorded requests have no row (whatever the status: the results are not
        all on disk), else 130 interrupted, 1 aborted, partial, failed or invalid, 0 ok."""
        if self.unwritten:
            return ROWS_LOST_EXIT
        return {"ok": 0, "interrupted": 130}.get(self.status, 1)

    def unwritten_line(self) -> str | None:
        """The line that says how many requests have no row (None when all have one)."""
        if not self.unwritten:
            return None
        return (
            f"{self.unwritten} recorded requests have no row in {Path(self.output) / 'requests'}: "
            f"their part files could not be written ({self.write_error or 'unknown error'})"
        )

    def partial_line(self) -> str | None:
        """The one line a partial run ends with (None when the run is not partial)."""
        if not self.partial:
            return None
        return (
            f"error: partial run: {self.lost_sessions} sessions ({self.lost_requests} "
            f"requests) were lost with their workers; partial results (every recorded "
            f"request) are in {self.output}, the lost sessions are listed in "
            f"{Path(self.output) / RUN_JSON} under ray.lost"
        )

    @property
    def failed(self) -> int:
        """Failed requests; those cancelled by the run's own stop are not failures."""
        return outcomes.split(self.errors)[0]

    @property
    def cancelled(self) -> int:
        """In flight when the run was stopped (Ctrl-C, abort)."""
        return outcomes.split(self.errors)[1]

    @property
    def warnings(self) -> list[str]:
        return self.self_check.warnings


def environment(config: RunConfig) -> dict[str, Any]:
    """run.json's ``environment``: versions, host, CPU, loop kind, HTTP client, timestamps."""
    import aiohttp
    import pyarrow

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return {
        "agent_replay": __version__,
        "commit": code_version(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "pyarrow": pyarrow.__version__,
        "numpy": np.__version__,
        "uvloop": uv,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "loop": config.loop if (config.loop != "uvloop" or uv) else "asyncio",
        "http_client": config.effective_http_client(),
        "timestamps": config.effective_timestamps(),
    }


def describe_served(model: str | None) -> str | None:
    from agent_replay.engines.vllm.tiny_model import describe_served as describe

    return describe(model)


def run_meta(
    config: RunConfig,
    info: TargetInfo,
    plan: Plan,
    trace_sha: str,
    t0: int,
    wall_t0: int,
    status: str,
) -> RunMeta:
    """run.json as written when t0 is chosen (credentials redacted)."""
    return RunMeta(
        results_schema_version=RESULTS_SCHEMA_VERSION,
        status=status,
        run_id=config.run_id,
        trace=TraceRef(
            path=str(Path(config.trace).resolve()), sha256=trace_sha, block_size=plan.block_size
        ),
        target=TargetRef(
            url=redact_url(config.target),
            model=config.model,
            models=list(info.models),
            max_model_len=info.max_model_len,
            has_metrics=info.has_metrics,
            model_description=describe_served(config.model),
        ),
        options=record_options(config),
        option_kinds=option_kinds(type(config)),
        salt=config.salt,
        environment=environment(config),
        clock=ClockAnchor(t0_monotonic_ns=t0, t0_wall_ns=wall_t0),
        warmup_ns=int(config.warmup_s * 1e9),
        planned=Planned(sessions=len(plan.sessions), requests=plan.n_requests),
        writer=writer_identity(),
    )


def write_run_json(out: Path, meta: RunMeta, reserve: SpaceReserve | None = None) -> None:
    """run.json (``meta.to_json``), replaced atomically. On a full disk the ``reserve`` is
    given up for it; when it still cannot be written: ``OutputError`` (exit 5)."""
    doc = meta.to_json()
    try:
        write_json_atomic(out / RUN_JSON, doc)
        return
    except OSError as exc:
        err = exc
        if reserve is not None and reserve.release():
            try:
                write_json_atomic(out / RUN_JSON, doc)
                return
            except OSError as again:
                err = again
    raise OutputError(f"{out / RUN_JSON}: cannot write the run's record: {err.strerror or err}")


def record_failure(
    out: Path, meta: RunMeta, exc: BaseException, reserve: SpaceReserve | None = None
) -> None:
    """A worker failed (a dead server, say): run.json gets a final status before the error
    goes up."""
    meta.status, meta.error = "failed", redact_url(str(exc))[:500]
    write_run_json(out, meta, reserve)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def merge(
    out: str,
    ws: list[WorkerSummary],
    config: RunConfig,
    interrupted: bool,
    machine: Any = None,
    lost: Sequence[Lost] = (),
) -> RunSummary:
    """The workers' summaries as one, with the self-check over all their samples; ``lost``
    (shards that died) makes an otherwise finished run ``partial``."""
    s = RunSummary(
        output=out,
        workers=ws,
        interrupted=interrupted,
        aborted=any(w.aborted for w in ws),
        max_failure_rate=config.max_failure_rate,
    )
    merge_all(s, ws)
    lag = _joined([w.schedule_lag_ns() for w in ws])
    loop_lag = _joined([w.loop_lag_ns() for w in ws])
    cpu = max((w.cpu_s / w.wall_s for w in ws if w.wall_s > 0), default=0.0)
    s.self_check = verdict(lag, loop_lag, cpu, config.timing, machine)
    s.machine = machine
    s.loop_stalls = stall_distribution(loop_lag)
    _add_row_warnings(s, ws)
    if lost:
        _mark_lost(s, lost)
    return s


def _mark_lost(s: RunSummary, lost: Sequence[Lost]) -> None:
    """Shards that died: their lines, what they lost, and the run ``partial``."""
    s.self_check.warnings.extend(x.line() for x in lost)
    s.lost_sessions = sum(len(x.sessions) for x in lost)
    s.lost_requests = sum(x.planned_requests - x.recorded_requests for x in lost)
    s.partial = not (s.interrupted or s.aborted)  # a stop's own status comes first


def _add_row_warnings(s: RunSummary, ws: list[WorkerSummary]) -> None:
    """The self-check's warnings about the rows: token-count mismatches, rows not written,
    the workers' cuts, usage that disagrees with the stream."""
    warnings = s.self_check.warnings
    if s.mismatches:
        warnings.append(
            f"{s.mismatches} requests were not served with the trace's token counts (see error "
            "column, error_kind 'mismatch' or 'inexact'): check ignore_eos/min_tokens support "
            "and --vocab-size"
        )
    if s.unwritten:
        warnings.insert(0, s.unwritten_line() or "")
    warnings.extend(w.cut for w in ws if w.cut)
    if s.usage_disagree:
        warnings.append(
            f"{s.usage_disagree} requests: the server's usage disagrees with the tokens it "
            "streamed; throughput counts the streamed tokens (rows flagged mismatch, the "
            "numbers in their error column)"
        )


def outcome(s: RunSummary) -> dict[str, Any]:
    """run.json's final fields: status, counts, self-check and warnings."""
    sc = s.self_check
    bottleneck = [sc.line] if sc.kind == "saturated" and sc.line else []
    return {
        "status": s.status,
        "conditions": s.conditions,
        "summary": {
            "total": s.total,
            "sent": s.sent,
            "ok": s.ok,
            "failed": s.failed,
            "cancelled": s.cancelled,
            "errors": s.errors,
            "skipped": s.skipped,
            "mismatches": s.mismatches,
            "inexact": s.inexact,
            "usage_disagree": s.usage_disagree,
            "unwritten": s.unwritten,
            "write_error": s.write_error,
            "chunks": s.chunks,
            "resent": s.resent,
            "output_tokens": s.output_tokens,
            "wall_s": s.wall_s,
            "cpu_s": s.cpu_s,
        },
        "self_check": asdict(sc),
        "loop_stalls": s.loop_stalls,
        "gc": s.gc,
        "worker_cpus": [w.cpus for w in sorted(s.workers, key=lambda w: w.shard)],
        "load_generator_bottleneck": bool(bottleneck),
        "load_generator_warning": bottleneck[0] if bottleneck else None,
        "machine_contention": sc.kind == "contention",
        "abort_reason": s.abort_reason,
        "machine": asdict(s.machine) if s.machine is not None else None,
        "warnings": sc.warnings,
    }


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class _Extent:
    """The first send, and the last first token, last end of a request with an ITL (two
    tokens or more) and last end, of the measured requests."""

    first_send: int | None = None
    last_ft: int | None = None
    last_itl: int | None = None
    last_end: int | None = None

    def add(
        self,
        ok: bool,
        sent: int | None,
        first_token: int | None,
        end: int | None,
        chunk_tokens: Sequence[int] | None,
    ) -> None:
        self.first_send = _earliest(self.first_send, sent)
        if ok:
            self.last_ft = _latest(self.last_ft, first_token)
            if sum(chunk_tokens or ()) >= 2:
                self.last_itl = _latest(self.last_itl, end)
        self.last_end = _latest(self.last_end, end)

    def set_facts(self, f: ValidityInput) -> None:
        """The measured time and the coverage of the last first token and ITL, from the
        first send (unchanged when nothing was sent)."""
        first = self.first_send
        if first is None:
            return
        f.measured_s = max(0, (self.last_end or first) - first) / 1e9
        f.last_first_token_s = None if self.last_ft is None else (self.last_ft - first) / 1e9
        f.last_itl_end_s = None if self.last_itl is None else (self.last_itl - first) / 1e9


def _validity_rows(
    out: Path, interrupted: bool
) -> tuple[list[tuple[bool, int | None, str | None]], ValidityInput]:
    """(warmup, http_status, error) of every row of the run, and the facts the AgentX
    verdict takes from the measured ones: counts, measured time, coverage."""
    import pyarrow.parquet as pq

    from agent_replay.replay.validity import ValidityInput

    cols = [
        "warmup",
        "http_status",
        "error",
        "error_kind",
        "status",
        "sent_ns",
        "first_token_ns",
        "end_ns",
        "chunk_tokens",
    ]
    rows: list[tuple[bool, int | None, str | None]] = []
    f = ValidityInput(interrupted=interrupted)
    times = _Extent()
    for part in sorted((out / "requests").glob("*.parquet")):
        d = pq.read_table(part, columns=cols).to_pydict()
        rows += zip(d["warmup"], d["http_status"], d["error"], strict=True)
        for i, warm in enumerate(d["warmup"]):
            if warm:
                continue
            f.responses += 1
            if d["error_kind"][i] == ErrorKind.CANCELLED:
                f.cancelled += 1
            elif d["status"][i] != "ok":
                f.failed += 1
            times.add(
                d["status"][i] == "ok",
                d["sent_ns"][i],
                d["first_token_ns"][i],
                d["end_ns"][i],
                d["chunk_tokens"][i],
            )
    times.set_facts(f)
    return rows, f


def agentx_meta(
    meta: RunMeta, out: Path, summary: RunSummary, config: RunConfig | None = None
) -> None:
    """run.json's ``agentx`` block: the settings, the validity verdict (warm-up excluded;
    ``replay.agentx.agentx_validity``) and the idle time skipped; an invalid run says so
    first among the warnings and in ``summary.invalid_reason``."""
    from agent_replay.replay.agentx import DEFAULT_DURATION_S
    from agent_replay.replay.validity import ValidityRules, agentx_validity

    rows, f = _validity_rows(out, summary.interrupted)
    rules = ValidityRules()
    if config is not None:
        ax = config.agentx
        f.expected_s = config.duration_s if config.duration_s is not None else DEFAULT_DURATION_S
        rules = ValidityRules(
            min_duration_s=ax.min_duration_s,
            failure_threshold=ax.failure_threshold,
            metric_coverage=ax.metric_coverage,
            overflow_rule=ax.overflow_rule,
        )
    block = agentx_validity(rows, rules, f)
    block["idle_skipped_s"] = sum(w.idle_skipped_ns for w in summary.workers) / 1e9
    block["overflow_dropped"] = sum(w.overflow_dropped for w in summary.workers)
    meta.agentx = block
    meta.valid = block["valid"]
    if not block["valid"]:
        summary.invalid_reason = block["invalid_reason"]
        meta.warnings = [f"INVALID run (AgentX rule): {block['invalid_reason']}", *meta.warnings]


def finish(
    out: Path,
    meta: RunMeta,
    summary: RunSummary,
    timing: str,
    config: RunConfig | None = None,
    reserve: SpaceReserve | None = None,
) -> None:
    """run.json's last write: the outcome (and, for ``agentx`` timing, its validity)."""
    meta.merge(outcome(summary))
    if timing == "agentx":
        agentx_meta(meta, out, summary, config)
        meta.status = summary.status
        meta.conditions = summary.conditions
    write_run_json(out, meta, reserve)
