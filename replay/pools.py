"""Where a run's workers run: one ``WorkerPool`` interface, three kinds.

* ``InProcessPool``: one worker on an event loop in this process (``--workers 1``).
* ``LocalProcessPool``: N spawned processes on this host (``--workers N``).
* ``RayPool`` (replay.distributed.backend): shard actors on a Ray cluster (``--ray``).

``start_pool`` picks one; ``replay.run`` then drives every kind the same way: the pool's
workers are ready before t0 is chosen, ``run`` starts them on it and returns their
summaries.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from agent_replay.engines import aio
from agent_replay.errors import AgentReplayError
from agent_replay.replay.affinity import pin_loop_thread
from agent_replay.replay.config import RunConfig
from agent_replay.replay.feed import ProgressFeed, Reporter
from agent_replay.replay.lifeline import die_with_parent, parent_alive, sigterm_received
from agent_replay.replay.plan import Plan
from agent_replay.replay.worker import WorkerSummary, arun_shard, run_shard

if TYPE_CHECKING:  # the Ray side is imported only when a Ray pool starts
    from agent_replay.replay.distributed.placement import Lost


class WorkerPool(Protocol):
    """Workers that are ready to start; ``run`` starts them at ``config.t0_ns``."""

    @property
    def size(self) -> int:
        """How many workers (shards) the plan is split over."""
        ...

    @property
    def start_delay_ns(self) -> int:
        """How far ahead of now t0 is chosen, so that every worker is waiting on it."""
        ...

    @property
    def feeds_snapshots(self) -> bool:
        """True when the pool hands the dashboard merged LiveStats snapshots itself; False
        when the dashboard computes the statistics from the part files in the results folder."""
        ...

    @property
    def meters_host(self) -> bool:
        """Whether the workers run on this host, so that its CPU meter speaks for them."""
        ...

    @property
    def lost(self) -> list[Lost]:
        """Shards that died with sessions not fully recorded (only Ray actors die alone)."""
        ...

    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        """Start every worker at ``config.t0_ns``, report to ``feed``, return the summaries
        by shard. Ctrl-C (KeyboardInterrupt) may go up; then ``arrived`` has what came."""
        ...

    def arrived(self) -> list[WorkerSummary]:
        """The summaries that arrived before ``run`` was stopped."""
        ...

    def describe(self) -> dict[str, Any]:
        """The pool's blocks of run.json (key: block); empty when it has none."""
        ...

    def close(self) -> None: ...


def start_pool(config: RunConfig, plan: Plan, n: int, warn: Reporter | None = None) -> WorkerPool:
    """The pool for ``config``: Ray with ``--ray``, else ``n`` local processes, or this
    process when ``n`` is 1. It returns when its workers are ready. ``warn`` gets a line for
    each worker lost on the way (Ray)."""
    if config.ray is not None:
        from agent_replay.replay.distributed import RayPool

        return RayPool.start(config, plan, config.ray, config.ray_actors_per_node, warn=warn)
    if n == 1:
        return InProcessPool(plan)
    return LocalProcessPool.start(config, n)


class _OnThisHost:
    """What the two local pools share: the dashboard reads the part files, the host's CPU
    meter applies, no worker is lost alone and run.json gets no block of theirs."""

    feeds_snapshots = False
    meters_host = True

    @property
    def lost(self) -> list[Lost]:
        return []

    def describe(self) -> dict[str, Any]:
        return {}


class InProcessPool(_OnThisHost):
    """The one worker on an event loop of this process, with the plan already built."""

    size = 1
    start_delay_ns = 200_000_000

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        if config.worker_cpus:
            pin_loop_thread(config.worker_cpus, 0)
        return [aio.run(arun_shard(config, 0, 1, feed.update, plan=self.plan), config.loop)]

    def arrived(self) -> list[WorkerSummary]:
        return []  # the one summary is run's return value

    def close(self) -> None:
        pass


