"""run.json as a typed, versioned record: ``RunMeta`` and its blocks.

A run writes run.json (``replay.runrecord``) three times: when t0 is chosen, with
``failed`` when a worker fails, and last with the outcome. Every reader (report, compare,
sweep, frontier) reads it through ``RunMeta.from_json``, which takes any layout written so
far: ``run_meta_version`` 1 (this module's) and the files before it, which have no version
key and lack blocks added later (``self_check.kind``, ``summary.inexact``, ``provenance``,
``gpus``...). A missing block or key reads as its default; keys this module does not know
are kept in ``extra`` and written back by ``to_json``, so a newer file read by an older
tool loses nothing.

Free-form blocks that belong to one producer and one reader (``environment``, ``launch``,
``provenance``, ``scrape``, ``gpu_telemetry``, ``agentx``, ``ray``, ``machine``, ``gc``,
``loop_stalls``) stay mappings; the blocks every reader shares are dataclasses.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

RUN_META_VERSION = 1
"""The layout of run.json this module writes (key ``run_meta_version``; files without it
are the layouts before, read by the same rules)."""

T = TypeVar("T")

LEGACY_LOAD_OPTIONS = (
    "timing",
    "speedup",
    "concurrency",
    "sessions_multiplier",
    "max_sessions",
    "duration_s",
    "warmup_s",
    "api",
    "rate",
    "arrival",
    "concurrent_sessions",
    "ramp_s",
    "max_think_s",
    "rebase_sessions",
    "keep_overlaps",
    "include_failed",
    "vllm_extras",
    "agentx",
)
"""The load-shaping options of run.json files written before ``option_kinds``: the
options those versions had that shape the load."""


def _table(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _block(cls: type[T], raw: Any) -> T:
    """A dataclass from a JSON object: known keys (missing: the default), the rest in
    ``extra``; a value of the wrong kind reads as the default."""
    d = _table(raw)
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}  # type: ignore[arg-type]
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in d and f.name != "extra":
            kw[f.name] = d[f.name]
    kw["extra"] = {k: v for k, v in d.items() if k not in names}
    return cls(**kw)


def _json(block: Any) -> dict[str, Any]:
    out = {f.name: getattr(block, f.name) for f in dataclasses.fields(block) if f.name != "extra"}
    out.update(block.extra)
    return out


@dataclass
class TraceRef:
    path: str | None = None
    sha256: str | None = None
    block_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TargetRef:
    url: str | None = None
    model: str | None = None
    """The model asked for (None: the target's first)."""
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    has_metrics: bool = False
    model_description: str | None = None
    """What the served model is when this machine knows it (``dummy weights, shape of X``
    for a folder ``engines tiny-model`` wrote)."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClockAnchor:
    kind: str = "CLOCK_MONOTONIC"
    t0_monotonic_ns: int | None = None
    t0_wall_ns: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Planned:
    sessions: int = 0
    requests: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Counts:
    """The ``summary`` block: the workers' counts merged."""

    total: int = 0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    mismatches: int = 0
    inexact: int = 0
    chunks: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SelfCheckRecord:
    """The ``self_check`` block (``replay.selfmon.SelfReport`` as written). ``kind`` and
    ``line`` are None in files written before the one self-check policy."""

    schedule_lag_p50_ns: float | None = None
    schedule_lag_p99_ns: float | None = None
    schedule_lag_max_ns: float | None = None
    schedule_lag_n: int | None = None
    loop_lag_p99_ns: float | None = None
    loop_lag_max_ns: float | None = None
    loop_lag_n: int | None = None
    cpu_fraction: float | None = None
    machine: dict[str, Any] | None = None
    kind: str | None = None
    line: str | None = None
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def _scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    """The plain fields of a run.json mapping, each read leniently (a wrong type reads as
    the field's default)."""
    kw: dict[str, Any] = {
        name: None if d.get(name) is None else str(d.get(name))
        for name in ("status", "run_id", "error", "load_generator_warning", "gpus_source")
    }
    kw["results_schema_version"] = _int(d.get("results_schema_version"), None)
    kw["salt"] = _int(d.get("salt"), None)
    kw["warmup_ns"] = _int(d.get("warmup_ns"), 0)
    gpus = d.get("gpus")
    kw["gpus"] = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None
    w = d.get("warnings")
    kw["warnings"] = [str(x) for x in w] if isinstance(w, list) else []
    kw["load_generator_bottleneck"] = bool(d.get("load_generator_bottleneck"))
    kw["machine_contention"] = bool(d.get("machine_contention"))
    v = d.get("valid")
    kw["valid"] = v if isinstance(v, bool) else None
    return kw


@dataclass
class RunMeta:
    """One run's run.json."""

    version: int = 0
    """``run_meta_version``; 0: a file written before it existed."""
    results_schema_version: int | None = None
    status: str | None = None
    conditions: list[str] = field(default_factory=list)
    """Every condition of the run's end (failed, invalid, ...), the most serious first."""
    run_id: str | None = None
    error: str | None = None
    trace: TraceRef = field(default_factory=TraceRef)
    target: TargetRef = field(default_factory=TargetRef)
    options: dict[str, Any] = field(default_factory=dict)
    """``RunConfig``'s recorded options (``replay.options.record_options``)."""
    option_kinds: dict[str, str] = field(default_factory=dict)
    """What each option means (``replay.options.option_kinds``): option (``agentx.preset``
    for a nested one) -> ``load``, ``measurement``, ``output``, ``presentation`` or
    ``seed``; empty in files written before it was recorded."""
    salt: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    clock: ClockAnchor = field(default_factory=ClockAnchor)
    warmup_ns: int = 0
    planned: Planned = field(default_factory=Planned)
    summary: Counts | None = None
    """None until the run ends (the first write has no outcome yet)."""
    self_check: SelfCheckRecord | None = None
    loop_stalls: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    load_generator_bottleneck: bool = False
    load_generator_warning: str | None = None
    machine_contention: bool = False
    gpus: int | None = None
    gpus_source: str | None = None
    launch: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    gpu_telemetry: dict[str, Any] = field(default_factory=dict)
    agentx: dict[str, Any] | None = None
    valid: bool | None = None
    writer: dict[str, Any] | None = None
    """The process that writes this run.json (``writer_identity``): while the status is
    ``running``, a reader can tell a run still under way from one whose process is gone."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every other key of the file (``scrape``, ``gc``, ``ray``, ``machine``...), as read."""

    BLOCKS = {
        "trace": TraceRef,
        "target": TargetRef,
        "clock": ClockAnchor,
        "planned": Planned,
        "summary": Counts,
        "self_check": SelfCheckRecord,
    }
    MAPPINGS = (
        "options",
        "option_kinds",
        "environment",
        "loop_stalls",
        "provenance",
        "gpu_telemetry",
    )
    OPTIONAL_MAPPINGS = ("launch", "agentx", "writer")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> RunMeta:
        """Any run.json layout (see the module docstring); ``{}`` or None: an empty record."""
        d = _table(raw)
        kw: dict[str, Any] = {"version": _int(d.get("run_meta_version"), 0)}
        for name, block in cls.BLOCKS.items():
            if name in d and isinstance(d[name], Mapping):
                kw[name] = _block(block, d[name])
        for name in cls.MAPPINGS:
            kw[name] = _table(d.get(name))
        for name in cls.OPTIONAL_MAPPINGS:
            kw[name] = _table(d[name]) if isinstance(d.get(name), Mapping) else None
        kw.update(_scalars(d))
        known = {f.name for f in dataclasses.fields(cls)} | {"run_meta_version"}
        kw["extra"] = {k: v for k, v in d.items() if k not in known}
        return cls(**kw)

    @classmethod
    def of(cls, meta: RunMeta | Mapping[str, Any] | None) -> RunMeta:
        """``meta`` as a RunMeta (a JSON mapping is read with ``from_json``)."""
        return meta if isinstance(meta, RunMeta) else cls.from_json(meta)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, in this module's layout (unknown keys read are kept)."""
        out: dict[str, Any] = {"run_meta_version": RUN_META_VERSION}
        for f in dataclasses.fields(self):
            if f.name in ("version", "extra"):
                continue
            v = getattr(self, f.name)
            out[f.name] = _json(v) if f.name in self.BLOCKS and v is not None else v
        out.update(self.extra)
        return out

    def load_options(self) -> tuple[str, ...]:
        """The options that shape this run's load (``option_kinds``; for a file written
        before it recorded them, the load options of that time)."""
        if not self.option_kinds:
            return LEGACY_LOAD_OPTIONS
        return tuple(k for k, v in self.option_kinds.items() if v == "load")

    def option(self, name: str) -> Any:
        """An option's recorded value; ``agentx.preset`` reads a nested one (None: absent)."""
        v: Any = self.options
        for part in name.split("."):
            v = v.get(part) if isinstance(v, Mapping) else None
        return v

    def merge(self, fields: Mapping[str, Any]) -> None:
        """Set run.json fields from a JSON mapping (a run's outcome, a pool's blocks), each
        read by ``from_json``'s rules; the fields not named keep their values."""
        new = RunMeta.from_json({**self.to_json(), **fields})
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(new, f.name))

    @property
    def timing(self) -> str:
        """The run's ``--timing`` (``session`` when not recorded)."""
        return str(self.options.get("timing") or "session")

    @property
    def warmed_up(self) -> bool:
        """A warm-up replay ran just before the run (``agent-replay sweep``)."""
        return bool(self.options.get("warmed_up"))

    @property
    def invalid_reason(self) -> str | None:
        """Why the AgentX rules refuse the run (``agentx`` timing), None otherwise."""
        why = (self.agentx or {}).get("invalid_reason")
        return None if why is None else str(why)


