"""Which sessions a replay cut to its first N sessions (``first_sessions``) or to a
duration (``sessions_starting_before``) can use, found before the trace is read whole:
from the session and arrival columns only."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from agent_replay.traces.io import GroupRef, iter_row_groups, trace_files
from agent_replay.traces.stats import global_codes


class SessionScan:
    """One pass over a trace's session and arrival columns: each session's first arrival
    (failed requests left out with ``skip_failed``) and, per row group, each row's session,
    so that the rows of the sessions a replay picks are found without reading again."""

    def __init__(self, path: str | os.PathLike[str], *, skip_failed: bool) -> None:
        import pyarrow.parquet as pq

        cols = ["session_id", "arrival_ns"]
        if skip_failed and all("error" in pq.read_schema(f).names for f in trace_files(path)):
            cols.append("error")
        code: dict[str, int] = {}
        self.groups: list[tuple[GroupRef, np.ndarray]] = []
        firsts: list[np.ndarray] = []  # per group: (code, earliest arrival) pairs
        for ref, t in iter_row_groups(path, cols):
            codes = global_codes(t.column("session_id"), code)
            self.groups.append((ref, codes.astype(np.int32)))
            ok = codes >= 0
            if "error" in t.column_names:
                ok &= np.asarray(pc.is_null(t.column("error")).to_numpy(zero_copy_only=False), bool)
            arr = np.asarray(t.column("arrival_ns").to_numpy(zero_copy_only=False)).astype(np.int64)
            if ok.any():
                firsts.append(np.stack([codes[ok], arr[ok]]))
        self.names = list(code)
        big = np.iinfo(np.int64).max
        self.starts = np.full(len(code), big, np.int64)
        """Per session code: its first arrival (int64 max: none that counts)."""
        for f in firsts:
            np.minimum.at(self.starts, f[0], f[1])
        self.counted = self.starts < big

    def first(self, n: int) -> np.ndarray | None:
        """Codes of the sessions whose first arrival is no later than the ``n``-th
        session's: a superset of the first ``n`` by start, whatever ties and clones do to
        the order among them. None when there are no more than ``n`` (all are needed)."""
        counted = np.flatnonzero(self.counted)
        if counted.size <= n:
            return None
        cut = np.partition(self.starts[counted], n - 1)[n - 1]
        return counted[self.starts[counted] <= cut]

    def before(self, seconds: float, speedup: float) -> np.ndarray | None:
        """Codes of the sessions whose first request comes less than ``seconds`` (of
        replay, after ``speedup``) after the trace's first, with a nanosecond to spare (a
        superset of those a replay with that duration starts). None when that is all."""
        counted = np.flatnonzero(self.counted)
        if counted.size == 0:
            return None
        first = self.starts[counted]
        keep = (first - first.min()) / speedup < seconds * 1e9 + 1
        return None if keep.all() else counted[keep]

    def session_names(self, codes: np.ndarray) -> set[str]:
        return {self.names[c] for c in codes.tolist()}

    def rows(self, codes: np.ndarray) -> dict[tuple[Path, int], np.ndarray]:
        """Per row group (file, number): the rows of the sessions ``codes``."""
        want = np.zeros(len(self.names) + 1, bool)
        want[codes] = True  # the extra last entry stands for -1 (no session)
        return {(ref.path, ref.index): np.flatnonzero(want[c]) for ref, c in self.groups}


def first_sessions(path: str | os.PathLike[str], n: int, *, skip_failed: bool) -> set[str] | None:
    """The sessions whose first request (leaving failed ones out with ``skip_failed``)
    arrives no later than the ``n``-th session's (``SessionScan.first``); None when the
    trace has no more than ``n`` sessions (all are needed)."""
    scan = SessionScan(path, skip_failed=skip_failed)
    codes = scan.first(n)
    return None if codes is None else scan.session_names(codes)


def sessions_starting_before(
    path: str | os.PathLike[str], seconds: float, speedup: float, *, skip_failed: bool
) -> set[str] | None:
    """The sessions whose first request comes less than ``seconds`` (of replay, after
    ``speedup``) after the trace's first (``SessionScan.before``); None when that is
    every session."""
    scan = SessionScan(path, skip_failed=skip_failed)
    codes = scan.before(seconds, speedup)
    return None if codes is None else scan.session_names(codes)
