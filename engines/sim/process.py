"""The simulated engine in a child process, so it never shares the client's event loop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import agent_replay
from agent_replay.engines.sim.cli import READY_PREFIX
from agent_replay.errors import LaunchError


class SimProcess:
    """``python -m engines.sim`` as a subprocess; ``.url`` once started; ``stop()`` ends it.

    Use as a context manager (``with SimProcess("fast") as sim: ...``). ``port=0`` lets the
    child choose a free port and report it. ``stop()`` sends SIGTERM, so the child writes its
    ground truth before it exits. ``cpus``: run it (and its worker processes) on these CPUs
    only (Linux), e.g. away from a load generator's pinned workers.
    """

    def __init__(
        self,
        profile: str | Path = "fast",
        port: int = 0,
        workers: int = 1,
        ground_truth: str | Path | None = None,
        extra_args: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        seed: int = 0,
        start_timeout: float = 30.0,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.profile = str(profile)
        self.port = port
        self.workers = workers
        self.ground_truth = ground_truth
        self.extra_args = list(extra_args)
        self.host = host
        self.seed = seed
        self.start_timeout = start_timeout
        self.cpus = sorted(cpus) if cpus else None
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []
        self._drain: threading.Thread | None = None

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "agent_replay.engines.sim",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--profile",
            self.profile,
            "--seed",
            str(self.seed),
            "--workers",
            str(self.workers),
        ]
        if self.ground_truth is not None:
            cmd += ["--ground-truth", str(self.ground_truth)]
        return cmd + self.extra_args

    def start(self) -> SimProcess:
        env = dict(os.environ)
        root = str(Path(agent_replay.__file__).parent.parent)  # the folder holding the package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cpus = self.cpus
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()
        line = self._read_ready()
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1])
        self._wait_health()
        return self

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            if len(self._stderr) > 200:
                del self._stderr[:100]

    def _read_ready(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            result.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self.start_timeout)
        line = result[0] if result else ""
        if not line.startswith(READY_PREFIX):
            self.stop()
            tail = "".join(self._stderr[-5:]).strip()
            raise LaunchError(f"simulated engine did not start: {tail or 'no output'}")
        return line

    def _wait_health(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"simulated engine at {self.url} never became healthy")
            time.sleep(0.02)

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._drain is not None:
            self._drain.join(timeout=5)
        for f in (proc.stdout, proc.stderr):
            with contextlib.suppress(Exception):
                if f is not None:
                    f.close()
        return proc.returncode

    @property
    def stderr_tail(self) -> str:
        return "".join(self._stderr[-20:])

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