def _int(v: Any, default: Any) -> Any:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (None: no /proc, no process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, Linux): with the pid, a process even
    once its pid is reused. None where there is no /proc or no such process."""
    st = _stat(pid)
    try:
        return int(st[19]) if st is not None else None
    except (ValueError, IndexError):
        return None


def writer_identity(pid: int | None = None) -> dict[str, Any]:
    """run.json's ``writer`` block for process ``pid`` (default: this one): pid, host,
    boot id and start time."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "start_ticks": _start_ticks(pid),
    }


def writer_state(meta: RunMeta) -> str:
    """Whether the process that wrote ``meta`` still runs: ``alive``, ``gone`` or
    ``unknown`` (no writer recorded, or one on another host: it cannot be asked from
    here)."""
    return process_state(meta.writer)


def process_state(w: Mapping[str, Any] | None) -> str:
    """Whether the process a ``writer_identity`` block names still runs: ``alive``,
    ``gone`` or ``unknown`` (no pid, or a process on another host)."""
    w = w or {}
    pid = w.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "unknown"
    if w.get("host") != socket.gethostname():
        return "unknown"
    boot = _boot_id()
    if w.get("boot_id") is not None and boot is not None and w.get("boot_id") != boot:
        return "gone"  # the host rebooted since
    st = _stat(pid)
    if st is not None:
        return _stat_state(st, w.get("start_ticks"))
    return _signal_state(pid)


def _stat_state(st: list[str], recorded: Any) -> str:
    """``alive`` or ``gone`` from a process's ``/proc`` stat fields: gone when killed
    (not yet reaped) or when its start time is not the one recorded (the pid was reused)."""
    if st[0] in ("Z", "X"):
        return "gone"
    return "alive" if recorded is None or str(recorded) == st[19] else "gone"


def _signal_state(pid: int) -> str:
    """``alive`` or ``gone`` by signal 0, where ``/proc`` has no stat of the process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "alive"
    return "gone" if os.path.isdir("/proc") else "alive"
