"""The Ray actor that runs one shard: the same worker code as local ``--workers``
(``replay.worker.arun_shard``), on its own event loop in its own thread, so the actor's
methods (``poll``, ``stop``) answer while the shard runs.

An actor on another node than the driver gets the trace's bytes, writes its part files to
a staging folder on its own disk and hands them over through ``poll`` (each part once,
then deleted), so the driver's results folder ends up complete without a shared
filesystem. An actor on the driver's node reads the trace and writes its parts in place.

Each ``poll`` also returns the shard's live statistics (``analysis.live.LiveStats``, encoded),
built from the part files already written: the rows are read off the measuring loop's hot
path, on the actor's method thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agent_replay.analysis.live import PART_COLUMNS, LiveStats
from agent_replay.engines import aio
from agent_replay.replay.config import RunConfig
from agent_replay.replay.distributed.placement import rebase_t0
from agent_replay.replay.messages import ActorPoll, Progress
from agent_replay.replay.plan import Plan
from agent_replay.replay.worker import WorkerSummary, arun_shard, load_plan


class ShardActor:
    """Plain class; the driver wraps it with ``ray.remote``. One actor, one shard."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.node_id = _node_id()
        self._staging: Path | None = None
        self._plan: Plan | None = None
        self._config: RunConfig | None = None
        self._shard = 0
        self._n = 1
        self._parts_dir: Path | None = None
        self._ship = False
        self._seen: set[str] = set()
        self._live = LiveStats()
        self._progress: Progress | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[WorkerSummary] | None = None
        self._summary: WorkerSummary | None = None
        self._error: str | None = None

    def info(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "node_id": self.node_id}

    def prepare(self, config: RunConfig, shard: int, n: int, ship: bool,
                trace_files: list[tuple[str, bytes]] | None) -> int:
        """Load the plan before the run's t0 (so its start is not late). With ``ship``, the
        trace comes as bytes and the part files go to a staging folder. Returns the number
        of requests of this shard."""
        self._shard, self._n, self._ship = shard, n, ship
        if ship:
            self._staging = Path(tempfile.mkdtemp(prefix=f"agent-replay-shard{shard}-"))
            config = replace(config, output=str(self._staging / "out"))
            if trace_files is not None:
                tdir = self._staging / "trace"
                tdir.mkdir()
                for name, data in trace_files:
                    (tdir / name).write_bytes(data)
                config = replace(config, trace=str(tdir if len(trace_files) > 1 else
                                                   tdir / trace_files[0][0]))
        self._config = config
        self._parts_dir = Path(config.output or ".") / "requests"
        self._plan = load_plan(config)
        return self._plan.shard(shard, n).n_requests

    def start(self, t0_mono_ns: int, t0_wall_ns: int, same_clock: bool) -> None:
        """Run the shard from the run's t0: the driver's monotonic t0 when this actor shares
        the driver's clock, else rebased from the wall-clock t0."""
        assert self._config is not None and self._plan is not None
        t0 = t0_mono_ns if same_clock else rebase_t0(t0_wall_ns, time.time_ns(), time.monotonic_ns())
        config = replace(self._config, t0_ns=t0)
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(config, self._plan, started),
                                        daemon=True, name=f"shard-{self._shard}")
        self._thread.start()
        started.wait(10)

    def _main(self, config: RunConfig, plan: Plan, started: threading.Event) -> None:
        loop = aio.new_event_loop(config.loop)
        self._loop = loop
        try:
            asyncio.set_event_loop(loop)
            self._task = loop.create_task(arun_shard(config, self._shard, self._n, self._report,
                                                     plan=plan))
            started.set()
            self._summary = loop.run_until_complete(self._task)
        except BaseException as exc:  # reported to the driver through poll()
            self._error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        finally:
            started.set()
            with contextlib.suppress(Exception):
                loop.close()

    def _report(self, msg: Progress) -> None:
        self._progress = msg

    def stop(self) -> None:
        """Cancel the shard (Ctrl-C on the driver): in-flight requests are recorded as
        cancelled and every completed row is written."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)

    def poll(self) -> ActorPoll:
        """Progress, new part files (when shipping), live snapshot; ``done`` with the
        shard's summary once it finished."""
        done = self._thread is not None and not self._thread.is_alive()
        parts = self._collect()
        return ActorPoll(progress=self._progress, parts=parts, snapshot=self._live.encode(),
                         done=done, summary=self._summary if done else None,
                         error=self._error if done else None)

    def _collect(self) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        if self._parts_dir is None or not self._parts_dir.is_dir():
            return out
        prefix = f"part-{self._shard:03d}-"
        for f in sorted(self._parts_dir.iterdir()):
            if not f.name.startswith(prefix) or not f.name.endswith(".parquet") or f.name in self._seen:
                continue
            self._seen.add(f.name)
            self._observe(f)
            if self._ship:
                out.append((f.name, f.read_bytes()))
                f.unlink()
        return out

    def _observe(self, path: Path) -> None:
        self._live.observe_table(pq.read_table(path, columns=list(PART_COLUMNS)))

    def close(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)


def _node_id() -> str:
    """The Ray node this actor runs on; "local" outside Ray (unit tests drive the class
    directly). Asking Ray's runtime context without a connection would start Ray."""
    try:
        import ray
    except ImportError:
        return "local"
    if not ray.is_initialized():
        return "local"
    return str(ray.get_runtime_context().get_node_id())


