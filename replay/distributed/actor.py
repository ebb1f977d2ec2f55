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

An actor given its driver (``driver_identity``) watches it from its start: once the driver
is gone (killed outright), it stops its shard as a local worker does when its parent dies
(in-flight requests ``cancelled``, every row written), rewrites run.json ``interrupted``
where it wrote in place (``pools.leave_orphaned``) and ends its process. On the driver's
node the driver is its process (pid and start time, as run.json's ``writer``); elsewhere
Ray's job table says when the driver's job is dead. The driver makes such actors detached,
so that Ray does not kill them with their owner before they wrote their rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
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
from agent_replay.runmeta import process_state, writer_identity

SAME_NODE_POLL_S = 0.25
"""How often an actor on the driver's node looks at the driver's process."""
JOB_POLL_S = 1.0
"""How often an actor elsewhere asks Ray's job table whether the driver's job is dead."""


def driver_identity(ray: Any) -> dict[str, Any]:
    """What an actor needs to watch this process, its driver: the process (as run.json's
    ``writer``), its Ray node and its Ray job."""
    ctx = ray.get_runtime_context()
    return {
        "process": writer_identity(),
        "node_id": str(ctx.get_node_id()),
        "job_id": str(ctx.get_job_id()),
    }


class ShardActor:
    """Plain class; the driver wraps it with ``ray.remote``. One actor, one shard."""

    def __init__(self, driver: Mapping[str, Any] | None = None) -> None:
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
        self._stopping = False
        if driver is not None:
            threading.Thread(
                target=self._watch, args=(dict(driver),), daemon=True, name="driver-watch"
            ).start()

    def info(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "node_id": self.node_id}

    def prepare(
        self,
        config: RunConfig,
        shard: int,
        n: int,
        ship: bool,
        trace_files: list[tuple[str, bytes]] | None,
    ) -> int:
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
                config = replace(
                    config, trace=str(tdir if len(trace_files) > 1 else tdir / trace_files[0][0])
                )
        self._config = config
        self._parts_dir = Path(config.output or ".") / "requests"
        self._plan = load_plan(config)
        return self._plan.shard(shard, n).n_requests

    def start(self, t0_mono_ns: int, t0_wall_ns: int, same_clock: bool) -> None:
        """Run the shard from the run's t0: the driver's monotonic t0 when this actor shares
        the driver's clock, else rebased from the wall-clock t0."""
        assert self._config is not None and self._plan is not None
        if self._stopping:
            return
        t0 = (
            t0_mono_ns if same_clock else rebase_t0(t0_wall_ns, time.time_ns(), time.monotonic_ns())
        )
        config = replace(self._config, t0_ns=t0)
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._main,
            args=(config, self._plan, started),
            daemon=True,
            name=f"shard-{self._shard}",
        )
        self._thread.start()
        started.wait(10)

    def _main(self, config: RunConfig, plan: Plan, started: threading.Event) -> None:
        loop = aio.new_event_loop(config.loop)
        self._loop = loop
        try:
            asyncio.set_event_loop(loop)
            self._task = loop.create_task(
                arun_shard(config, self._shard, self._n, self._report, plan=plan)
            )
            if self._stopping:  # a stop that came while the task was made
                self._task.cancel()
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
        self._stopping = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)

    def poll(self) -> ActorPoll:
        """Progress, new part files (when shipping), live snapshot; ``done`` with the
        shard's summary once it finished."""
        done = self._thread is not None and not self._thread.is_alive()
        parts = self._collect()
        return ActorPoll(
            progress=self._progress,
            parts=parts,
            snapshot=self._live.encode(),
            done=done,
            summary=self._summary if done else None,
            error=self._error if done else None,
        )

    def _collect(self) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        if self._parts_dir is None or not self._parts_dir.is_dir():
            return out
        prefix = f"part-{self._shard:03d}-"
        for f in sorted(self._parts_dir.iterdir()):
            if (
                not f.name.startswith(prefix)
                or not f.name.endswith(".parquet")
                or f.name in self._seen
            ):
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

    def _watch(self, driver: dict[str, Any]) -> None:
        """Until this process ends (the driver kills it once the run is over, a detached
        actor included): a driver gone before then is this actor's to clean up after."""
        same_node = driver.get("node_id") == self.node_id
        while True:
            time.sleep(SAME_NODE_POLL_S if same_node else JOB_POLL_S)
            state = process_state(driver.get("process")) if same_node else "unknown"
            if state == "gone" or (state == "unknown" and _job_dead(str(driver.get("job_id")))):
                self._orphaned()
                return

    def _orphaned(self) -> None:
        """The driver is gone: stop the shard, let it write its rows, record the run's end
        where this actor wrote in place, and end this process (nobody will close it)."""
        from agent_replay.replay.pools import STOP_WAIT_S, leave_orphaned

        self.stop()
        started = self._thread is not None
        config = self._config
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S + (config.write_retry_s if config is not None else 0.0))
        if config is not None and not self._ship:
            leave_orphaned(
                Path(config.output or "."),
                config,
                self._plan,
                self._shard,
                self._n,
                self._summary,
                started,
            )
        elif self._staging is not None and self._staging.exists():
            print(
                f"agent-replay: the run's driver is gone; shard {self._shard}'s part files "
                f"not handed over are kept in {self._staging}",
                file=sys.stderr,
            )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _job_dead(job_id: str) -> bool:
    """Whether Ray's job table says job ``job_id`` (hex) is dead; False when it cannot be
    asked."""
    try:
        from ray._private.state import jobs

        return any(j.get("JobID") == job_id and j.get("IsDead") for j in jobs())
    except Exception:
        return False


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
