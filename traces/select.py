"""Which sessions a replay cut to its first N sessions can use, found before the trace is
read whole: from the session and arrival columns only (``first_sessions``)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.traces.io import iter_batches, trace_files


def first_sessions(path: str | os.PathLike[str], n: int, *, skip_failed: bool) -> set[str] | None:
    """The sessions whose first request (leaving failed ones out with ``skip_failed``)
    arrives no later than the ``n``-th session's: a superset of the first ``n`` sessions
    by start, whatever ties and clones do to the order among them. None when the trace
    has no more than ``n`` sessions (all are needed)."""
    import pyarrow.parquet as pq

    cols = ["session_id", "arrival_ns"]
    if skip_failed and all("error" in pq.read_schema(f).names for f in trace_files(path)):
        cols.append("error")
    sids: list[pa.Array] = []
    arrivals: list[np.ndarray] = []
    for b in iter_batches(path, columns=cols):
        sid = b.column("session_id")
        if pa.types.is_dictionary(sid.type):
            sid = sid.cast(sid.type.value_type)
        arr = np.asarray(b.column("arrival_ns").to_numpy(zero_copy_only=False))
        if "error" in b.schema.names:
            ok = np.asarray(pc.is_null(b.column("error")).to_numpy(zero_copy_only=False), bool)
            sid, arr = sid.filter(pa.array(ok)), arr[ok]
        sids.append(sid)
        arrivals.append(arr.astype(np.int64))
    if not sids:
        return None
    table = pa.table({"s": pa.chunked_array(sids, pa.string()),
                      "a": pa.array(np.concatenate(arrivals))})
    starts = table.group_by("s").aggregate([("a", "min")])
    if starts.num_rows <= n:
        return None
    first = np.asarray(starts.column("a_min").to_numpy(zero_copy_only=False))
    cut = np.partition(first, n - 1)[n - 1]
    keep = starts.column("s").filter(pa.array(first <= cut))
    return {str(s) for s in keep.to_pylist()}
