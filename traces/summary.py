"""The numbers behind ``traces inspect``, from a trace streamed one row group at a time.

What is kept across row groups is a few integers per row (arrival, session, token counts,
the hash-derived figures) and one entry per distinct hash id (``traces.prefix``), never a
row group's strings or hash lists. The prefix-cache figures need the requests in arrival
order: a trace already in that order (ties in file order) is fed to the cache as it is
read; any other is read again, its hash lists only, a window of arrival ranks at a time.

Columns a valid trace may lack (``think_ns``, ``cached_tokens``, ``hash_ids``, ``model``,
the agent-tree and ``error`` columns, in any part file) count as null.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.errors import TraceError
from agent_replay.traces.io import GroupRef, iter_row_groups
from agent_replay.traces.limits import TraceLimits
from agent_replay.traces.prefix import PrefixCache
from agent_replay.traces.schema import REQUIRED_COLUMNS
from agent_replay.traces.stats import (
    AgentStream,
    SessionCache,
    TraceSummary,
    global_codes,
    percentiles,
    session_streams,
)
from agent_replay.traces.tree import MAIN

COLUMNS = (
    "session_id",
    "request_index",
    "parent_index",
    "arrival_ns",
    "think_ns",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "hash_ids",
    "model",
    "error",
    "agent_id",
    "depends_on",
)
"""The columns ``traces inspect`` reads (those a file has)."""

WINDOW_ROWS = 1 << 15
"""Arrival ranks per window when a trace out of arrival order is read again."""
HELD_GROUPS = 3
"""Row groups' hash lists kept between windows of that second read (those with rows of
later windows): parts written side by side overlap in time; more are read again."""


def _np(col: pa.ChunkedArray | pa.Array, dtype: type = np.int64) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return np.asarray(col.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _strings(col: pa.ChunkedArray) -> pa.Array:
    """A string column (plain or dictionary) as plain strings."""
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return arr.cast(pa.string())


@dataclass
class _Parts:
    """Per-row arrays gathered row group by row group."""

    arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, name: str, values: np.ndarray) -> None:
        self.arrays.setdefault(name, []).append(values)

    def get(self, name: str, dtype: type = np.int64) -> np.ndarray:
        parts = self.arrays.get(name)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


_Held = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A row group's hash list lengths, hash ids and input tokens."""


