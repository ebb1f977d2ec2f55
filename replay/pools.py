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
import dataclasses
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_replay.engines import aio
from agent_replay.errors import AgentReplayError
from agent_replay.replay.affinity import pin_loop_thread
from agent_replay.replay.config import RunConfig
from agent_replay.replay.feed import ProgressFeed, Reporter
from agent_replay.replay.folderlock import Shared, held
from agent_replay.replay.journal import recover
from agent_replay.replay.lifeline import (
    ORPHANED,
    StopSignals,
    die_with_parent,
    parent_alive,
    signals_held,
)
from agent_replay.replay.plan import Plan
from agent_replay.replay.results import SpaceReserve, remove_unfinished_parts
from agent_replay.replay.runrecord import RUN_JSON, merge, outcome, write_run_json
from agent_replay.replay.worker import WorkerSummary, arun_shard, run_shard, stoppable
from agent_replay.replay.workercut import WorkerCut
from agent_replay.results_schema import ErrorKind
from agent_replay.runmeta import RunMeta

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
    return LocalProcessPool.start(config, n, plan, warn=warn)


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
    """The one worker on an event loop of this process, with the plan already built.
    While it runs, SIGINT and SIGTERM are one graceful stop (``StopSignals``)."""

    size = 1
    start_delay_ns = 200_000_000

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        if config.worker_cpus:
            pin_loop_thread(config.worker_cpus, 0)
        stop = StopSignals().install()
        try:
            return [
                aio.run(
                    stoppable(arun_shard(config, 0, 1, feed.update, plan=self.plan), stop),
                    config.loop,
                )
            ]
        finally:
            stop.uninstall()

    def arrived(self) -> list[WorkerSummary]:
        return []  # the one summary is run's return value

    def close(self) -> None:
        pass


STOP_WAIT_S = 30.0
"""After a stop, how long the workers get to end their in-flight requests, beyond the time
their writers may retry part files (``RunConfig.write_retry_s``); then they are killed."""


_TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


def _start_quiet_tracker() -> None:
    """Start multiprocessing's resource tracker (it removes the pool's semaphores once
    this process is gone) without its warning about "leaked" semaphores: after this
    process was killed the workers write the run's end, and that warning would be the
    last line the user sees, about a clean-up that is expected and done. The tracker takes
    its warning filters from this process's ``-W`` options when it starts; they are set
    for that moment only."""
    from multiprocessing import resource_tracker

    sys.warnoptions.append(_TRACKER_QUIET)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(_TRACKER_QUIET)


