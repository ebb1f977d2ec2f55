"""Which sessions a replay cut to its first N sessions (``first_sessions``) or to a
duration (``sessions_starting_before``) can use, found before the trace is read whole:
from the session and arrival columns only."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.traces.io import iter_batches, trace_files


def session_starts(path: str | os.PathLike[str], *, skip_failed: bool) -> pa.Table | None:
    """One row per session (``s``) with its first request's arrival (``a``), leaving failed
    requests out with ``skip_failed``; None for a trace without rows."""
    import pyarrow.parquet as pq

    cols = ["session_id", "arrival_ns"]
    if skip_failed and all("error" in pq.read_schema(f).names for f in trace_files(path)):
        cols.append("error")
    parts: list[pa.Table] = []  # (session, earliest arrival) per batch, compacted
    held = compacted = 0
    for b in iter_batches(path, columns=cols):
        sid = b.column("session_id")
        if not pa.types.is_dictionary(sid.type):
            sid = sid.dictionary_encode()
        arr = np.asarray(b.column("arrival_ns").to_numpy(zero_copy_only=False)).astype(np.int64)
        ok = np.asarray(sid.is_valid().to_numpy(zero_copy_only=False), bool)
        if "error" in b.schema.names:
            ok &= np.asarray(pc.is_null(b.column("error")).to_numpy(zero_copy_only=False), bool)
        idx = np.asarray(sid.indices.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)[ok]
        arr = arr[ok]
        if not idx.size:
            continue
        # the batch's earliest arrival per session: sort by session, reduce each run
        order = np.argsort(idx, kind="stable")
        si, sa = idx[order], arr[order]
        starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
        names = sid.dictionary.take(pa.array(si[starts]))
        if pa.types.is_dictionary(names.type):  # pragma: no cover - nested dictionaries
            names = names.cast(names.type.value_type)
        parts.append(pa.table({"s": names.cast(pa.string()), "a": np.minimum.reduceat(sa, starts)}))
        held += len(starts)
        if held > 2 * compacted + 65536:  # keep what is held near one row per session
            parts = [_earliest(parts)]
            held = compacted = parts[0].num_rows
    return _earliest(parts) if parts else None


def first_sessions(path: str | os.PathLike[str], n: int, *, skip_failed: bool) -> set[str] | None:
    """The sessions whose first request (leaving failed ones out with ``skip_failed``)
    arrives no later than the ``n``-th session's: a superset of the first ``n`` sessions
    by start, whatever ties and clones do to the order among them. None when the trace
    has no more than ``n`` sessions (all are needed)."""
    starts_t = session_starts(path, skip_failed=skip_failed)
    if starts_t is None or starts_t.num_rows <= n:
        return None
    first = np.asarray(starts_t.column("a").to_numpy(zero_copy_only=False))
    cut = np.partition(first, n - 1)[n - 1]
    keep = starts_t.column("s").filter(pa.array(first <= cut))
    return {str(s) for s in keep.to_pylist()}


def sessions_starting_before(path: str | os.PathLike[str], seconds: float, speedup: float, *,
                             skip_failed: bool) -> set[str] | None:
    """The sessions whose first request comes less than ``seconds`` (of replay, after
    ``speedup``) after the trace's first, with a nanosecond to spare (a superset of those a
    replay with that duration starts). None when that is every session."""
    starts_t = session_starts(path, skip_failed=skip_failed)
    if starts_t is None:
        return None
    first = np.asarray(starts_t.column("a").to_numpy(zero_copy_only=False)).astype(np.int64)
    offset = (first - first.min()) / speedup
    keep = offset < seconds * 1e9 + 1
    if keep.all():
        return None
    return {str(s) for s in starts_t.column("s").filter(pa.array(keep)).to_pylist()}


def _earliest(parts: list[pa.Table]) -> pa.Table:
    """One row per session (``s``) with its earliest arrival (``a``)."""
    t = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    return t.group_by("s").aggregate([("a", "min")]).rename_columns(["s", "a"])
