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
    """``table`` without its failed rows, and how many were dropped (see the module text)."""
    mask = failed_mask(table)
    n = int(mask.sum())
    if n == 0:
        return table, 0
    sids = [str(s) for s in table.column("session_id").to_pylist()]
    idx = table.column("request_index").to_pylist()
    parents = table.column("parent_index").to_pylist()
    dropped_parent: dict[tuple[str, int], int] = {
        (sids[r], int(idx[r])): int(parents[r]) for r in np.flatnonzero(mask)}

    def live(sid: str, p: int) -> int:
        seen = 0
        while (sid, p) in dropped_parent and seen <= len(dropped_parent):
            p = dropped_parent[(sid, p)]
            seen += 1
        return p

    new_parent = [live(s, int(p)) if p is not None else p for s, p in zip(sids, parents, strict=False)]
    table = table.set_column(table.schema.get_field_index("parent_index"), "parent_index",
                             pa.array(new_parent, table.schema.field("parent_index").type))
    if "depends_on" in table.column_names:
        field = table.schema.field("depends_on")
        deps = table.column("depends_on").to_pylist()
        fixed: list[list[int] | None] = []
        for s, d in zip(sids, deps, strict=False):
            if d is None:
                fixed.append(None)
                continue
            out = sorted({live(s, int(x)) for x in d} - {-1})
            fixed.append(out)
        table = table.set_column(table.schema.get_field_index("depends_on"), "depends_on",
                                 pa.array(fixed, field.type))
    return table.filter(pa.array(~mask)), n
