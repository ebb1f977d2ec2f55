"""Where GPU samples come from: NVML on this host, or a DCGM exporter's Prometheus page.

A backend is opened once (``open`` raises ``TelemetryOff`` with the reason when it cannot
sample: no driver, no GPU, no exporter), then ``sample()`` returns one row per GPU in the
column order of ``agent_replay.results_schema.GPU_TELEMETRY_SCHEMA`` without ``t_ns`` (the
sampler stamps it). Both take their I/O as an argument: ``NvmlBackend`` the ``pynvml``
module object (``engines.telemetry.fake.FakeNvml`` in tests), ``DcgmBackend`` a function
that fetches the page's text; ``parse_dcgm`` is pure.
"""

from __future__ import annotations

import math
import re
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Row = tuple[Any, ...]
"""(gpu, uuid, gpu_util_pct, sm_active_pct, mem_util_pct, dram_active_pct, mem_used_bytes,
mem_total_bytes, power_w, energy_mj, temp_c, sm_clock_mhz, mem_clock_mhz)"""


def _maybe(v: Any, conv: Callable[[Any], Any]) -> Any:
    """``conv(v)``, or None for a reading that is None."""
    return None if v is None else conv(v)


MIB = 1 << 20


class TelemetryOff(Exception):
    """The source cannot be sampled; the message says why, in words for the user."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str | None
    name: str | None


class Backend(Protocol):
    name: str

    def open(self) -> list[GpuInfo]: ...

    def sample(self) -> list[Row]: ...

    def close(self) -> None: ...


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class NvmlBackend:
    """NVML through the ``pynvml`` module of ``nvidia-ml-py`` (or any object with its API).

    ``indices``: the GPUs to sample (NVML indices; None: every GPU). A reading the device
    does not support (``NVMLError_NotSupported``) is null and is not asked again."""

    name = "nvml"

    def __init__(self, nvml: Any, indices: Sequence[int] | None = None) -> None:
        self.nvml = nvml
        self.indices = None if indices is None else list(indices)
        self._handles: list[tuple[int, Any, str | None]] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._open = False

    def open(self) -> list[GpuInfo]:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise TelemetryOff(
                f"NVML cannot start ({exc}): no NVIDIA driver on this host"
            ) from None
        self._open = True
        try:
            count = nv.nvmlDeviceGetCount()
            if count == 0:
                raise TelemetryOff("NVML finds no GPU on this host")
            wanted = list(range(count)) if self.indices is None else self.indices
            bad = [i for i in wanted if not 0 <= i < count]
            if bad:
                raise TelemetryOff(f"GPU {bad[0]} does not exist (NVML finds {count})")
            infos = []
            for i in wanted:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                self._handles.append((i, h, uuid))
                infos.append(GpuInfo(i, uuid, _text(nv.nvmlDeviceGetName(h))))
            return infos
        except nv.NVMLError as exc:
            self.close()
            raise TelemetryOff(f"NVML: {exc}") from None
        except TelemetryOff:
            self.close()
            raise

    def _read(self, i: int, what: str, call: Callable[..., Any], *args: Any) -> Any:
        if (i, what) in self._unsupported:
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported:
            self._unsupported.add((i, what))
            return None

    def sample(self) -> list[Row]:
        return [self._row(i, h, uuid) for i, h, uuid in self._handles]

    def _row(self, i: int, h: Any, uuid: str | None) -> Row:
        """GPU ``i``'s row: a reading NVML does not support is null."""
        nv, read = self.nvml, self._read
        util = read(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        mem = read(i, "mem", nv.nvmlDeviceGetMemoryInfo, h)
        power = read(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        energy = read(i, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
        temp = read(i, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        sm = read(i, "sm", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        mclk = read(i, "mclk", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        return (
            i,
            uuid,
            _maybe(util, lambda u: float(u.gpu)),
            None,
            _maybe(util, lambda u: float(u.memory)),
            None,
            _maybe(mem, lambda m: int(m.used)),
            _maybe(mem, lambda m: int(m.total)),
            _maybe(power, lambda mw: mw / 1000.0),  # mW
            _maybe(energy, int),  # mJ
            _maybe(temp, float),
            _maybe(sm, float),
            _maybe(mclk, float),
        )

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass


DCGM_FIELDS = {
    # exporter metric -> (column, scale)
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),  # a ratio 0..1
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_pct", 100.0),  # a ratio 0..1
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),  # MiB
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),  # mJ since boot
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
}
_FB_FREE, _FB_RESERVED, _FB_TOTAL = (
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_FB_TOTAL",
)
DCGM_BLANK = float(0x7FFFFFFFFFFFFFF0)
"""DCGM's blank values (field not supported or not yet read) start at this int64."""
COLUMNS = (
    "gpu_util_pct",
    "sm_active_pct",
    "mem_util_pct",
    "dram_active_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "energy_mj",
    "temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
)
_INT_COLUMNS = frozenset({"mem_used_bytes", "mem_total_bytes", "energy_mj"})


_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_WANTED = frozenset(DCGM_FIELDS) | {_FB_FREE, _FB_RESERVED, _FB_TOTAL}


def _metric_name(line: str) -> str:
    """The metric name a sample line starts with (up to its labels or value)."""
    cut = len(line)
    for ch in "{ ":
        i = line.find(ch)
        if 0 <= i < cut:
            cut = i
    return line[:cut]


def _labels(rest: str, no: int, line: str) -> tuple[dict[str, str], str]:
    """(the labels of a sample line, the text after them); ``rest``: the line after its
    metric name."""
    if not rest.startswith("{"):
        return {}, rest
    close = rest.rfind("}")
    if close < 0:
        raise ValueError(f"line {no}: no closing brace: {line[:80]!r}")
    body, after = rest[1:close].strip(), rest[close + 1 :]
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if m is None:
            raise ValueError(f"line {no}: bad labels: {line[:80]!r}")
        labels[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = m.end()
    return labels, after


def _sample_value(rest: str, no: int, line: str) -> float:
    parts = rest.split()
    if not parts:
        raise ValueError(f"line {no}: no value: {line[:80]!r}")
    try:
        return float(parts[0])
    except ValueError:
        raise ValueError(f"line {no}: value {parts[0]!r} is not a number") from None


def _sample_lines(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every sample line of a metric the sampler reads. Only the
    lines of wanted metrics are parsed (an exporter page has many others), so a 10 Hz read
    of 8 GPUs stays cheap; malformed wanted lines raise ``ValueError`` naming the line."""
    for no, line in enumerate(text.splitlines(), 1):
        if not line.startswith("DCGM_FI_"):
            continue
        name = _metric_name(line)
        if name not in _WANTED:
            continue
        labels, rest = _labels(line[len(name) :], no, line)
        yield name, labels, _sample_value(rest, no, line)


def _whole_gpu(labels: dict[str, str]) -> int | None:
    """The ``gpu`` label of a whole GPU's sample; None for a MIG instance's or without one."""
    if labels.get("GPU_I_ID") or "gpu" not in labels:
        return None
    try:
        return int(labels["gpu"])
    except ValueError:
        return None


def _dcgm_row(gpu: int, uuid: str | None, got: dict[str, float]) -> Row:
    """A GPU's row from its metrics' values: each scaled to its column, the memory total
    from the exporter's total or else from free + used + reserved."""
    vals: dict[str, Any] = dict.fromkeys(COLUMNS)
    for metric, (col, scale) in DCGM_FIELDS.items():
        if metric in got:
            vals[col] = got[metric] * scale
    if _FB_TOTAL in got:
        vals["mem_total_bytes"] = got[_FB_TOTAL] * MIB
    elif _FB_FREE in got and "DCGM_FI_DEV_FB_USED" in got:
        vals["mem_total_bytes"] = (
            got[_FB_FREE] + got["DCGM_FI_DEV_FB_USED"] + got.get(_FB_RESERVED, 0.0)
        ) * MIB
    for col in _INT_COLUMNS:
        if vals[col] is not None:
            vals[col] = round(vals[col])
    return (gpu, uuid, *(vals[c] for c in COLUMNS))


def parse_dcgm(text: str) -> tuple[list[Row], dict[int, GpuInfo]]:
    """Rows (one per ``gpu`` label, in index order) and the GPUs' uuid/model from a DCGM
    exporter page (Prometheus text format). Unknown metrics are skipped unparsed, blank
    values read as null; a sample with a MIG instance label (``GPU_I_ID``) is left out
    (whole GPUs only). Raises ``ValueError`` on a malformed line of a wanted metric."""
    by_gpu: dict[int, dict[str, float]] = {}
    info: dict[int, GpuInfo] = {}
    for name, labels, v in _sample_lines(text):
        gpu = _whole_gpu(labels)
        if gpu is None:
            continue
        if gpu not in info:
            info[gpu] = GpuInfo(gpu, labels.get("UUID"), labels.get("modelName"))
        if math.isfinite(v) and v < DCGM_BLANK:
            by_gpu.setdefault(gpu, {})[name] = v
    rows = [_dcgm_row(gpu, info[gpu].uuid, by_gpu.get(gpu, {})) for gpu in sorted(info)]
    return rows, info


def http_get(url: str, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", "replace")


class DcgmBackend:
    """A DCGM exporter's ``/metrics`` page (``--gpu-metrics URL``). The exporter refreshes its
    values every collection interval (its ``-c`` option, milliseconds): sampling faster than
    that repeats values."""

    name = "dcgm"

    def __init__(self, url: str, fetch: Callable[[str], str] = http_get) -> None:
        self.url = url
        self.fetch = fetch

    def open(self) -> list[GpuInfo]:
        try:
            text = self.fetch(self.url)
        except OSError as exc:
            raise TelemetryOff(f"DCGM exporter {self.url} not reachable ({exc})") from None
        try:
            rows, info = parse_dcgm(text)
        except ValueError as exc:
            raise TelemetryOff(f"{self.url}: not Prometheus text ({exc})") from None
        if not rows:
            raise TelemetryOff(f"{self.url} lists no DCGM_FI_* GPU metric")
        return [info[g] for g in sorted(info)]

    def sample(self) -> list[Row]:
        return parse_dcgm(self.fetch(self.url))[0]

    def close(self) -> None:
        pass
