"""Pure computations over a trace table: prefix reuse, implied cache hits, percentiles.

Every function takes an Arrow table (or its columns) and returns numbers or numpy arrays;
nothing here reads files or prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.traces.prefix import SERVER_BLOCK, PrefixCache


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    return table.column(name)


def _np(col: pa.ChunkedArray | pa.Array, dtype: type | None = None) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    out = arr.to_numpy(zero_copy_only=False)
    return out.astype(dtype) if dtype is not None else out


def arrival_order(table: pa.Table) -> np.ndarray:
    """Row indices in arrival order; ties keep file order (a stable sort)."""
    arrival = _np(_column(table, "arrival_ns"), np.int64)
    return np.argsort(arrival, kind="stable")


def _hash_lists(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per row the number of hash ids (0 for null), and all of them flattened."""
    hashes = _column(table, "hash_ids").combine_chunks()
    lengths = _np(pc.fill_null(pc.list_value_length(hashes), 0), np.int64)
    return lengths, _np(pc.list_flatten(hashes), np.int64)


def _in_order(
    lengths: np.ndarray, flat: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The hash lists of the rows ``order`` names, in that order."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    lens = lengths[order]
    first = np.repeat(starts[order], lens)
    offs = np.concatenate(([0], np.cumsum(lens)[:-1]))
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(offs, lens)
    return lens, flat[first + within]


def _cache_figures(
    table: pa.Table, block_size: int, server_block: int = SERVER_BLOCK
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, in file order: matched blocks and implied cached tokens of an unbounded
    prefix cache fed the rows in arrival order (``traces.prefix.PrefixCache``)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lengths, flat = _hash_lists(table)
    inputs = _np(_column(table, "input_tokens"), np.int64)
    order = arrival_order(table)
    lens, vals = _in_order(lengths, flat, order)
    m, h = PrefixCache(block_size, server_block).step(lens, vals, inputs[order])
    matched = np.empty(n, np.int64)
    implied = np.empty(n, np.int64)
    matched[order] = m
    implied[order] = h
    return matched, implied


def matched_blocks(table: pa.Table) -> np.ndarray:
    """Per row: leading blocks of ``hash_ids`` that an unbounded prefix cache already holds
    when the row arrives (requests processed in arrival order, ties in file order).

    A block counts as held when its hash appeared in an earlier request. Rows without
    hashes (null) match 0 blocks."""
    return _cache_figures(table, 1)[0]


def implied_hits(
    lengths: np.ndarray,
    flat: np.ndarray,
    inputs: np.ndarray,
    rank: np.ndarray,
    block_size: int,
    server_block: int = SERVER_BLOCK,
    space: np.ndarray | None = None,
) -> np.ndarray:
    """Per row: prompt tokens an unbounded prefix cache serves, counted as the server
    counts them. Rows are taken in ``rank`` order (unique ranks); row r has hash ids
    ``flat[starts[r]:starts[r] + lengths[r]]`` and ``inputs[r]`` prompt tokens; ``space``
    (per row) keeps hash spaces apart (replay clones): each space is a cache of its own.

    Block i of a row holds ``min(block_size, inputs - i * block_size)`` tokens, and leaves
    in the cache the whole ``server_block``-token blocks of them. A row's hit goes block by
    block: each counts the tokens of it that an earlier row left (at most its own), and the
    hit stops at the first block no earlier row left whole; so a block seen only as a
    partial last block counts for what it filled (its id may recur as a full block in a
    longer prompt that extends it). A server always computes the last prompt token: the hit
    is at most ``inputs - 1`` rounded down to a server block (when ``block_size`` is a
    multiple of ``server_block``; else tokens are counted one by one, up to ``inputs``).
    ``traces.prefix.PrefixCache`` does the counting."""
    lengths = np.asarray(lengths, np.int64)
    flat = np.asarray(flat, np.int64)
    inputs = np.asarray(inputs, np.int64)
    n = len(lengths)
    out = np.zeros(n, np.int64)
    if n == 0 or len(flat) == 0:
        return out
    rank = np.asarray(rank, np.int64)
    sp = np.zeros(n, np.int64) if space is None else np.asarray(space, np.int64)
    for s in np.unique(sp):
        rows = np.flatnonzero(sp == s)
        order = rows[np.argsort(rank[rows], kind="stable")]
        lens, vals = _in_order(lengths, flat, order)
        out[order] = PrefixCache(block_size, server_block).step(lens, vals, inputs[order])[1]
    return out


def implied_cached_tokens(
    table: pa.Table, block_size: int, server_block: int = SERVER_BLOCK
) -> np.ndarray:
    """Per row: prompt tokens an unbounded prefix cache, cold at the trace's start, would
    serve, requests taken in arrival order (ties in file order), counted in whole
    ``server_block``-token blocks as the server counts its cached tokens (``implied_hits``;
    ``server_block`` 1 counts tokens). Rows without hashes (null) hit nothing."""
    return _cache_figures(table, block_size, server_block)[1]


def prefix_reuse(table: pa.Table, block_size: int | None = None) -> float | None:
    """Block-level hit rate of an unbounded prefix cache: the fraction of all input blocks
    whose hash was seen in an earlier request. ``None`` when the trace carries no hashes.
    ``block_size`` is accepted for symmetry with ``implied_cached_tokens``; the ratio is
    counted in blocks and does not depend on it."""
    del block_size
    hashes = _column(table, "hash_ids").combine_chunks()
    total = int(pc.sum(pc.fill_null(pc.list_value_length(hashes), 0)).as_py() or 0)
    if total == 0:
        return None
    return float(matched_blocks(table).sum()) / total


def percentiles(values: np.ndarray, qs: tuple[float, ...] = (50, 90, 99)) -> dict[str, float]:
    """Named percentiles (linear interpolation) plus min, max, mean and the count."""
    v = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    out: dict[str, float] = {"count": float(v.size)}
    if v.size == 0:
        return out
    out["min"] = float(v.min())
    out["mean"] = float(v.mean())
    for q in qs:
        out[f"p{q:g}"] = float(np.percentile(v, q))
    out["max"] = float(v.max())
    return out


def session_codes(table: pa.Table) -> tuple[np.ndarray, int]:
    """Session of each row as a dense integer code, and the number of sessions."""
    col = _column(table, "session_id")
    if pa.types.is_dictionary(col.type):
        arr = (
            col.unify_dictionaries().combine_chunks()
            if col.num_chunks > 1
            else col.combine_chunks()
        )
        codes = _np(arr.indices, np.int64)
        used = np.unique(codes)  # dictionary entries may be unused: count only the used ones
        if used.size == len(arr.dictionary) and used.size == len(pc.unique(arr.dictionary)):
            return codes, int(used.size)
        col = col.cast(col.type.value_type)
    enc = col.combine_chunks().dictionary_encode()
    return _np(enc.indices, np.int64), len(enc.dictionary)


def global_codes(col: pa.ChunkedArray | pa.Array, codes: dict[str, int]) -> np.ndarray:
    """Each value of a string column (plain or dictionary) as its code in ``codes``, which
    grows by the values not in it yet (null: -1). Only the dictionary entries the rows use
    are looked up: a part file may carry every session's name in each row group."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    enc = arr if pa.types.is_dictionary(arr.type) else arr.dictionary_encode()
    if len(enc) == 0:
        return np.zeros(0, np.int64)
    valid = _np(enc.is_valid(), bool)
    idx = _np(pc.fill_null(enc.indices, 0), np.int64)
    used = np.unique(idx[valid])
    local = np.full(max(len(enc.dictionary), 1), -1, np.int64)
    names = enc.dictionary.take(pa.array(used)).cast(pa.string()).to_pylist()
    local[used] = [codes.setdefault(str(s), len(codes)) for s in names]
    return np.where(valid, local[idx], -1)


@dataclass(frozen=True, slots=True)
class SessionCache:
    """One session's prompt tokens and how many were cached: by the original server (its
    usage's cached-token figure, ``cached_tokens``) and as the trace's hash ids imply
    (``implied_cached_tokens``). Rates are of the session's input tokens; None when
    unknown."""

    session_id: str
    requests: int
    input_tokens: int
    server_cached: int | None
    implied_cached: int | None

    @property
    def server_rate(self) -> float | None:
        return _rate(self.server_cached, self.input_tokens)

    @property
    def implied_rate(self) -> float | None:
        return _rate(self.implied_cached, self.input_tokens)


def _rate(part: int | None, whole: int) -> float | None:
    return None if part is None or whole <= 0 else part / whole


def session_cache(table: pa.Table, block_size: int) -> list[SessionCache]:
    """Per session, in order of first arrival: server-cached vs trace-implied prompt
    tokens (the implied figure over the whole trace's cache, as a replay would see it).
    A session's server figure is None unless every row has one."""
    return summarize(table, block_size).sessions_cache


@dataclass(frozen=True, slots=True)
class AgentStream:
    """One agent stream (``agent_id``) of a session that has more than one: its turns,
    the request that spawned it (its first turn's dependency in another stream) and the
    request that joined it (a later request of another stream that depends on its last
    turn, other than a stream's first turn, which that turn spawned). Request indices;
    None where there is none."""

    session_id: str
    agent_id: str
    turns: int
    first: int
    last: int
    spawned_by: int | None
    joined_by: int | None


def _multi_agent_sessions(table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    """Session -> its rows (request index, agent, dependencies), for the sessions with an
    agent other than ``main``."""
    agent = _column(table, "agent_id").cast(pa.string())
    multi = pc.unique(
        pc.filter(
            _column(table, "session_id").cast(pa.string()),
            pc.fill_null(pc.not_equal(agent, "main"), False),
        )
    )
    if len(multi) == 0:
        return {}
    sub = table.select(["session_id", "request_index", "agent_id", "depends_on"])
    sub = sub.filter(pc.is_in(sub.column("session_id").cast(pa.string()), multi))
    by: dict[str, list[dict[str, Any]]] = {}
    for r in sub.to_pylist():
        by.setdefault(str(r["session_id"]), []).append(r)
    return by


def agent_streams(table: pa.Table) -> list[AgentStream]:
    """The streams of every session with more than one (``traces inspect``), in order of
    session, then first turn."""
    if (
        table.num_rows == 0
        or "agent_id" not in table.column_names
        or "depends_on" not in table.column_names
    ):
        return []
    out: list[AgentStream] = []
    for sid, rows in _multi_agent_sessions(table).items():
        out += session_streams(
            sid,
            [int(r["request_index"]) for r in rows],
            [str(r["agent_id"] or "main") for r in rows],
            [list(r["depends_on"] or []) for r in rows],
        )
    return out


def _joins(
    turns: dict[str, list[int]], deps: dict[int, list[int]], of: dict[int, str]
) -> dict[str, int]:
    """Stream -> the earliest request that joins it: a later turn of another stream that
    depends on its last turn (a stream's first turn aside: that turn's dependency is its
    spawn)."""
    firsts = {idx[0] for idx in turns.values()}
    last_of = {idx[-1]: name for name, idx in turns.items()}
    joined: dict[str, int] = {}
    for i in sorted(deps):
        if i in firsts:
            continue
        for d in deps[i]:
            name = last_of.get(d)
            if name is not None and name != of[i]:
                joined[name] = min(i, joined.get(name, i))
    return joined


def session_streams(
    session_id: str, request_index: list[int], agent_id: list[str], depends_on: list[list[int]]
) -> list[AgentStream]:
    """The agent streams of one session (its rows in any order), in order of first turn;
    linear in the rows and their dependencies."""
    order = sorted(range(len(request_index)), key=request_index.__getitem__)
    of = {request_index[i]: agent_id[i] for i in order}
    turns: dict[str, list[int]] = {}
    for i in order:
        turns.setdefault(agent_id[i], []).append(request_index[i])
    deps = {request_index[i]: depends_on[i] for i in order}
    joined = _joins(turns, deps, of)
    out = []
    for name, idx in turns.items():
        spawn = [d for d in deps[idx[0]] if of.get(d) not in (None, name)]
        out.append(
            AgentStream(
                session_id,
                name,
                len(idx),
                idx[0],
                idx[-1],
                max(spawn) if spawn else None,
                joined.get(name),
            )
        )
    return out


@dataclass
class TraceSummary:
    """What ``traces inspect`` shows, as numbers."""

    requests: int
    sessions: int
    span_ns: int
    first_arrival_ns: int
    per_minute: list[int]
    input_tokens: dict[str, float]
    output_tokens: dict[str, float]
    total_input_tokens: int
    total_output_tokens: int
    think_s: dict[str, float]
    turns_per_session: dict[str, float]
    cached_tokens_total: int | None
    prefix_reuse: float | None
    implied_cached_total: int | None
    """``implied_cached_tokens`` summed: the hits the replay expects (``replay.plan``)."""
    models: dict[str, int] = field(default_factory=dict)
    sessions_cache: list[SessionCache] = field(default_factory=list)
    agents: list[AgentStream] = field(default_factory=list)
    failed: int = 0
    """Rows with an ``error`` (failed when recorded)."""
    failure_causes: list[tuple[str, int]] = field(default_factory=list)
    """The most frequent error texts (cut at the first colon) and their counts."""
    cached_input_total: int | None = None
    """Input tokens of the rows with a server figure (``cached_tokens`` not null: a failed
    request has none), the base of both cached rates."""
    implied_on_cached: int | None = None
    """``implied_cached_total`` over those rows only."""

    @property
    def server_cached_rate(self) -> float | None:
        return _rate(self.cached_tokens_total, self.cached_input_total or 0)

    @property
    def implied_cached_rate(self) -> float | None:
        """The rate the trace implies, on the rows the server's rate counts."""
        return _rate(self.implied_on_cached, self.cached_input_total or 0)


def summarize(table: pa.Table, block_size: int) -> TraceSummary:
    """The numbers behind ``traces inspect``, of a table in memory
    (``traces.summary``, which also streams a trace from its file)."""
    from agent_replay.traces.summary import summarize_table

    return summarize_table(table, block_size)
