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
from typing import Any

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


class _Relink:
    """The dropped requests of a table, by (session, request index) -> their parent: where
    a reference to one of them leads once they are gone."""

    def __init__(self, dropped: dict[tuple[str, int], int]) -> None:
        self.dropped = dropped

    def hits(self, sid: str, p: int) -> bool:
        return (sid, p) in self.dropped

    def live(self, sid: str, p: int) -> int:
        """The nearest ancestor of request ``p`` not dropped (-1: none)."""
        seen = 0
        while (sid, p) in self.dropped and seen <= len(self.dropped):
            p = self.dropped[(sid, p)]
            seen += 1
        return p

    def parents(self, sids: list[str], parents: list[Any]) -> tuple[list[Any], list[bool]]:
        """(``parent_index`` of every row with the dropped requests replaced by their live
        ancestors, which rows named one)."""
        pairs = list(zip(sids, parents, strict=True))
        touched = [p is not None and self.hits(s, int(p)) for s, p in pairs]
        return [self.live(s, int(p)) if p is not None else p for s, p in pairs], touched

    def deps(self, sids: list[str], deps: list[Any], touched: list[bool]) -> list[list[int] | None]:
        """``depends_on`` of every row with the dropped requests replaced by their live
        ancestors; a row that named one is marked in ``touched``."""
        out: list[list[int] | None] = []
        for r, (s, d) in enumerate(zip(sids, deps, strict=True)):
            if d is None:
                out.append(None)
                continue
            touched[r] = touched[r] or any(self.hits(s, int(x)) for x in d)
            out.append(sorted({self.live(s, int(x)) for x in d} - {-1}))
        return out


def _set(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    return table.set_column(
        table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type)
    )


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
    relink = _Relink({(sids[r], idx[r]): int(parents[r]) for r in np.flatnonzero(mask)})
    new_parent, touched = relink.parents(sids, parents)
    table = _set(table, "parent_index", new_parent)
    new_deps: list[list[int] | None] | None = None
    if "depends_on" in table.column_names:
        new_deps = relink.deps(sids, table.column("depends_on").to_pylist(), touched)
        table = _set(table, "depends_on", new_deps)
    if {"think_ns", "arrival_ns", "end_ns"} <= set(table.column_names):
        redo = [not mask[r] and touched[r] for r in range(table.num_rows)]
        table = _set(
            table, "think_ns", _think_again(table, sids, idx, _waits(new_deps, new_parent), redo)
        )
    return table.filter(pa.array(~mask)), n


def _waits(deps: list[list[int] | None] | None, parents: list[Any]) -> list[list[int]]:
    """What each row waits for: its dependencies, else its parent."""
    if deps is None:
        deps = [None] * len(parents)
    return [
        d if d is not None else ([int(p)] if p is not None and p >= 0 else [])
        for d, p in zip(deps, parents, strict=True)
    ]


def _think_again(
    table: pa.Table, sids: list[str], idx: list[int], waits: list[list[int]], redo: list[bool]
) -> list[int | None]:
    """``think_ns`` with the rows of ``redo`` measured again from the latest end of the
    requests they wait for (``waits``; None when none of them is in the table)."""
    arrival = table.column("arrival_ns").to_pylist()
    end = table.column("end_ns").to_pylist()
    think = table.column("think_ns").to_pylist()
    row_of = {(s, i): r for r, (s, i) in enumerate(zip(sids, idx, strict=True))}
    for r in range(table.num_rows):
        if not redo[r] or think[r] is None:
            continue
        rows = [row_of[(sids[r], x)] for x in waits[r] if (sids[r], x) in row_of]
        ends = [arrival[w] + (end[w] or 0) for w in rows]
        think[r] = max(0, arrival[r] - max(ends)) if ends else None
    return think