class LocalProcessPool(_OnThisHost):
    """Local worker processes. They start, build their plan and say ready before t0 is
    chosen, then all start from the one t0 the parent hands them (CLOCK_MONOTONIC is
    shared by every process on the host), so slow process start-up is never schedule lag.

    A stop (SIGINT or SIGTERM to this process, or to the group) is passed to every worker
    once; they end their in-flight requests as ``cancelled``, write their rows and report.
    A worker stopped alone (a signal to it only) stops the run the same way, and so does
    one that dies (``kill -9``): the pool sees the death within ``POLL_S`` and cuts the run
    short as interrupted, naming the shard (``workers_cut`` in run.json). A worker that
    ends without a report (stopped before it could send one, killed) is counted from its
    part files, with the rows of its row journal that no part file has (``replay.journal``).
    None outlives the pool: each watches this process and stops when it dies, and ``close``
    kills what is left."""

    start_delay_ns = 300_000_000

    def __init__(
        self, config: RunConfig, n: int, plan: Plan | None = None, warn: Reporter | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        _start_quiet_tracker()
        self.n = n
        self.out = Path(config.output or ".")
        self.write_retry_s = config.write_retry_s
        self.planned = (
            [plan.shard(i, n).n_requests for i in range(n)] if plan is not None else [0] * n
        )
        self.q: Any = ctx.Queue()
        self.go = ctx.Event()
        self.t0: Any = ctx.Value("q", 0)
        lock = held(self.out)  # the workers share the results folder's lock (replay.folderlock)
        shared = lock.share() if lock is not None else None
        self.procs = [
            ctx.Process(
                target=_proc_main,
                args=(config, i, n, self.q, self.go, self.t0, shared),
                name=f"replay-worker-{i}",
            )
            for i in range(n)
        ]
        self.results: dict[int, WorkerSummary] = {}
        self.failures: list[str] = []
        self.warn = warn
        self.cut: dict[int, WorkerCut] = {}  # workers that died without a report
        self.stopped_alone: int | None = None  # a worker stopped by a signal of its own
        try:
            with signals_held():  # a stop during their start-up waits for their handlers
                for p in self.procs:
                    p.start()
        except BaseException:  # a Ctrl-C meanwhile: delivered as the block ends
            # The workers still read their start-up state from this process: it must not
            # exit (and remove their semaphores) before they have.
            self.stop(grace_s=0.0)
            raise

    @classmethod
    def start(
        cls, config: RunConfig, n: int, plan: Plan | None = None, warn: Reporter | None = None
    ) -> LocalProcessPool:
        pool = cls(config, n, plan, warn)
        try:
            pool.wait_ready()
        except BaseException:
            pool.stop()
            raise
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
                    raise AgentReplayError(
                        f"worker processes did not start: {', '.join(dead) or 'timeout'}"
                    ) from None
                continue
            if kind == "ready":
                ready.add(shard)
            elif kind == "error":
                raise AgentReplayError(payload)

    def stop(self, grace_s: float = 0.0) -> None:
        """End every worker: the ones still running after ``grace_s`` get SIGTERM, then
        SIGKILL if they do not end within 5 s."""
        deadline = time.monotonic() + grace_s
        started = [p for p in self.procs if p.pid is not None]
        for p in started:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        assert config.t0_ns is not None
        self.t0.value = config.t0_ns
        stop = StopSignals().install()  # a stop sets a flag: no exception inside a queue read
        stop.arm(lambda: None)
        try:
            self.go.set()
            self._collect(feed, stop, None)
            if stop.requested or self.halted:
                self._pass_on_stop()
                self._collect(None, None, time.monotonic() + STOP_WAIT_S + self.write_retry_s)
        finally:
            self._end()
            stop.uninstall()
        if stop.requested or self.halted:
            raise KeyboardInterrupt
        if self.failures:
            raise AgentReplayError("; ".join(self.failures))
        return self.arrived()

    def _collect(
        self, feed: ProgressFeed | None, stop: StopSignals | None, deadline: float | None
    ) -> None:
        """Read the workers' messages until each has reported or ended, a stop is asked
        for (``stop``) or ``deadline`` passes."""
        while len(self.results) < self.n and not self._leave(stop, deadline):
            try:
                kind, shard, payload = self.q.get(timeout=POLL_S)
            except queue.Empty:
                self._watch()
                if self._silent_gone():
                    return  # the ones without a report are gone, and so is what they sent
                continue
            self._watch()
            if kind == "progress":
                if feed is not None:
                    feed.update(payload)
            elif kind == "done":
                self._done(shard, payload, stop)
            elif kind == "error":
                self.failures.append(payload)
                self.results.setdefault(
                    shard, WorkerSummary(shard=shard, total=self.planned[shard])
                )

    def _leave(self, stop: StopSignals | None, deadline: float | None) -> bool:
        """A stop was asked for (with ``stop``) or the run halted, or ``deadline`` passed."""
        if stop is not None and (stop.requested or self.halted):
            return True
        return deadline is not None and time.monotonic() > deadline

    def _silent_gone(self) -> bool:
        """Every worker that has not reported has ended."""
        return all(not p.is_alive() or i in self.results for i, p in enumerate(self.procs))

    def _done(self, shard: int, summary: WorkerSummary, stop: StopSignals | None) -> None:
        """A worker's report; one interrupted by a signal to it alone stops the run."""
        self.results[shard] = summary
        if (
            summary.interrupted
            and stop is not None
            and not stop.requested
            and self.stopped_alone is None
        ):
            self.stopped_alone = shard  # a signal to that worker only: stop them all
            if self.warn is not None:
                self.warn(
                    f"worker {shard} (shard {shard} of {self.n}) was stopped: stopping the run"
                )

    @property
    def halted(self) -> bool:
        """A worker died or was stopped alone: the run stops."""
        return bool(self.cut) or self.stopped_alone is not None

    def _watch(self) -> None:
        """Note the workers that died without a report (a non-zero exit: killed)."""
        for i, p in enumerate(self.procs):
            if i in self.results or i in self.cut:
                continue
            code = p.exitcode
            if code is None or code == 0:
                continue  # running, or ended with its report on its way
            cut = WorkerCut(i, self.n, code, time.monotonic_ns(), int(self.t0.value))
            self.cut[i] = cut
            if self.warn is not None:
                self.warn(f"error: {cut.line()}: stopping the run")

    def _pass_on_stop(self) -> None:
        """SIGINT to every worker: a Ctrl-C at a terminal reached them already (they take a
        stop once), a signal to this process alone did not."""
        for p in self.procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)

    def _end(self) -> None:
        """Every worker ended; the ones that sent no report counted from their part files."""
        self._watch()  # a death before the workers are stopped here is a cut, not a failure
        self.stop(grace_s=5.0)
        for i, p in enumerate(self.procs):
            if i in self.results:
                continue
            cut = self.cut.get(i)
            if cut is None and p.exitcode not in (0, None) and p.exitcode != -signal.SIGINT:
                self.failures.append(f"worker {p.name} exited with code {p.exitcode}")
            recovered = 0
            with contextlib.suppress(OSError, ValueError):
                recovered = recover(self.out, i, int(self.t0.value))
            s = summary_from_parts(self.out, i, self.planned[i])
            if cut is not None:
                cut.rows, cut.recovered = s.done, recovered
                s.cut = cut.summary_line()
            self.results[i] = s

    def arrived(self) -> list[WorkerSummary]:
        return [self.results[i] for i in sorted(self.results)]

    def describe(self) -> dict[str, Any]:
        """run.json's ``workers_cut`` (the workers that died mid-run) and
        ``stopped_by_worker`` (the shard whose own stop signal stopped the run); neither
        when nothing of the kind happened."""
        out: dict[str, Any] = {}
        if self.cut:
            out["workers_cut"] = [c.record() for _, c in sorted(self.cut.items())]
        if self.stopped_alone is not None:
            out["stopped_by_worker"] = self.stopped_alone
        return out

    def close(self) -> None:
        """End any worker still running (a start or run that failed half-way)."""
        self.stop()


