"""Messages from a worker to the parent that runs it, as values.

A worker reports ``Progress`` about twice a second and once at its end: through a
multiprocessing queue (local processes), a direct call (one worker in the parent's
process) or a Ray actor's ``poll`` (``ActorPoll``). Each is a frozen dataclass so a
reader gets named, typed fields and a missing one fails where it is built, not where it is
read. Both pickle (queues and Ray move them between processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_replay.replay.worker import WorkerSummary


@dataclass(frozen=True)
class Progress:
    """One worker's counters at ``elapsed_ns`` since t0; ``cpu`` is its CPU share since its
    previous message, ``loop_lags`` the event-loop lag samples (ns) taken since then;
    ``held_rows`` and ``write_error`` say that its part files cannot be written now."""

    shard: int
    elapsed_ns: int
    total: int
    sent: int
    done: int
    skipped: int
    in_flight: int
    sessions: int
    ok: int
    errors: int
    chunks: int
    output_tokens: int
    cpu: float
    loop_lags: tuple[int, ...] = ()
    held_rows: int = 0  # rows whose part file could not be written yet (kept, retried)
    write_error: str | None = None  # why, while writes fail


@dataclass(frozen=True)
class ActorPoll:
    """A Ray worker actor's answer to ``poll``: its last progress, the part files written
    since the previous poll (name, bytes) when it ships them, its cumulative LiveStats
    snapshot, and once ``done`` its summary or the error that ended it."""

    progress: Progress | None
    parts: list[tuple[str, bytes]]
    snapshot: bytes
    done: bool
    summary: WorkerSummary | None = None
    error: str | None = None