def _take_lists(
    lengths: np.ndarray, flat: np.ndarray, idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of a list column given as per-row lengths and the flat values: their
    lengths and their values, in the order of ``idx``."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    lens = lengths[idx]
    offs = np.concatenate(([0], np.cumsum(lens)[:-1]))
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(offs, lens)
    return lens, flat[np.repeat(starts[idx], lens) + within]


class Summarizer:
    """Feed row groups in file order (``add``), then ``finish``; see the module text."""

    def __init__(self, block_size: int) -> None:
        self.block_size = int(block_size)
        self.rows = 0
        self.parts = _Parts()
        self.session_code: dict[str, int] = {}
        self.agent_code: dict[str, int] = {MAIN: 0}
        self.models: Counter[str] = Counter()
        self.causes: Counter[str] = Counter()
        self.failed = 0
        self.total_blocks = 0
        self.has_tree = False
        self.cache: PrefixCache | None = PrefixCache(self.block_size)
        """Fed as rows are read while they come in arrival order (``in_order``)."""
        self.in_order = True
        self.last_arrival = np.iinfo(np.int64).min
        self.groups: list[tuple[GroupRef | None, int]] = []

    def add(self, t: pa.Table, ref: GroupRef | None = None) -> None:
        n = t.num_rows
        names = set(t.column_names)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise TraceError(
                "required column missing",
                path=None if ref is None else str(ref.path),
                field=missing[0],
            )
        self.groups.append((ref, n))
        p = self.parts
        arrival = _np(t.column("arrival_ns"))
        p.add("arrival", arrival)
        p.add("session", global_codes(t.column("session_id"), self.session_code).astype(np.int32))
        p.add("request", _np(t.column("request_index"), np.int32))
        inputs = _np(t.column("input_tokens"))
        p.add("input", inputs)
        p.add("output", _np(t.column("output_tokens"), np.int32))
        for name in ("think_ns", "cached_tokens"):
            self._add_nullable(t, name)
        self._count_models(t)
        self._count_errors(t)
        self._add_tree(t)
        lengths, flat = _hash_lists(t)
        self.total_blocks += int(lengths.sum())
        if self.in_order and self.cache is not None:
            self._feed_cache(arrival, lengths, flat, inputs)
        self.rows += n

    def _add_nullable(self, t: pa.Table, name: str) -> None:
        """A column that may be absent or null: its values (null: 0) and where known."""
        n = t.num_rows
        if name in t.column_names and t.column(name).null_count < n:
            col = t.column(name)
            self.parts.add(name, _np(pc.fill_null(col, 0)))
            self.parts.add(name + "?", _np(pc.is_valid(col), bool))
        else:
            self.parts.add(name, np.zeros(n, np.int64))
            self.parts.add(name + "?", np.zeros(n, bool))

    def _count_models(self, t: pa.Table) -> None:
        if "model" not in t.column_names:
            return
        for item in pc.value_counts(_strings(t.column("model"))).to_pylist():
            if item["values"] is not None:
                self.models[str(item["values"])] += int(item["counts"])

    def _count_errors(self, t: pa.Table) -> None:
        """Failed rows, and their causes (an error's text up to its first colon)."""
        if "error" not in t.column_names:
            return
        err = t.column("error")
        bad = _np(pc.is_valid(err), bool)
        if not bad.any():
            return
        self.failed += int(bad.sum())
        for e in _strings(err).filter(pa.array(bad)).to_pylist():
            self.causes[str(e).split(":")[0]] += 1

    def _add_tree(self, t: pa.Table) -> None:
        """The agent-tree columns: agent codes (-1: none) and dependency lists (length -1:
        none)."""
        n, names = t.num_rows, set(t.column_names)
        if "agent_id" in names and "depends_on" in names:
            self.has_tree = True
        if "agent_id" in names:
            self.parts.add(
                "agent", global_codes(t.column("agent_id"), self.agent_code).astype(np.int32)
            )
        else:
            self.parts.add("agent", np.full(n, -1, np.int32))
        if "depends_on" in names:
            deps = t.column("depends_on").combine_chunks()
            self.parts.add("deps_len", _np(pc.list_value_length(deps).fill_null(-1)))
            self.parts.add("deps", _np(pc.list_flatten(deps)))
        else:
            self.parts.add("deps_len", np.full(n, -1, np.int64))

    def _feed_cache(
        self, arrival: np.ndarray, lengths: np.ndarray, flat: np.ndarray, inputs: np.ndarray
    ) -> None:
        """Feed a row group to the cache while the rows come in arrival order; the first
        group out of order drops it (the figures then come from a second read)."""
        assert self.cache is not None
        n = arrival.size
        if n and (arrival[0] < self.last_arrival or not bool(np.all(arrival[1:] >= arrival[:-1]))):
            self.cache = None
            self.in_order = False
            self.parts.arrays.pop("matched", None)
            self.parts.arrays.pop("implied", None)
            return
        m, h = self.cache.step(lengths, flat, inputs)
        self.parts.add("matched", m.astype(np.int32))
        self.parts.add("implied", h.astype(np.int32))
        if n:
            self.last_arrival = int(arrival[-1])

    def _cache_figures(
        self, arrival: np.ndarray, tables: Iterable[pa.Table] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Matched blocks and implied cached tokens per row, file order."""
        if self.in_order:
            return self.parts.get("matched"), self.parts.get("implied")
        n = arrival.size
        order = np.argsort(arrival, kind="stable")
        starts = np.cumsum([0] + [k for _, k in self.groups])
        matched = np.zeros(n, np.int64)
        implied = np.zeros(n, np.int64)
        cache = PrefixCache(self.block_size)
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        last_rank = [int(rank[a:b].max()) if b > a else -1 for a, b in pairwise(starts)]
        held: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        given = list(tables) if tables is not None else None
        for w in range(0, n, WINDOW_ROWS):
            rows = order[w : w + WINDOW_ROWS]
            m, h = cache.step(*self._window(rows, starts, held, given))
            for k in [k for k in held if last_rank[k] < w + WINDOW_ROWS]:
                del held[k]  # no row of it is left
            matched[rows] = m
            implied[rows] = h
        return matched, implied

    def _window(
        self,
        rows: np.ndarray,
        starts: np.ndarray,
        held: dict[int, _Held],
        given: list[pa.Table] | None,
    ) -> _Held:
        """(hash list lengths, hash ids, input tokens) of the file rows ``rows``, in that
        order, read from the row groups that hold them."""
        group = np.searchsorted(starts, rows, "right") - 1
        lens_parts, flat_parts, in_parts, pos_parts = [], [], [], []
        for g in np.unique(group).tolist():
            lengths, flat, inputs = self._held_group(g, held, given)
            local = rows[group == g] - starts[g]
            lens, ids = _take_lists(lengths, flat, local)
            lens_parts.append(lens)
            flat_parts.append(ids)
            in_parts.append(inputs[local])
            pos_parts.append(np.flatnonzero(group == g))
        # back to the order of ``rows``
        pos = np.concatenate(pos_parts)
        inv = np.empty(pos.size, np.int64)
        inv[pos] = np.arange(pos.size)
        lens, ids = _take_lists(np.concatenate(lens_parts), np.concatenate(flat_parts), inv)
        return lens, ids, np.concatenate(in_parts)[inv]

    def _held_group(self, g: int, held: dict[int, _Held], given: list[pa.Table] | None) -> _Held:
        """Row group ``g``'s hash lists and input tokens, read when not held (the group
        read first goes when ``HELD_GROUPS`` are held)."""
        if g not in held:
            if given is not None:
                t = given[g]
            else:
                ref = self.groups[g][0]
                assert ref is not None
                t = ref.read(["hash_ids", "input_tokens"])
            lengths, flat = _hash_lists(t)
            while len(held) >= HELD_GROUPS:
                del held[next(iter(held))]
            held[g] = (lengths, flat, _np(t.column("input_tokens")))
        return held[g]

    def finish(self, tables: list[pa.Table] | None = None) -> TraceSummary:
        """The summary; ``tables``: the groups given to ``add`` when they were not read
        from a file (kept by the caller)."""
        self.cache = None  # its map of every hash id is not needed any more
        p = self.parts
        n = self.rows
        arrival = p.get("arrival")
        codes = p.get("session")
        n_sessions = len(self.session_code)
        first = int(arrival.min()) if n else 0
        span = int(arrival.max() - first) if n else 0
        per_minute = np.bincount((arrival - first) // 60_000_000_000).tolist() if n else []
        inputs, outputs = p.get("input"), p.get("output")
        think_known = p.get("think_ns?", bool)
        think = p.get("think_ns")[think_known].astype(np.float64) / 1e9
        cached_known = p.get("cached_tokens?", bool)
        cached = p.get("cached_tokens")
        reuse: float | None = None
        implied_total: int | None = None
        implied: np.ndarray | None = None
        implied_rows: np.ndarray | None = None
        if self.total_blocks:
            matched, implied = self._cache_figures(arrival, tables)
            reuse = float(matched.sum()) / self.total_blocks
            implied_rows = implied  # implied_hits, as the session table and the replay count
            implied_total = int(implied_rows.sum())
        known = bool(cached_known.any())
        sessions_cache = _session_cache(
            self.session_code, codes, arrival, inputs, cached, cached_known, implied
        )
        return TraceSummary(
            requests=n,
            sessions=n_sessions,
            span_ns=span,
            first_arrival_ns=first,
            per_minute=per_minute,
            input_tokens=percentiles(inputs),
            output_tokens=percentiles(outputs),
            total_input_tokens=int(inputs.sum()),
            total_output_tokens=int(outputs.sum()),
            think_s=percentiles(think),
            turns_per_session=percentiles(
                np.bincount(codes[codes >= 0], minlength=n_sessions).astype(np.float64)
            ),
            cached_tokens_total=int(cached[cached_known].sum()) if cached_known.any() else None,
            prefix_reuse=reuse,
            implied_cached_total=implied_total,
            models=dict(self.models),
            sessions_cache=sessions_cache,
            agents=self._agents(codes) if self.has_tree else [],
            failed=self.failed,
            failure_causes=self.causes.most_common(5),
            cached_input_total=int(inputs[cached_known].sum()) if known else None,
            implied_on_cached=(
                int(implied_rows[cached_known].sum())
                if known and implied_rows is not None
                else None
            ),
        )

    def _agents(self, codes: np.ndarray) -> list[AgentStream]:
        p = self.parts
        agent = p.get("agent")
        main = self.agent_code[MAIN]
        multi = np.unique(codes[(agent >= 0) & (agent != main)])
        if multi.size == 0:
            return []
        deps_len = p.get("deps_len")
        flat = p.get("deps")
        starts = np.concatenate(([0], np.cumsum(np.maximum(deps_len, 0))[:-1]))
        names = list(self.session_code)
        agents = list(self.agent_code)
        req = p.get("request")
        rows = np.flatnonzero(np.isin(codes, multi))
        by: dict[int, list[int]] = {}
        for r in rows.tolist():  # grouped by session, sessions in order of first row
            by.setdefault(int(codes[r]), []).append(r)
        out: list[AgentStream] = []
        for c, rs in by.items():
            out += session_streams(
                names[c],
                [int(req[r]) for r in rs],
                [agents[a] if a >= 0 else MAIN for a in agent[rs].tolist()],
                [
                    flat[starts[r] : starts[r] + deps_len[r]].tolist() if deps_len[r] >= 0 else []
                    for r in rs
                ],
            )
        return out


def _hash_lists(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    if "hash_ids" not in t.column_names:
        return np.zeros(t.num_rows, np.int64), np.zeros(0, np.int64)
    hashes = t.column("hash_ids").combine_chunks()
    return _np(pc.fill_null(pc.list_value_length(hashes), 0)), _np(pc.list_flatten(hashes))


def _session_cache(
    session_code: dict[str, int],
    codes: np.ndarray,
    arrival: np.ndarray,
    inputs: np.ndarray,
    cached: np.ndarray,
    known: np.ndarray,
    implied: np.ndarray | None,
) -> list[SessionCache]:
    """Per session, in order of first arrival: server-cached vs trace-implied prompt
    tokens (see ``traces.stats.SessionCache``)."""
    k = len(session_code)
    if k == 0:
        return []
    ok = codes >= 0
    c = codes[ok]
    inp = np.bincount(c, inputs[ok], minlength=k)
    cnt = np.bincount(c, minlength=k)
    srv = np.bincount(c, cached[ok], minlength=k)
    srv_known = np.bincount(c, known[ok], minlength=k)
    imp = np.bincount(c, implied[ok], minlength=k) if implied is not None else None
    first = np.full(k, np.iinfo(np.int64).max)
    np.minimum.at(first, c, arrival[ok])
    names = list(session_code)
    return [
        SessionCache(
            session_id=names[s],
            requests=int(cnt[s]),
            input_tokens=int(inp[s]),
            server_cached=int(srv[s]) if srv_known[s] == cnt[s] else None,
            implied_cached=int(imp[s]) if imp is not None else None,
        )
        for s in np.argsort(first, kind="stable").tolist()
    ]


def summarize_table(table: pa.Table, block_size: int) -> TraceSummary:
    """The summary of a table in memory (as if it were one row group)."""
    s = Summarizer(block_size)
    s.add(table)
    return s.finish([table])


def summarize_trace(
    path: str | os.PathLike[str], block_size: int, *, limits: TraceLimits | None = None
) -> TraceSummary:
    """The summary of the trace at ``path``, one row group in memory at a time."""
    s = Summarizer(block_size)
    for ref, t in iter_row_groups(path, COLUMNS, limits=limits):
        s.add(t, ref)
    return s.finish()
