"""Pure parts of the Ray backend: where actors go, how a remote node finds the run's t0, and
which sessions a dead actor left unfinished. No Ray import, no clock, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_replay.errors import InputError
from agent_replay.replay.plan import Plan


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    host: str
    cpus: float


@dataclass(frozen=True)
class ActorSpec:
    shard: int
    node_id: str
    host: str
    num_cpus: float


def alive_nodes(ray_nodes: Iterable[Mapping[str, Any]]) -> list[NodeInfo]:
    """The nodes of ``ray.nodes()`` that are alive and offer CPUs, in a stable order."""
    out = []
    for n in ray_nodes:
        cpus = float(n.get("Resources", {}).get("CPU", 0.0))
        if n.get("Alive") and cpus > 0:
            out.append(NodeInfo(str(n["NodeID"]), str(n.get("NodeManagerAddress", "?")), cpus))
    return sorted(out, key=lambda x: (x.host, x.node_id))


def place(nodes: Sequence[NodeInfo], per_node: int) -> list[ActorSpec]:
    """``per_node`` actors on every node, shards dealt round-robin over the nodes (so shard
    0 and 1 land on different nodes). Each actor asks for at most one CPU and never for more
    than its share of the node, so every actor can be scheduled."""
    if per_node < 1:
        raise InputError(f"--ray-actors-per-node must be >= 1, got {per_node}")
    if not nodes:
        raise InputError("the Ray cluster has no alive node with CPUs")
    specs: list[ActorSpec] = []
    for _ in range(per_node):
        for node in nodes:
            share = min(1.0, node.cpus / per_node)
            specs.append(ActorSpec(len(specs), node.node_id, node.host, round(share, 4)))
    return specs


def rebase_t0(t0_wall_ns: int, now_wall_ns: int, now_mono_ns: int) -> int:
    """The run's start on this host's CLOCK_MONOTONIC, from the start on the wall clock.
    Monotonic clocks of two hosts are unrelated; wall clocks agree to NTP accuracy."""
    return now_mono_ns + (t0_wall_ns - now_wall_ns)


@dataclass
class Lost:
    """What one dead actor did not finish."""

    shard: int
    host: str
    reason: str
    planned_requests: int
    recorded_requests: int
    sessions: list[dict[str, Any]]
    """One entry per session not fully recorded: key, planned and recorded requests."""

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "host": self.host,
            "reason": self.reason,
            "planned_requests": self.planned_requests,
            "recorded_requests": self.recorded_requests,
            "sessions": self.sessions,
        }

    def line(self) -> str:
        return (
            f"Ray actor for shard {self.shard} on {self.host} died ({self.reason}): "
            f"{len(self.sessions)} sessions not completed, "
            f"{self.planned_requests - self.recorded_requests} of {self.planned_requests} "
            "requests not recorded; listed in run.json under ray.lost"
        )


def lost_sessions(
    shard_plan: Plan, recorded: Mapping[str, int], shard: int, host: str, reason: str
) -> Lost:
    """Compare a dead shard's plan with the rows it left (``recorded``: rows per session
    key) and list every session that is not complete."""
    sessions = []
    planned_total = 0
    recorded_total = 0
    for s in shard_plan.sessions:
        planned = len(s.requests)
        got = min(int(recorded.get(s.key, 0)), planned)
        planned_total += planned
        recorded_total += got
        if got < planned:
            sessions.append({"session": s.key, "planned": planned, "recorded": got})
    return Lost(shard, host, reason, planned_total, recorded_total, sessions)


def session_key(session_id: str, clone: int) -> str:
    """The plan's session key for a results row (see ``PlannedSession.key``)."""
    return session_id if clone == 0 else f"{session_id}#{clone}"
