"""GPU telemetry beside a run: per GPU utilization, memory, power, energy counter,
temperature and clocks, sampled from NVML or a DCGM exporter in a process of its own and
written as ``gpu_telemetry.parquet`` (``agent_replay.results_schema.GPU_TELEMETRY_SCHEMA``) on
the run's clock. ``analysis.gpu_energy`` turns it into the report's figures."""

from __future__ import annotations

from agent_replay.engines.telemetry.backends import (
    DcgmBackend,
    GpuInfo,
    NvmlBackend,
    TelemetryOff,
    parse_dcgm,
)
from agent_replay.engines.telemetry.process import (
    DEFAULT_INTERVAL_S,
    FILE_NAME,
    TelemetryProcess,
    open_backend,
)
from agent_replay.engines.telemetry.sampler import Sampler, SamplerCost
from agent_replay.engines.telemetry.source import Source, check_spec, is_local, resolve

__all__ = [
    "DEFAULT_INTERVAL_S",
    "FILE_NAME",
    "DcgmBackend",
    "GpuInfo",
    "NvmlBackend",
    "Sampler",
    "SamplerCost",
    "Source",
    "TelemetryOff",
    "TelemetryProcess",
    "check_spec",
    "is_local",
    "open_backend",
    "parse_dcgm",
    "resolve",
]
