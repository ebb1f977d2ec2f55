"""Which GPU telemetry a run takes: the ``--gpu-metrics`` value, checked, and resolved
against the run's target.

Values: ``auto`` (NVML when the server runs on this host: a loopback or this host's name
in the target URL, or a server that ``--launch`` started; only the GPUs the server's
``CUDA_VISIBLE_DEVICES`` lists, when it sets one), ``nvml`` or ``nvml:0,2`` (NVML, all GPUs
or the listed indices), a DCGM exporter's ``http(s)://`` URL, or ``off``.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

from agent_replay.errors import InputError

GPU_EXTRA = "pip install 'agent-replay[gpu]'"
DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia")


@dataclass(frozen=True, slots=True)
class Source:
    kind: str
    """``nvml`` or ``dcgm``."""
    url: str | None = None
    indices: tuple[int, ...] | None = None

    def describe(self) -> str:
        if self.kind == "dcgm":
            return f"DCGM exporter {self.url}"
        return "NVML" + (f" GPUs {','.join(map(str, self.indices))}" if self.indices else "")


def check_spec(spec: str) -> None:
    """Raise ``InputError`` naming the option when ``spec`` is not a valid value."""
    if spec in ("auto", "off", "nvml") or spec.startswith(("http://", "https://")):
        if spec.startswith("http") and not urlsplit(spec).hostname:
            raise InputError(f"--gpu-metrics {spec!r}: the URL has no host")
        return
    if spec.startswith("nvml:"):
        _indices(spec)
        return
    raise InputError(
        f"--gpu-metrics {spec!r}: expected auto, off, nvml, nvml:0,1 or the "
        "URL of a DCGM exporter (http://HOST:9400/metrics)"
    )


def _indices(spec: str) -> tuple[int, ...]:
    out = []
    for part in spec[len("nvml:") :].split(","):
        try:
            i = int(part)
        except ValueError:
            raise InputError(f"--gpu-metrics {spec!r}: {part!r} is not a GPU index") from None
        if i < 0:
            raise InputError(f"--gpu-metrics {spec!r}: GPU indices are >= 0")
        out.append(i)
    return tuple(out)


def is_local(url: str) -> bool:
    """Whether ``url``'s host is this machine (loopback, unspecified, or its own name)."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def visible_indices(value: str | None) -> tuple[int, ...] | None:
    """GPU indices from a ``CUDA_VISIBLE_DEVICES`` value; None when it is unset, empty or
    not a list of integers (UUIDs, MIG names). CUDA numbers GPUs fastest first, NVML by PCI
    bus; on a host of identical GPUs the two orders agree."""
    if not value or not value.strip():
        return None
    try:
        out = tuple(int(x) for x in value.split(","))
    except ValueError:
        return None
    return out if all(i >= 0 for i in out) else None


def server_visible_devices(url: str) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of the process on this host that listens on ``url``'s
    port (a server started beside the run, e.g. by ``engines launch``), or None: not a local
    URL, no such process visible to us, or the variable unset. Best effort (psutil)."""
    if not is_local(url):
        return None
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    import psutil

    pid = _listener(port)
    if pid is None:
        return None
    try:
        return psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES")
    except (psutil.Error, OSError):
        return None


def _listener(port: int) -> int | None:
    """The pid of the process on this host listening on TCP ``port`` (None: none seen)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return next(
        (
            c.pid
            for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        ),
        None,
    )


def resolve(
    spec: str, target: str, launched: bool = False, visible_devices: str | None = None
) -> tuple[Source | None, str]:
    """The source to sample, or None and the reason telemetry is off (one line's end).
    ``visible_devices``: the server's ``CUDA_VISIBLE_DEVICES`` (of the launched server, or
    of the local process listening on the target's port); with ``auto``, only those GPUs
    are sampled (a host may serve several deployments at once)."""
    check_spec(spec)
    if spec == "off":
        return None, "turned off (--gpu-metrics off)"
    if spec.startswith(("http://", "https://")):
        return Source("dcgm", url=spec), ""
    if spec == "auto" and not (launched or is_local(target)):
        return None, (
            f"the server ({urlsplit(target).hostname}) is not on this host; pass "
            "--gpu-metrics URL of its DCGM exporter"
        )
    if spec.startswith("nvml:"):
        return Source("nvml", indices=_indices(spec)), ""
    return Source("nvml", indices=visible_indices(visible_devices)), ""


def vendored_pynvml() -> Path | None:
    """vLLM's own copy of the NVML bindings (``vllm/third_party/pynvml.py``), found without
    importing vLLM, when vLLM is installed."""
    spec = importlib.util.find_spec("vllm")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(loc) / "third_party" / "pynvml.py"
        if path.is_file():
            return path
    return None


def load_pynvml() -> ModuleType:
    """The NVML bindings: ``pynvml`` (nvidia-ml-py, the ``gpu`` extra), else the copy vLLM
    ships, loaded on its own (vLLM itself is not imported). ImportError when neither is here."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        path = vendored_pynvml()
        if path is None:
            raise
    spec = importlib.util.spec_from_file_location("agent_replay_vendored_pynvml", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def nvml_unavailable() -> str | None:
    """Why NVML cannot work here, found without starting a process or loading NVML (no
    bindings; on Linux no ``libnvidia-ml``), else None: the sampler process then finds out
    the rest (no GPU, driver errors)."""
    if importlib.util.find_spec("pynvml") is None and vendored_pynvml() is None:
        return f"nvidia-ml-py is not installed ({GPU_EXTRA})"
    if (
        sys.platform.startswith("linux")
        and not any(map(os.path.exists, DRIVER_PATHS))
        and ctypes.util.find_library("nvidia-ml") is None
    ):
        return "no NVIDIA driver on this host (no /dev/nvidiactl, no libnvidia-ml)"
    return None
