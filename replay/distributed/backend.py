"""Driver side of the Ray backend, a ``replay.pools.WorkerPool``: ``RayPool.start(config,
plan)`` connects to a cluster, places ``actors_per_node`` shard actors on every alive node
and loads their plans; then ``pool.run(config, feed)`` starts them all on the run's t0 and
gathers progress, part files, live snapshots (merged here: the dashboard gets one stream)
and summaries until every shard finished or died.

A dead actor (node lost, process killed, out of memory) does not stop the run: the other
shards go on, and the dead shard's sessions that were not fully recorded are listed
(``pool.lost``, written to run.json under ``ray.lost``, and printed). Its rows written before
it died are kept (parts already handed over, or written in place on the driver's node).

A driver killed outright: the actors that write in place (on the driver's node, or on a
shared filesystem) are detached, so that Ray does not kill them with their owner; they see
the driver gone, stop their shards, write their rows and run.json (``interrupted``) and end
(``actor.ShardActor``). The others are Ray's to end with their owner: their part files not
yet handed over cannot reach the results folder any more. ``--ray=local``'s private Ray
waits for them before it ends (``localray``).

``ray`` is imported here and nowhere else; without it, one line says how to install it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from agent_replay.analysis.live import LiveStats
from agent_replay.errors import AgentReplayError, InputError, TargetError
from agent_replay.replay.config import RunConfig
from agent_replay.replay.distributed.localray import NAMESPACE, LocalRay, connect_local
from agent_replay.replay.distributed.placement import (
    ActorSpec,
    Lost,
    alive_nodes,
    lost_sessions,
    place,
    session_key,
)
from agent_replay.replay.messages import ActorPoll, Progress
from agent_replay.replay.plan import Plan
from agent_replay.replay.worker import WorkerSummary
from agent_replay.results_schema import ErrorKind
from agent_replay.traces.io import trace_files

if TYPE_CHECKING:
    from agent_replay.replay.feed import ProgressFeed

POLL_S = 0.5
Report = Callable[[Progress], None]
Snapshot = Callable[[bytes], None]


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(
            "--ray needs the ray extra: pip install 'agent-replay[ray]' "
            "(or pip install 'ray[default]')"
        ) from None
    return ray


@dataclass
class _Slot:
    spec: ActorSpec
    handle: Any
    host: str = "?"
    same_node: bool = True
    requests: int = 0
    summary: WorkerSummary | None = None
    snapshot: bytes = b""
    dead: str | None = None
    pending: Any = None
    stopped: bool = False

    @property
    def running(self) -> bool:
        """Neither reported nor dead."""
        return self.summary is None and self.dead is None


@dataclass
class RayPool:
    ray: Any
    slots: list[_Slot]
    driver_node: str
    output: Path
    plan: Plan
    lost: list[Lost] = field(default_factory=list)
    parts_received: int = 0
    bytes_received: int = 0
    on_snapshot: Snapshot | None = None
    start_delay_ns: int = 1_000_000_000
    interrupted: bool = False
    connected_here: bool = False
    keeper: LocalRay | None = None  # --ray=local: the private Ray's process
    warn: Callable[[str], None] | None = None  # a line for each actor lost
    feeds_snapshots = True  # the actors' snapshots, merged here, are the dashboard's
    meters_host = False  # the actors run on other hosts too: this host's CPU says nothing

    # -- setup ---------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        config: RunConfig,
        plan: Plan,
        address: str | None = None,
        actors_per_node: int = 1,
        ship: str = "auto",
        warn: Callable[[str], None] | None = None,
    ) -> RayPool:
        """Connect (``address``: ``auto`` = RAY_ADDRESS or the running local cluster,
        ``local`` = start a private one-node Ray here, else ``HOST:PORT`` or ``ray://...``),
        place the actors and load their plans. ``ship``: ``auto`` (part files travel back
        from nodes other than the driver's), ``always`` or ``never`` (a shared filesystem)."""
        ray = import_ray()
        if ship not in ("auto", "always", "never"):
            raise InputError(f"ship must be auto, always or never, got {ship!r}")
        connected_here, keeper = _connect(ray, address or "auto", config.write_retry_s)
        pool = cls(
            ray,
            [],
            "",
            Path(config.output or "."),
            plan,
            connected_here=connected_here,
            keeper=keeper,
            warn=warn,
        )
        try:
            pool.driver_node = str(ray.get_runtime_context().get_node_id())
            specs = place(alive_nodes(ray.nodes()), actors_per_node)
            pool._create(config, specs, ship)
            pool._load(config, ship)
        except BaseException:
            pool.close()
            raise
        return pool

    def _create(self, config: RunConfig, specs: list[ActorSpec], ship: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from agent_replay.replay.distributed.actor import ShardActor, driver_identity

        remote = self.ray.remote(ShardActor)
        driver = driver_identity(self.ray)
        for spec in specs:
            strategy = NodeAffinitySchedulingStrategy(node_id=spec.node_id, soft=False)
            in_place = not _ships(ship, spec.node_id == self.driver_node)
            handle = remote.options(
                num_cpus=spec.num_cpus,
                scheduling_strategy=strategy,
                max_restarts=0,
                name=f"agent-replay-{config.run_id}-{spec.shard}",
                namespace="agent-replay",
                lifetime="detached" if in_place else None,
            ).remote(driver)
            self.slots.append(_Slot(spec, handle))

    def _load(self, config: RunConfig, ship: str) -> None:
        n = len(self.slots)
        infos = self._get([s.handle.info.remote() for s in self.slots], "start")
        blob: Any = None
        sends = []
        for slot, info in zip(self.slots, infos, strict=True):
            slot.host = str(info["host"])
            slot.same_node = info["node_id"] == self.driver_node
            shipping = _ships(ship, slot.same_node)
            files = None
            if shipping and not slot.same_node:
                if blob is None:
                    blob = self.ray.put(
                        [(f.name, f.read_bytes()) for f in trace_files(config.trace)]
                    )
                files = blob
            sends.append(slot.handle.prepare.remote(config, slot.spec.shard, n, shipping, files))
        for slot, k in zip(self.slots, self._get(sends, "load the plan"), strict=True):
            slot.requests = int(k)

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        try:
            return list(self.ray.get(refs, timeout=300))
        except Exception as exc:
            self.close()
            raise AgentReplayError(
                f"Ray actors could not {what}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None

    @property
    def size(self) -> int:
        return len(self.slots)

    def describe(self) -> dict[str, Any]:
        """run.json's ``ray`` block: where every shard ran and what was lost."""
        return {
            "ray": {
                "actors": [
                    {
                        "shard": s.spec.shard,
                        "host": s.host,
                        "node_id": s.spec.node_id,
                        "num_cpus": s.spec.num_cpus,
                        "ships_parts": not s.same_node,
                        "requests": s.requests,
                        "dead": s.dead,
                    }
                    for s in self.slots
                ],
                "parts_received": self.parts_received,
                "bytes_received": self.bytes_received,
                "lost": [x.to_json() for x in self.lost],
            }
        }

    # -- the run -------------------------------------------------------------------------
    def run(self, config: RunConfig, feed: ProgressFeed) -> list[WorkerSummary]:
        """Start every shard at ``config.t0_ns`` and wait for all of them; the merged
        snapshots go to ``feed``'s dashboard. Ctrl-C stops the shards and collects what they
        wrote: the dead shards' summaries follow the finished ones'."""
        if feed.dashboard is not None:
            self.on_snapshot = lambda snap: feed.live(0, snap)
        return self._run(config, feed.update, self.warn)

    def arrived(self) -> list[WorkerSummary]:
        return [s.summary for s in self.slots if s.summary is not None]

    def _run(
        self, config: RunConfig, report: Report | None, warn: Callable[[str], None] | None
    ) -> list[WorkerSummary]:
        assert config.t0_ns is not None
        self._start(config.t0_ns, warn)
        try:
            while any(s.running for s in self.slots):
                self._poll_round(report, warn)
        except KeyboardInterrupt:
            self._stop(report, warn)
            self.interrupted = True
        finally:
            self._merge_live()
        return self.arrived() + [self._lost_summary(x) for x in self.lost]

    def _start(self, t0_ns: int, warn: Callable[[str], None] | None) -> None:
        """Every shard told to start at ``t0_ns``; one that does not answer is dead."""
        wall_t0 = time.time_ns() + (t0_ns - time.monotonic_ns())
        starts = [s.handle.start.remote(t0_ns, wall_t0, s.same_node) for s in self.slots]
        for slot, ref in zip(self.slots, starts, strict=True):
            try:
                self.ray.get(ref, timeout=60)
            except Exception as exc:
                self._died(slot, exc, warn)

    def _stop(self, report: Report | None, warn: Callable[[str], None] | None) -> None:
        """Every running shard told to stop, then polled for up to 30 s for what it wrote."""
        for s in self.slots:
            if s.running:
                s.handle.stop.remote()
                s.stopped = True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(s.running for s in self.slots):
            self._poll_round(report, warn)

    def _poll_round(self, report: Report | None, warn: Callable[[str], None] | None) -> None:
        live = [s for s in self.slots if s.running]
        for s in live:
            if s.pending is None:
                s.pending = s.handle.poll.remote()
        refs = [s.pending for s in live]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
        ready_set = set(ready)
        for s in live:
            if s.pending in ready_set:
                self._receive(s, report, warn)
        if ready_set:
            self._merge_live()

    def _receive(self, s: _Slot, report: Report | None, warn: Callable[[str], None] | None) -> None:
        """Slot ``s``'s answered poll: taken in, or the slot dead when it failed."""
        ref, s.pending = s.pending, None
        try:
            msg = self.ray.get(ref)
        except Exception as exc:
            self._died(s, exc, warn)
            return
        self._take(s, msg, report)

    def _take(self, s: _Slot, msg: ActorPoll, report: Report | None) -> None:
        for name, data in msg.parts:
            dest = self.output / "requests" / name
            tmp = dest.with_name(f".{name}.tmp")
            tmp.write_bytes(data)
            tmp.replace(dest)
            self.parts_received += 1
            self.bytes_received += len(data)
        s.snapshot = msg.snapshot
        if msg.progress is not None and report is not None:
            report(msg.progress)
        if msg.done:
            if msg.summary is not None:
                s.summary = msg.summary
            else:
                self._died(s, RuntimeError(str(msg.error or "no summary").splitlines()[0]), None)
            s.handle.close.remote()

    def _died(self, s: _Slot, exc: BaseException, warn: Callable[[str], None] | None) -> None:
        if s.dead is not None:
            return
        reason = type(exc).__name__
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if first and "RayActorError" not in reason:
            reason = f"{reason}: {first[:200]}"
        s.dead = reason
        lost = lost_sessions(
            self.plan.shard(s.spec.shard, len(self.slots)),
            self._recorded(s.spec.shard),
            s.spec.shard,
            s.host,
            reason,
        )
        self.lost.append(lost)
        if warn is not None:
            warn(lost.line())

    def _recorded(self, shard: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in sorted((self.output / "requests").glob(f"part-{shard:03d}-*.parquet")):
            t = pq.read_table(f, columns=["session_id", "clone"])
            for sid, clone in zip(
                t.column("session_id").to_pylist(), t.column("clone").to_pylist(), strict=True
            ):
                key = session_key(str(sid), int(clone or 0))
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _lost_summary(self, lost: Lost) -> WorkerSummary:
        """The dead shard as a worker summary: what it recorded, and the rest as failed."""
        ok = 0
        errors: dict[str, int] = {}
        for f in sorted((self.output / "requests").glob(f"part-{lost.shard:03d}-*.parquet")):
            t = pq.read_table(f, columns=["status", "error_kind"])
            for status, kind in zip(
                t.column("status").to_pylist(), t.column("error_kind").to_pylist(), strict=True
            ):
                if status == "ok":
                    ok += 1
                else:
                    errors[kind or ErrorKind.UNKNOWN] = errors.get(kind or ErrorKind.UNKNOWN, 0) + 1
        missing = lost.planned_requests - lost.recorded_requests
        if missing:
            errors["actor_lost"] = errors.get("actor_lost", 0) + missing
        return WorkerSummary(
            shard=lost.shard,
            total=lost.planned_requests,
            sent=lost.recorded_requests,
            done=lost.recorded_requests,
            ok=ok,
            errors=errors,
        )

    def _merge_live(self) -> None:
        if self.on_snapshot is None:
            return
        self.on_snapshot(self.live().encode())

    def live(self) -> LiveStats:
        """The merged live statistics of every shard (latest snapshots)."""
        merged = LiveStats()
        for s in self.slots:
            if s.snapshot:
                merged.merge(LiveStats.decode(s.snapshot))
        return merged

    def close(self) -> None:
        for s in self.slots:
            try:
                self.ray.kill(s.handle)
            except Exception:
                pass
        if self.connected_here:
            self.ray.shutdown()
            self.connected_here = False
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None


def _ships(ship: str, same_node: bool) -> bool:
    """Whether an actor hands its part files over (``ship``), else writes them in place."""
    return ship == "always" or (ship == "auto" and not same_node)


def _connect(ray: Any, address: str, write_retry_s: float) -> tuple[bool, LocalRay | None]:
    """Connect unless this process already is: whether this call connected, and, for
    ``local``, the private Ray it started (``localray``; ``write_retry_s``: its actors'
    time to retry part files)."""
    if ray.is_initialized():
        return False, None
    kwargs: dict[str, Any] = {"log_to_driver": False, "namespace": NAMESPACE}
    with _own_sigterm():
        if address == "local":
            return True, connect_local(ray, write_retry_s, **kwargs)
        try:
            ray.init(address=address, **kwargs)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TargetError(
                f"--ray {address}: cannot connect to a Ray cluster: {first}"
            ) from None
    return True, None


@contextlib.contextmanager
def _own_sigterm() -> Iterator[None]:
    """This process's SIGTERM handler kept: ``ray.init`` replaces it with an exit, which
    would skip the run's graceful stop (``lifeline.sigterm_as_sigint``) and kill the
    actors before they wrote their rows."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