POLL_S = 0.2
"""How often the pool looks for a worker that died (at most: it also looks at each message)."""


def summary_from_parts(out: Path, shard: int, planned: int) -> WorkerSummary:
    """What a worker that ended without its report recorded, counted from its part files:
    its totals then match its rows. Marked interrupted."""
    import pyarrow.parquet as pq

    s = WorkerSummary(shard=shard, total=planned, interrupted=True)
    for f in sorted((out / "requests").glob(f"part-{shard:03d}-*.parquet")):
        try:
            cols = pq.read_table(f, columns=["status", "error_kind"]).to_pydict()
        except (OSError, ValueError):
            continue
        for status, kind in zip(cols["status"], cols["error_kind"], strict=True):
            s.sent += 1
            s.done += 1
            if status == "ok":
                s.ok += 1
            else:
                k = kind or ErrorKind.UNKNOWN
                s.errors[k] = s.errors.get(k, 0) + 1
    return s


PARENT_DIED = "parent_died"
"""run.json's block written by the workers of a run whose process died (``record_orphaned``)."""


def _summary_fields(summary: WorkerSummary) -> dict[str, Any]:
    """A worker's summary as run.json keeps it (its encoded samples left out)."""
    return {
        f.name: getattr(summary, f.name)
        for f in dataclasses.fields(summary)
        if not isinstance(getattr(summary, f.name), bytes)
    }


def _shard_summaries(
    out: Path, plan: Plan | None, n: int, shards: dict[str, Any]
) -> list[WorkerSummary]:
    """Each shard's summary: the one it recorded, else counted from its part files."""
    planned = [plan.shard(i, n).n_requests if plan is not None else 0 for i in range(n)]
    return [
        WorkerSummary(**shards[str(i)])
        if str(i) in shards
        else summary_from_parts(out, i, planned[i])
        for i in range(n)
    ]


def _orphan_error(pid: Any, counted: list[int]) -> str:
    return (
        f"the run's process{f' (pid {pid})' if pid else ''} died while its "
        "workers ran; they stopped, wrote their rows and this record"
        + (
            f" (workers {', '.join(map(str, counted))} counted from their part files)"
            if counted
            else ""
        )
    )


