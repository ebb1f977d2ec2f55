"""A fake ``pynvml`` module: the NVML calls the sampler makes, answered from a model of N
GPUs, for tests and for the sampler's cost benchmark on machines without GPUs.

Each device draws ``power_w(index, t_s)`` watts (``t_s``: seconds on the injected clock
since the fake was made); its energy counter (mJ) adds the trapezoid of that power between
readings, exact when power is linear in time between them, so a test can check the
sampler's energy against the power integral. ``calls`` counts the NVML calls made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


def default_power(index: int, t_s: float) -> float:
    """300 W plus 10 W per device index, constant."""
    return 300.0 + 10.0 * index


class FakeNvml:
    """``FakeNvml(8)`` stands in for ``import pynvml``; ``FakeNvml(0)`` has no GPU;
    ``FakeNvml(driver=False)`` fails ``nvmlInit`` like a host without the driver. It pickles
    (to a sampler process) when ``power_w`` and ``clock_ns`` are module-level functions."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(
        self,
        devices: int = 1,
        *,
        driver: bool = True,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        power_w: Callable[[int, float], float] = default_power,
        energy0_mj: int = 1_000_000_000,
        mem_total: int = 141 << 30,
        no_energy: bool = False,
    ) -> None:
        self.devices, self.driver, self.clock_ns = devices, driver, clock_ns
        self.power_fn, self.energy0_mj, self.mem_total = power_w, energy0_mj, mem_total
        self.no_energy = no_energy
        self.t_start = clock_ns()
        self.calls = 0
        self.initialized = 0
        self._energy: dict[int, tuple[float, float]] = {}

    def _t(self) -> float:
        return (self.clock_ns() - self.t_start) / 1e9

    def energy_mj(self, i: int) -> int:
        """The counter now: the previous reading plus the trapezoid of power over the time
        since (exact for power linear in time)."""
        t = self._t()
        t_prev, e_prev = self._energy.get(i, (0.0, float(self.energy0_mj)))
        e = e_prev + (self.power_fn(i, t_prev) + self.power_fn(i, t)) / 2 * (t - t_prev) * 1000
        self._energy[i] = (t, e)
        return round(e)

    def _dev(self, h: Any) -> int:
        self.calls += 1
        if self.initialized <= 0:
            raise NVMLError("Uninitialized")
        return int(h.index)

    # The pynvml API, as far as the sampler uses it.
    def nvmlInit(self) -> None:
        self.calls += 1
        if not self.driver:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls += 1
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls += 1
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        self.calls += 1
        if not 0 <= i < self.devices:
            raise NVMLError("Invalid Argument")
        return SimpleNamespace(index=i)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"GPU-fake-{self._dev(h):04d}"

    def nvmlDeviceGetName(self, h: Any) -> str:
        self._dev(h)
        return "Fake GPU"

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        i = self._dev(h)
        return SimpleNamespace(gpu=min(100, 50 + 5 * i), memory=min(100, 20 + 2 * i))

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        i = self._dev(h)
        used = (60 + i) << 30
        return SimpleNamespace(total=self.mem_total, used=used, free=self.mem_total - used)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        i = self._dev(h)
        return round(self.power_fn(i, self._t()) * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        i = self._dev(h)
        if self.no_energy:
            raise NVMLError_NotSupported("Not Supported")
        return self.energy_mj(i)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return 40 + self._dev(h)

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        self._dev(h)
        return 1980 if kind == self.NVML_CLOCK_SM else 2619
