"""The GPU sampler in a process of its own, beside a run: ``TelemetryProcess``.

    tel = TelemetryProcess(source, 0.1, out / "gpu_telemetry.parquet")
    if not tel.start():          # opens NVML / reads the exporter once, takes a first sample
        print(tel.off_line())    # "GPU telemetry off: <why>"
    tel.set_t0(t0_ns)            # the run's t0: written times are offsets from it
    ...                          # the run
    meta["gpu_telemetry"] = tel.stop()  # last sample, Parquet written, cost returned

A sweep runs one per run the same way. The process never shares an event loop or the GIL
with the workers; NVML (``nvidia-ml-py``, the ``gpu`` extra) is imported only there.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent_replay.engines.telemetry.backends import Backend, DcgmBackend, NvmlBackend, TelemetryOff
from agent_replay.engines.telemetry.gauges import GpuGauges, aggregate
from agent_replay.engines.telemetry.source import GPU_EXTRA, Source, load_pynvml

FILE_NAME = "gpu_telemetry.parquet"
DEFAULT_INTERVAL_S = 0.1


def open_backend(source: Source, nvml: Any = None) -> Backend:
    """The backend for ``source``; ``nvml``: a module object to use instead of ``pynvml``."""
    if source.kind == "dcgm":
        assert source.url is not None
        return DcgmBackend(source.url)
    if nvml is None:
        try:
            nvml = load_pynvml()
        except ImportError:
            raise TelemetryOff(f"nvidia-ml-py is not installed ({GPU_EXTRA})") from None
    return NvmlBackend(nvml, source.indices)


class TelemetryProcess:
    """Start/stop a sampler process; see the module docs. ``nvml``: a picklable module-like
    object used instead of ``pynvml`` (the fake, in tests and benchmarks)."""

    def __init__(
        self,
        source: Source,
        interval_s: float = DEFAULT_INTERVAL_S,
        out: str | os.PathLike[str] | None = None,
        *,
        nvml: Any = None,
        flush_rows: int = 65_536,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.source, self.interval_s = source, interval_s
        self.out = None if out is None else Path(out)
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._q: Any = ctx.Queue()
        self._t0: Any = ctx.Value("q", 0)
        self.gauges = GpuGauges()  # the newest read, for the dashboard
        self._proc = ctx.Process(
            target=_main,
            name="agent-replay-gpu-telemetry",
            daemon=True,
            args=(
                source,
                interval_s,
                None if out is None else str(out),
                self._stop,
                self._q,
                self._t0,
                nvml,
                self.gauges,
                flush_rows,
            ),
        )
        self.gpus: list[dict[str, Any]] = []
        self.off_reason: str | None = None
        self.result: dict[str, Any] | None = None

    def start(self, timeout_s: float = 30.0) -> bool:
        """Start sampling; False (and ``off_reason``) when the source cannot be sampled."""
        self._proc.start()
        try:
            kind, payload = self._q.get(timeout=timeout_s)
        except queue.Empty:
            kind, payload = "off", f"the sampler did not start within {timeout_s:g} s"
        if kind == "ready":
            self.gpus = payload
            return True
        self.off_reason = str(payload)
        self._join()
        return False

    def off_line(self) -> str:
        return f"GPU telemetry off: {self.off_reason}"

    def set_t0(self, t0_ns: int) -> None:
        """The run's t0 on CLOCK_MONOTONIC: sample times are written as offsets from it."""
        self._t0.value = int(t0_ns)

    def stop(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Take the last sample, write the Parquet file, and return the run.json block."""
        if self.off_reason is not None or self._proc.pid is None:
            return self.describe()
        self._stop.set()
        kind: str = "error"
        payload: Any = f"the sampler did not stop within {timeout_s:g} s"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                kind, payload = self._q.get(timeout=0.2)
                break
            except queue.Empty:
                if not self._proc.is_alive() and self._q.empty():
                    payload = f"the sampler process died (exit code {self._proc.exitcode})"
                    break
        self._join()
        self.result = {"error": str(payload)} if kind != "done" else payload
        return self.describe()

    def describe(self) -> dict[str, Any]:
        if self.off_reason is not None:
            return {"enabled": False, "reason": self.off_reason, "source": self.source.describe()}
        d: dict[str, Any] = {
            "enabled": True,
            "source": self.source.describe(),
            "backend": self.source.kind,
            "interval_s": self.interval_s,
            "gpus": self.gpus,
            "file": self.out.name if self.out else None,
        }
        if self.result is not None:
            d.update(self.result)
        return d

    def _join(self) -> None:
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)


def _open(source: Source, nvml: Any, q: Any) -> tuple[Any, list[Any]] | None:
    """(the backend, its GPUs), or None once the parent is told why telemetry is off."""
    try:
        backend = open_backend(source, nvml)
        return backend, backend.open()
    except TelemetryOff as exc:
        q.put(("off", str(exc)))
    except Exception as exc:
        q.put(("off", f"{type(exc).__name__}: {exc}"))
    return None


def _gauge_writer(gauges: GpuGauges) -> Callable[[int, list[Any]], None]:
    """What writes each sample's aggregate to the dashboard's gauges (energy from the
    first sample where every GPU reports it)."""
    energy0: list[float | None] = [None]

    def on_sample(t_ns: int, rows: list[Any]) -> None:
        if energy0[0] is None and rows and all(r[9] is not None for r in rows):
            energy0[0] = float(sum(r[9] for r in rows))
        gauges.write(aggregate(rows, energy0[0]))

    return on_sample


class _TelemetryFile:
    """The run's telemetry file (``dest``; None: none is kept): rows written to a
    temporary file beside it as they come, moved into place when the sampling ends."""

    def __init__(self, dest: Path | None, pq: Any, schema: Any) -> None:
        self.dest = dest
        self._pq = pq  # pyarrow.parquet, imported by the caller before it reports ready
        self._schema = schema
        self._writer: Any = None

    def write(self, table: Any) -> None:
        assert self.dest is not None
        if self._writer is None:
            tmp = self.dest.with_name(f".{self.dest.name}.tmp")
            self._writer = self._pq.ParquetWriter(tmp, self._schema, compression="zstd")
        self._writer.write_table(table)

    def finish(self, table: Any) -> None:
        """The last rows written, the file closed and moved into place."""
        assert self.dest is not None
        self.write(table)
        self._writer.close()
        os.replace(self.dest.with_name(f".{self.dest.name}.tmp"), self.dest)

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


def _main(
    source: Source,
    interval_s: float,
    out: str | None,
    stop: Any,
    q: Any,
    t0: Any,
    nvml: Any,
    gauges: GpuGauges | None = None,
    flush_rows: int = 65_536,
) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    opened = _open(source, nvml, q)
    if opened is None:
        return
    backend, infos = opened
    # Everything the sampling needs is imported before "ready": the first read follows it at
    # once, well before the run's t0 (chosen after this).
    import pyarrow.parquet as pq

    from agent_replay.engines.telemetry.sampler import Sampler
    from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA

    q.put(("ready", [asdict(i) for i in infos]))
    on_sample = None if gauges is None else _gauge_writer(gauges)

    file = _TelemetryFile(None if out is None else Path(out), pq, GPU_TELEMETRY_SCHEMA)

    def sink(rows: list[Any]) -> bool:
        """A long run's rows go to the file as they come (bounded memory), once t0 is known."""
        if file.dest is None or not t0.value:
            return False
        file.write(sampler.table(int(t0.value), rows))
        return True

    sampler = Sampler(backend, interval_s, on_sample=on_sample, sink=sink, flush_rows=flush_rows)
    try:
        sampler.run(stop.wait)
        result: dict[str, Any] = {
            "rows": sampler.rows_flushed + len(sampler.rows),
            "cost": sampler.cost.as_dict(),
        }
        if file.dest is not None:
            file.finish(sampler.table(int(t0.value)))
        q.put(("done", result))
    except Exception as exc:  # reported in run.json, never fatal to the run
        q.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        file.close()
        with contextlib.suppress(Exception):
            backend.close()
