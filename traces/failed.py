"""Recorded requests that failed (the recorder's ``error`` column): counted for
``traces inspect`` and left out of a replay unless asked for. Pure table functions.

A failed request is not load the agent meant to send: a replay that sent it would
measure the server on traffic that, when recorded, never got a proper answer. Leaving
one out re-links what referred to it: a request whose parent is dropped gets the dropped
request's parent (``parent_index``, and in ``depends_on`` when present), so sessions and
trees stay connected.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def failed_mask(table: pa.Table) -> np.ndarray:
    """True for each row whose ``error`` is set (all False without the column)."""
    if "error" not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    return np.asarray(pc.is_valid(table.column("error")).to_numpy(zero_copy_only=False), dtype=bool)


def failure_causes(table: pa.Table, top: int = 5) -> list[tuple[str, int]]:
    """The most frequent error texts (cut at the first colon-separated detail) and counts."""
    mask = failed_mask(table)
    if not mask.any():
        return []
    errors = table.column("error").to_pylist()
    causes = Counter(str(e).split(":")[0] for e, m in zip(errors, mask, strict=False) if m)
    return causes.most_common(top)


def drop_failed(table: pa.Table) -> tuple[pa.Table, int]:
    """``table`` without its failed rows, and how many were dropped (see the module text).
    A row that waited for a dropped request has its ``think_ns`` measured again from what
    it waits for now (the latest end of its dependencies, else of its parent)."""
    mask = failed_mask(table)
    n = int(mask.sum())
    if n == 0:
        return table, 0
    sids = [str(s) for s in table.column("session_id").to_pylist()]
    idx = [int(i) for i in table.column("request_index").to_pylist()]
    parents = table.column("parent_index").to_pylist()
    dropped: dict[tuple[str, int], int] = {
        (sids[r], idx[r]): int(parents[r]) for r in np.flatnonzero(mask)}

    def live(sid: str, p: int) -> int:
        seen = 0
        while (sid, p) in dropped and seen <= len(dropped):
            p = dropped[(sid, p)]
            seen += 1
        return p

    deps = table.column("depends_on").to_pylist() if "depends_on" in table.column_names \
        else None
    touched = [(s, int(p)) in dropped if p is not None else False
               for s, p in zip(sids, parents, strict=True)]
    new_parent = [live(s, int(p)) if p is not None else p for s, p in zip(sids, parents, strict=True)]
    table = table.set_column(table.schema.get_field_index("parent_index"), "parent_index",
                             pa.array(new_parent, table.schema.field("parent_index").type))
    new_deps: list[list[int] | None] | None = None
    if deps is not None:
        new_deps = []
        for r, (s, d) in enumerate(zip(sids, deps, strict=True)):
            if d is None:
                new_deps.append(None)
                continue
            touched[r] = touched[r] or any((s, int(x)) in dropped for x in d)
            new_deps.append(sorted({live(s, int(x)) for x in d} - {-1}))
        field = table.schema.field("depends_on")
        table = table.set_column(table.schema.get_field_index("depends_on"), "depends_on",
                                 pa.array(new_deps, field.type))
    if {"think_ns", "arrival_ns", "end_ns"} <= set(table.column_names):
        arrival = table.column("arrival_ns").to_pylist()
        end = table.column("end_ns").to_pylist()
        think = table.column("think_ns").to_pylist()
        row_of = {(s, i): r for r, (s, i) in enumerate(zip(sids, idx, strict=True))}
        for r in range(table.num_rows):
            if mask[r] or not touched[r] or think[r] is None:
                continue
            nd = new_deps[r] if new_deps is not None else None
            par = new_parent[r]
            waits: list[int] = nd if nd is not None else (
                [int(par)] if par is not None and par >= 0 else [])
            ends = [arrival[row_of[(sids[r], x)]] + (end[row_of[(sids[r], x)]] or 0)
                    for x in waits if (sids[r], x) in row_of]
            think[r] = max(0, arrival[r] - max(ends)) if ends else None
        table = table.set_column(table.schema.get_field_index("think_ns"), "think_ns",
                                 pa.array(think, table.schema.field("think_ns").type))
    return table.filter(pa.array(~mask)), n