class LocalProcessPool(_OnThisHost):
    """Local worker processes. They start, build their plan and say ready before t0 is
    chosen, then all start from the one t0 the parent hands them (CLOCK_MONOTONIC is
    shared by every process on the host), so slow process start-up is never schedule lag."""

    start_delay_ns = 300_000_000

    def __init__(self, config: RunConfig, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.q: Any = ctx.Queue()
        self.go = ctx.Event()
        self.t0: Any = ctx.Value("q", 0)
        self.procs = [ctx.Process(target=_proc_main, args=(config, i, n, self.q, self.go, self.t0),
                                  name=f"replay-worker-{i}") for i in range(n)]
        for p in self.procs:
            p.start()
        self.results: dict[int, WorkerSummary] = {}
        self.failures: list[str] = []

    @classmethod
    def start(cls, config: RunConfig, n: int) -> LocalProcessPool:
        pool = cls(config, n)
        pool.wait_ready()
        return pool

    @property
    def size(self) -> int:
        return self.n

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(ready) < self.n:
            try:
                kind, shard, payload = self.q.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.stop()
                    raise AgentReplayError(f"worker processes did not start: {', '.join(dead) or 'timeout'}") from None
                continue
            if kind == "ready":
                ready.add(shard)
            elif kind == "error":
                self.stop()
                raise AgentReplayError(payload)

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)

    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        assert config.t0_ns is not None
        self.t0.value = config.t0_ns
        self.go.set()
        n, procs, results, failures = self.n, self.procs, self.results, self.failures
        try:
            while len(results) + len(failures) < n:
                try:
                    kind, shard, payload = self.q.get(timeout=0.5)
                except queue.Empty:
                    dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead and self.q.empty():
                        failures.extend(f"worker {p.name} exited with code {p.exitcode}" for p in dead
                                        if f"worker {p.name} exited with code {p.exitcode}" not in failures)
                        if len(results) + len(failures) >= n:
                            break
                    continue
                if kind == "progress":
                    feed.update(payload)
                elif kind == "done":
                    results[shard] = payload
                elif kind == "error":
                    failures.append(payload)
        except KeyboardInterrupt:
            # A Ctrl-C at a terminal reached the workers too; a SIGTERM to this process did
            # not: pass it on. Then let them write what they have.
            if sigterm_received():
                for p in procs:
                    if p.is_alive() and p.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p.pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while len(results) < n and time.monotonic() < deadline:
                try:
                    kind, shard, payload = self.q.get(timeout=0.5)
                except queue.Empty:
                    if not any(p.is_alive() for p in procs):
                        break
                    continue
                if kind == "done":
                    results[shard] = payload
            for p in procs:
                p.join(timeout=5)
            raise
        for p in procs:
            p.join(timeout=30)
        if failures:
            raise AgentReplayError("; ".join(failures))
        return self.arrived()

    def arrived(self) -> list[WorkerSummary]:
        return [self.results[i] for i in sorted(self.results)]

    def close(self) -> None:
        """Nothing to end: ``run`` joined the workers, and one still writing its last rows
        after a stop is left to finish (multiprocessing joins it when this process exits)."""


def _proc_main(config: RunConfig, shard: int, n: int, q: Any, go: Any, t0: Any) -> None:
    from agent_replay.replay.worker import load_plan

    parent = os.getppid()
    die_with_parent(signal.SIGINT, parent)  # a parent killed outright: stop as on Ctrl-C
    try:
        plan = load_plan(config)
        q.put(("ready", shard, None))
        go.wait()
        if config.worker_cpus:
            pin_loop_thread(config.worker_cpus, shard)
        summary = run_shard(replace(config, t0_ns=int(t0.value)), shard, n, q, plan=plan)
        if parent_alive(parent):
            q.put(("done", shard, summary))
    except KeyboardInterrupt:
        pass
    except AgentReplayError as exc:
        q.put(("error", shard, f"worker {shard}: {exc}"))
    except Exception as exc:
        q.put(("error", shard, f"worker {shard}: {type(exc).__name__}: {exc}"))
    finally:
        # The work is over: a parent's death from here on (its SIGINT) must not break the
        # exit half-way through the queue's own finalizers, which would then wait forever.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not parent_alive(parent):  # nobody reads the queue: do not wait to flush it
            q.cancel_join_thread()
