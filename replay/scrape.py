"""What a run samples beside its requests, each in a process of its own started before t0:
the server's /metrics (``MetricsScraper``, written to server_metrics.parquet) and the GPUs
(``start_gpu_telemetry``, engines.telemetry). Parsing Prometheus text or polling NVML in
the parent would take the GIL from the measuring event loop."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_replay.replay.lifeline import die_with_parent

if TYPE_CHECKING:  # not imported at run time: the scraper's process starts from this module
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.feed import Reporter
    from agent_replay.replay.target import TargetInfo

FILE_NAME = "server_metrics.parquet"


def scrape_interval(config: RunConfig, info: TargetInfo) -> float:
    """``--scrape-interval``, else 1 s for a target with /metrics and 0 (off) without."""
    if config.scrape_interval_s is not None:
        return config.scrape_interval_s
    return 1.0 if info.has_metrics else 0.0


class MetricsScraper:
    """The /metrics scraper (engines.metrics_scrape) in its own process; its baseline scrape
    precedes t0, and each scrape also writes the server gauges the dashboard shows
    (``gauges``, shared memory). An interval of 0 is off: nothing starts."""

    def __init__(self, url: str, interval_s: float, out: Path) -> None:
        self.url, self.interval_s, self.out = url, interval_s, out
        self.gauges: Any = None  # analysis.gauges.SharedGauges while it runs
        self.error: str | None = None
        self._proc: Any = None

    @property
    def running(self) -> bool:
        return self._proc is not None

    def start(self) -> None:
        if self.interval_s <= 0:
            return
        from agent_replay.analysis.gauges import SharedGauges

        ctx = mp.get_context("spawn")
        self.gauges = SharedGauges()
        self._stop = ctx.Event()
        ready = ctx.Event()
        self._errq: Any = ctx.Queue()
        self._t0: Any = ctx.Value("q", 0)
        self._proc = ctx.Process(
            target=_scrape_main,
            name="agent-replay-scrape",
            daemon=True,
            args=(
                self.url,
                self.interval_s,
                str(self.out),
                self._stop,
                ready,
                self._errq,
                self._t0,
                self.gauges,
            ),
        )
        self._proc.start()
        ready.wait(timeout=20)

    def set_t0(self, t0: int) -> None:
        """The run's t0: scrape times are written as offsets from it."""
        if self._proc is not None:
            self._t0.value = t0

    def describe(self) -> dict[str, Any]:
        """run.json's ``scrape`` block."""
        d: dict[str, Any] = {"interval_s": self.interval_s, "available": self.running}
        if self.error:
            d["error"] = self.error
        return d

    def stop(self) -> None:
        """Stop after one last scrape (the dashboard's last gauges) and the Parquet write;
        a failure in the scraper is kept in ``error``, never raised."""
        if self._proc is None:
            return
        self._stop.set()
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.terminate()
        with contextlib.suppress(queue.Empty):
            self.error = self._errq.get_nowait()


def _scrape_main(
    url: str,
    interval_s: float,
    out: str,
    stop: Any,
    ready: Any,
    errq: Any,
    t0: Any,
    gauges: Any = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    die_with_parent(signal.SIGTERM)  # ...or its end does
    from agent_replay.engines.metrics_scrape import Scraper

    async def go() -> None:
        on_scrape = None
        if gauges is not None:
            from agent_replay.analysis.gauges import gauge_sums

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
        table = table.set_column(
            table.schema.get_field_index("t_ns"), table.schema.field("t_ns"), t_ns
        )

        dest = Path(out)
        tmp = dest.with_name(f".{dest.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, dest)

    try:
        asyncio.run(go())
    except Exception as exc:  # reported in run.json, never fatal to the run
        ready.set()
        errq.put(f"{type(exc).__name__}: {exc}")


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
        visible = (launch_info.get("env") or {}).get(
            "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")
        )
    elif config.gpu_metrics == "auto":
        visible = server_visible_devices(config.target)
    return resolve(config.gpu_metrics, config.target, launched, visible)


def _usable_source(config: RunConfig, launch_info: dict[str, Any] | None) -> tuple[Any, str]:
    """``gpu_source``'s answer, None with the reason when it is NVML and NVML cannot be used."""
    from agent_replay.engines.telemetry.source import nvml_unavailable

    source, why = gpu_source(config, launch_info)
    if source is not None and source.kind == "nvml":
        why = nvml_unavailable() or ""
        if why:
            source = None
    return source, why


def start_gpu_telemetry(
    config: RunConfig, out: Path, launch_info: dict[str, Any] | None, progress: Reporter | None
) -> tuple[Any, dict[str, Any]]:
    """The GPU sampler (engines.telemetry) started before t0 in its own process, or None
    and the run.json block that says why (also said in one line). A launched server's
    CUDA_VISIBLE_DEVICES limits ``auto`` to its GPUs."""
    from agent_replay.engines.telemetry import FILE_NAME as GPU_FILE
    from agent_replay.engines.telemetry import TelemetryProcess

    source, why = _usable_source(config, launch_info)
    if source is not None:
        tel = TelemetryProcess(source, config.gpu_interval_s, out / GPU_FILE)
        if tel.start():
            return tel, {}
        why = tel.off_reason or ""
    if progress is not None and (config.gpu_metrics != "auto" or host_has_nvidia()):
        progress(f"GPU telemetry off: {why}")  # asked for, or GPUs are there: worth a line
    return None, {"enabled": False, "reason": why}


def host_has_nvidia() -> bool:
    """An NVIDIA driver is loaded on this host: ``auto`` telemetry that stays off is worth
    saying there, not on every CPU-only run (run.json keeps the reason either way)."""
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl")
