"""Agent trees (trace schema v2): which stream a request belongs to and what it waits for.

A session is a tree of agent streams: the main agent (``MAIN``) and its subagents. Each
request names its stream (``agent_id``) and the requests of its session that must have
completed before its think time starts (``depends_on``, request indices): the previous turn
of its stream; for a subagent's first turn, the turn that spawned it; for a turn after a
join, the last turn of every subagent it waited for.

``tree_columns`` gives every table both columns (v1 files and v2 rows without them: agent
``main``, depends on the prefix parent, so a v1 trace replays exactly as before).
``derive_depends_on`` derives the dependencies from streams and times alone, as AIPerf does
for AgentX traces; importers and the recorder share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAIN = "main"
"""``agent_id`` of the main agent's stream."""

AGENT_TYPE = pa.dictionary(pa.int32(), pa.string())
DEPENDS_TYPE = pa.list_(pa.int32())


def default_depends_on(parent_index: np.ndarray) -> pa.ListArray:
    """The v1 meaning as a column: ``[parent_index]``, or ``[]`` for a root."""
    parent = np.asarray(parent_index, dtype=np.int64)
    has = parent >= 0
    offsets = np.zeros(parent.size + 1, dtype=np.int32)
    np.cumsum(has, out=offsets[1:])
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(parent[has].astype(np.int32), pa.int32())
    )


def tree_columns(table: pa.Table) -> pa.Table:
    """``table`` with ``agent_id`` and ``depends_on`` present and non-null; missing or null
    values get the v1 meaning. Other columns are untouched."""
    n = table.num_rows
    if "agent_id" in table.column_names:
        col = table.column("agent_id")
        if col.null_count:
            col = pc.fill_null(col.cast(pa.string()), MAIN).dictionary_encode()
        table = table.set_column(
            table.schema.get_field_index("agent_id"), "agent_id", col.cast(AGENT_TYPE)
        )
    else:
        table = table.append_column(
            pa.field("agent_id", AGENT_TYPE), pa.array([MAIN] * n, pa.string()).dictionary_encode()
        )
    parent = table.column("parent_index").to_numpy()
    if "depends_on" in table.column_names:
        col = table.column("depends_on").combine_chunks().cast(DEPENDS_TYPE)
        if col.null_count:
            col = pc.if_else(pc.is_null(col), default_depends_on(parent), col)
        table = table.set_column(table.schema.get_field_index("depends_on"), "depends_on", col)
    else:
        table = table.append_column(
            pa.field("depends_on", DEPENDS_TYPE), default_depends_on(parent)
        )
    return table


def derive_depends_on(
    agent_ids: Sequence[str],
    arrivals: Sequence[int],
    ends: Sequence[int | None],
    *,
    spawner: Mapping[str, str] | None = None,
    spawn_at: Mapping[str, int] | None = None,
    agent_end: Mapping[str, int] | None = None,
) -> list[list[int]]:
    """Dependencies (positions in the input) of one session's requests, given in arrival
    order, from their streams and times alone (AIPerf's AgentX rules). ``arrivals`` are
    times on one clock, ``ends`` durations from arrival (the ``end_ns`` column), both ns:

    * a turn depends on the previous turn of its stream;
    * a subagent's first turn depends on the last turn of its spawner (``spawner``, default
      ``MAIN``) that arrived at or before the spawn (``spawn_at``, default the subagent's
      first arrival); none: the subagent starts as a root;
    * the first later spawner turn arriving at or after the subagent's end (``agent_end``,
      default its last turn's end, or last arrival when the end is unknown) joins it: it
      also depends on the subagent's last turn. A subagent that outlives every later
      spawner turn has no join (a background branch).
    """
    spawner = spawner or {}
    spawn_at = spawn_at or {}
    n = len(agent_ids)
    deps: list[list[int]] = [[] for _ in range(n)]
    turns = _streams(agent_ids)
    for a, idx in turns.items():
        for prev, cur in pairwise(idx):
            deps[cur].append(prev)
        if a == MAIN and a not in spawner:
            continue
        _spawn_and_join(
            idx,
            turns.get(spawner.get(a, MAIN), []),
            arrivals,
            spawn_at.get(a, arrivals[idx[0]]),
            _stream_end(a, idx, arrivals, ends, agent_end),
            deps,
        )
    for d in deps:
        d.sort()
    return deps


def _streams(agent_ids: Sequence[str]) -> dict[str, list[int]]:
    """Agent -> the positions of its turns, in order of first turn."""
    turns: dict[str, list[int]] = {}
    for i, a in enumerate(agent_ids):
        turns.setdefault(a, []).append(i)
    return turns


def _stream_end(
    a: str,
    idx: list[int],
    arrivals: Sequence[int],
    ends: Sequence[int | None],
    agent_end: Mapping[str, int] | None,
) -> int:
    """When stream ``a`` (its turns: ``idx``) ends: as given, else its last turn's end, or
    that turn's arrival when its end is unknown."""
    if agent_end is not None and a in agent_end:
        return agent_end[a]
    return arrivals[idx[-1]] + (ends[idx[-1]] or 0)


def _spawn_and_join(
    idx: list[int],
    parent_turns: list[int],
    arrivals: Sequence[int],
    t_spawn: int,
    t_end: int,
    deps: list[list[int]],
) -> None:
    """Link a subagent's turns ``idx`` to its spawner's turns: its first turn depends on
    the spawner's last turn before it that arrived by ``t_spawn``; the spawner's first
    later turn arriving at or after ``t_end`` depends on its last turn."""
    spawn = [p for p in parent_turns if p < idx[0] and arrivals[p] <= t_spawn]
    if spawn:
        deps[idx[0]].append(spawn[-1])
    last = idx[-1]
    join = next((p for p in parent_turns if p > last and arrivals[p] >= t_end), None)
    if join is not None:
        deps[join].append(last)


def think_after(
    arrival: int, deps: Sequence[int], arrivals: Sequence[int], ends: Sequence[int | None]
) -> int | None:
    """The gap from the latest dependency's last byte to ``arrival`` (floored at 0); None
    when there is no dependency or one's duration is unknown. ``ends`` are durations from
    arrival."""
    if not deps:
        return None
    latest = 0
    for d in deps:
        e = ends[d]
        if e is None:
            return None
        latest = max(latest, arrivals[d] + e)
    return max(0, arrival - latest)
