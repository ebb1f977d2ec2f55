"""Replay beyond one host: shards of the plan on Ray actors (``RayPool``, a
``replay.pools.WorkerPool``), each running the same worker code as local ``--workers``.
``ray`` is an optional extra, imported only when a pool starts."""

from __future__ import annotations

from agent_replay.replay.distributed.backend import RayPool, import_ray
from agent_replay.replay.distributed.placement import (
    ActorSpec,
    Lost,
    NodeInfo,
    lost_sessions,
    place,
    rebase_t0,
)

__all__ = [
    "ActorSpec",
    "Lost",
    "NodeInfo",
    "RayPool",
    "import_ray",
    "lost_sessions",
    "place",
    "rebase_t0",
]