def record_orphaned(
    out: Path,
    config: RunConfig,
    plan: Plan | None,
    shard: int,
    n: int,
    summary: WorkerSummary | None,
) -> bool:
    """run.json of a run whose process died (killed outright) while its workers ran, as
    the workers see it once they have stopped and written their rows: status
    ``interrupted``, totals merged from the summaries of the workers that got this far
    (kept in the ``parent_died`` block) and, for the others, counted from their part files.
    Each worker calls it on its way out, under a lock on the results folder, so the last
    one out writes totals that match every row on disk. It does nothing where the run's
    process wrote its end first, or wrote no run.json (stopped before t0). Returns whether
    it wrote run.json."""
    import fcntl

    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            meta = json.loads((out / RUN_JSON).read_text())
        except (OSError, ValueError):
            return False
        block = meta.get(PARENT_DIED)
        if not isinstance(block, dict):
            if meta.get("status") != "running":
                return False  # the run's process recorded its end itself
            block = {"process": meta.get("writer"), "shards": {}}
        shards: dict[str, Any] = block.setdefault("shards", {})
        if summary is not None:
            shards[str(shard)] = _summary_fields(summary)
        ws = _shard_summaries(out, plan, n, shards)
        counted = [i for i in range(n) if str(i) not in shards]
        block["counted_from_rows"] = counted
        meta.update(outcome(merge(str(out), ws, config, interrupted=True)))
        meta["status"] = "interrupted"
        meta["error"] = _orphan_error((meta.get("writer") or {}).get("pid"), counted)
        meta[PARENT_DIED] = block
        if not counted:  # every worker is through: a .tmp left is nobody's write under way
            remove_unfinished_parts(out)
        write_run_json(out, RunMeta.from_json(meta))
        return True
    finally:
        os.close(fd)


def _proc_main(
    config: RunConfig, shard: int, n: int, q: Any, go: Any, t0: Any, lock: Shared | None = None
) -> None:
    """A worker process; ``lock``: the results folder's lock, held until it exits."""
    from agent_replay.replay.worker import load_plan

    parent = os.getppid()
    stop = StopSignals()
    plan: Plan | None = None
    summary: WorkerSummary | None = None
    started = False  # past the start signal: run.json exists, rows may have been written
    try:
        stop.install()  # takes a stop that came while this process started
        die_with_parent(ORPHANED, parent)  # a parent killed outright: stop as on Ctrl-C
        plan = load_plan(config)
        q.put(("ready", shard, None))
        go.wait()
        if config.worker_cpus:
            pin_loop_thread(config.worker_cpus, shard)
        started = True
        summary = run_shard(
            replace(config, t0_ns=int(t0.value)), shard, n, q, plan=plan, stop=stop, journal=True
        )
        if not stop.orphaned and parent_alive(parent):
            q.put(("done", shard, summary))
    except KeyboardInterrupt:
        pass  # stopped before the run started: nothing sent, nothing to report
    except AgentReplayError as exc:
        q.put(("error", shard, f"worker {shard}: {exc}"))
    except Exception as exc:
        q.put(("error", shard, f"worker {shard}: {type(exc).__name__}: {exc}"))
    finally:
        # The work is over: a stop from here on (the parent's SIGINT after a Ctrl-C, its
        # death) only sets flags; it must not break the exit half-way through the queue's
        # own finalizers, which would then wait forever.
        stop.arm(lambda: None)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if not _leave(q, parent, stop):
            leave_orphaned(Path(config.output or "."), config, plan, shard, n, summary, started)


def leave_orphaned(
    out: Path,
    config: RunConfig,
    plan: Plan | None,
    shard: int,
    n: int,
    summary: WorkerSummary | None,
    started: bool,
) -> None:
    """A worker's last step once the run's process is gone (its rows are written): remove
    the space reserve that process can no longer release and, when the worker got past
    t0, rewrite run.json (``record_orphaned``)."""
    with contextlib.suppress(OSError):
        (out / SpaceReserve.NAME).unlink()
    if started:
        with contextlib.suppress(OSError, ValueError, TypeError, AgentReplayError):
            record_orphaned(out, config, plan, shard, n, summary)


def _leave(q: Any, parent: int, stop: StopSignals) -> bool:
    """Let the last messages reach the parent while it lives; once it is gone, give them
    up (nobody reads the queue). Returns whether the parent still lives."""
    q.close()
    feeder = threading.Thread(target=q.join_thread, daemon=True)
    feeder.start()
    while feeder.is_alive() and not stop.orphaned and parent_alive(parent):
        feeder.join(0.1)
    if stop.orphaned or not parent_alive(parent):
        q.cancel_join_thread()
        return False
    return True
