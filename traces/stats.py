"""Pure computations over a trace table: prefix reuse, implied cache hits, percentiles.

Every function takes an Arrow table (or its columns) and returns numbers or numpy arrays;
nothing here reads files or prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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


def matched_blocks(table: pa.Table) -> np.ndarray:
    """Per row: leading blocks of ``hash_ids`` that an unbounded prefix cache already holds
    when the row arrives (requests processed in arrival order, ties in file order).

    A block counts as held when its hash appeared in an earlier request. Rows without
    hashes (null) match 0 blocks. Vectorized: one pass over the flattened hash lists.
    """
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    hashes = _column(table, "hash_ids").combine_chunks()
    lengths = _np(pc.fill_null(pc.list_value_length(hashes), 0), np.int64)
    flat = _np(pc.list_flatten(hashes), np.int64)
    if flat.size == 0:
        return np.zeros(n, np.int64)
    arrival = _np(_column(table, "arrival_ns"), np.int64)
    in_order = bool(np.all(arrival[1:] >= arrival[:-1]))
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    if in_order:  # the common case: rank == row, elements already in rank order
        elem_rank = row_of
        vals = flat
    else:
        order = np.argsort(arrival, kind="stable")
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        elem_rank = rank[row_of]
        by_rank = np.argsort(elem_rank, kind="stable")
        vals = flat[by_rank]
    r = elem_rank if in_order else elem_rank[by_rank]
    # group equal hashes (stable, so each group's first element has the earliest rank)
    o = np.argsort(vals, kind="stable")
    sv = vals[o]
    start = np.empty(sv.size, bool)
    start[0] = True
    np.not_equal(sv[1:], sv[:-1], out=start[1:])
    gid = np.cumsum(start) - 1
    ro = r[o]
    seen_sorted = ro[start][gid] < ro
    seen_r = np.empty(sv.size, bool)
    seen_r[o] = seen_sorted
    if in_order:
        seen = seen_r
    else:
        seen = np.empty(sv.size, bool)
        seen[by_rank] = seen_r
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(flat.size, dtype=np.int64) - np.repeat(starts, lengths)
    big = np.iinfo(np.int64).max
    first_miss_pos = np.where(seen, big, pos)
    out = lengths.copy()
    nonempty = lengths > 0
    if nonempty.any():
        firsts = np.minimum.reduceat(first_miss_pos, starts[nonempty])
        out[nonempty] = np.minimum(firsts, lengths[nonempty])
    return out


SERVER_BLOCK = 16
"""The server's own cache block in tokens, for the implied figures: vLLM's default block
size, and the simulated engine's."""


def implied_hits(lengths: np.ndarray, flat: np.ndarray, inputs: np.ndarray, rank: np.ndarray,
                 block_size: int, server_block: int = SERVER_BLOCK,
                 space: np.ndarray | None = None) -> np.ndarray:
    """Per row: prompt tokens an unbounded prefix cache serves, counted as the server
    counts them. Rows are taken in ``rank`` order (unique ranks); row r has hash ids
    ``flat[starts[r]:starts[r] + lengths[r]]`` and ``inputs[r]`` prompt tokens; ``space``
    (per row) keeps hash spaces apart (replay clones).

    Block i of a row holds ``min(block_size, inputs - i * block_size)`` tokens, and leaves
    in the cache the whole ``server_block``-token blocks of them. A row's hit goes block by
    block: each counts the tokens of it that an earlier row left (at most its own), and the
    hit stops at the first block no earlier row left whole; so a block seen only as a
    partial last block counts for what it filled (its id may recur as a full block in a
    longer prompt that extends it). A server always computes the last prompt token: the hit
    is at most ``inputs - 1`` rounded down to a server block (when ``block_size`` is a
    multiple of ``server_block``; else tokens are counted one by one, up to ``inputs``)."""
    n = len(lengths)
    inputs = np.asarray(inputs, np.int64)
    lengths = np.asarray(lengths, np.int64)
    bs = int(block_size)
    sb = server_block if server_block > 1 and bs % server_block == 0 else 1
    out = np.zeros(n, np.int64)
    if n == 0 or len(flat) == 0:
        return out
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(len(flat), dtype=np.int64) - starts[row_of]
    need = np.clip(inputs[row_of] - pos * bs, 0, bs)
    cover = need // sb * sb
    r = np.asarray(rank, np.int64)[row_of]
    sp = np.zeros(n, np.int64) if space is None else np.asarray(space, np.int64)
    # elements grouped by (space, hash id), each group in rank order
    o = np.lexsort((r, flat, sp[row_of]))
    fo, so, ro = flat[o], sp[row_of][o], r[o]
    new_group = np.empty(len(o), bool)
    new_group[0] = True
    new_group[1:] = (fo[1:] != fo[:-1]) | (so[1:] != so[:-1])
    gid = np.cumsum(new_group) - 1
    step = np.int64(bs + 1)
    running = np.maximum.accumulate(cover[o] + gid * step) - gid * step  # max so far, in group
    # what rows of earlier rank left: the running max before this element's rank began
    first_of_rank = np.empty(len(o), bool)
    first_of_rank[0] = True
    first_of_rank[1:] = new_group[1:] | (ro[1:] != ro[:-1])
    idx = np.maximum.accumulate(np.where(first_of_rank, np.arange(len(o)), 0))
    before = np.where(new_group[idx], 0, running[np.maximum(idx - 1, 0)])
    have = np.empty(len(o), np.int64)
    have[o] = before
    big = np.iinfo(np.int64).max
    stop_pos = np.where(have < bs, pos, big)
    first_stop = np.full(n, big, np.int64)
    nonempty = lengths > 0
    first_stop[nonempty] = np.minimum.reduceat(stop_pos, starts[nonempty])
    counted = pos <= first_stop[row_of]
    hit = np.bincount(row_of, np.where(counted, np.minimum(have, need), 0), minlength=n)
    cap = (inputs - 1) // sb * sb if sb > 1 else inputs
    return np.maximum(0, np.minimum(hit.astype(np.int64), cap))


def implied_cached_tokens(table: pa.Table, block_size: int,
                          server_block: int = SERVER_BLOCK) -> np.ndarray:
    """Per row: prompt tokens an unbounded prefix cache, cold at the trace's start, would
    serve, requests taken in arrival order (ties in file order), counted in whole
    ``server_block``-token blocks as the server counts its cached tokens (``implied_hits``;
    ``server_block`` 1 counts tokens). Rows without hashes (null) hit nothing."""
    n = table.num_rows
    inputs = _np(_column(table, "input_tokens"), np.int64)
    hashes = _column(table, "hash_ids").combine_chunks()
    lengths = _np(pc.fill_null(pc.list_value_length(hashes), 0), np.int64)
    flat = _np(pc.list_flatten(hashes), np.int64)
    rank = np.empty(n, np.int64)
    rank[arrival_order(table)] = np.arange(n, dtype=np.int64)
    return implied_hits(lengths, flat, inputs, rank, block_size, server_block)


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
        arr = col.unify_dictionaries().combine_chunks() if col.num_chunks > 1 else col.combine_chunks()
        codes = _np(arr.indices, np.int64)
        used = np.unique(codes)  # dictionary entries may be unused: count only the used ones
        if used.size == len(arr.dictionary) and used.size == len(pc.unique(arr.dictionary)):
            return codes, int(used.size)
        col = col.cast(col.type.value_type)
    enc = col.combine_chunks().dictionary_encode()
    return _np(enc.indices, np.int64), len(enc.dictionary)


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
    n = table.num_rows
    if n == 0:
        return []
    codes, n_sessions = session_codes(table)
    names = _column(table, "session_id").cast(pa.string()).to_pylist()
    inputs = _np(_column(table, "input_tokens"), np.int64)
    arrival = _np(_column(table, "arrival_ns"), np.int64)
    cached_col = _column(table, "cached_tokens")
    known = _np(pc.is_valid(cached_col), bool)
    cached = _np(pc.fill_null(cached_col, 0), np.int64)
    hashes = _column(table, "hash_ids")
    has_ids = int(pc.sum(pc.fill_null(pc.list_value_length(hashes.combine_chunks()), 0)).as_py() or 0) > 0
    implied = implied_cached_tokens(table, block_size) if has_ids else None
    inp = np.bincount(codes, inputs, minlength=n_sessions)
    cnt = np.bincount(codes, minlength=n_sessions)
    srv = np.bincount(codes, cached, minlength=n_sessions)
    srv_known = np.bincount(codes, known, minlength=n_sessions)
    imp = np.bincount(codes, implied, minlength=n_sessions) if implied is not None else None
    first = np.full(n_sessions, np.iinfo(np.int64).max)
    np.minimum.at(first, codes, arrival)
    name = {int(c): names[i] for i, c in enumerate(codes)}
    return [SessionCache(session_id=name[c], requests=int(cnt[c]), input_tokens=int(inp[c]),
                         server_cached=int(srv[c]) if srv_known[c] == cnt[c] else None,
                         implied_cached=int(imp[c]) if imp is not None else None)
            for c in np.argsort(first, kind="stable").tolist()]


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


def agent_streams(table: pa.Table) -> list[AgentStream]:
    """The streams of every session with more than one (``traces inspect``), in order of
    session, then first turn."""
    if table.num_rows == 0 or "agent_id" not in table.column_names \
            or "depends_on" not in table.column_names:
        return []
    agent = _column(table, "agent_id").cast(pa.string())
    multi = pc.unique(pc.filter(_column(table, "session_id").cast(pa.string()),
                                pc.fill_null(pc.not_equal(agent, "main"), False)))
    if len(multi) == 0:
        return []
    sub = table.select(["session_id", "request_index", "agent_id", "depends_on"])
    sub = sub.filter(pc.is_in(sub.column("session_id").cast(pa.string()), multi))
    by: dict[str, list[dict[str, object]]] = {}
    for r in sub.to_pylist():
        by.setdefault(str(r["session_id"]), []).append(r)
    out: list[AgentStream] = []
    for sid, rows in by.items():
        rows.sort(key=lambda r: int(r["request_index"]))  # type: ignore[call-overload]
        of = {int(r["request_index"]): str(r["agent_id"] or "main") for r in rows}  # type: ignore[call-overload]
        turns: dict[str, list[int]] = {}
        for r in rows:
            turns.setdefault(of[int(r["request_index"])], []).append(int(r["request_index"]))  # type: ignore[call-overload]
        deps = {int(r["request_index"]): list(r["depends_on"] or []) for r in rows}  # type: ignore[call-overload]
        firsts = {idx[0] for idx in turns.values()}  # a stream's first turn: its spawn
        for name, idx in turns.items():
            spawn = [d for d in deps[idx[0]] if of.get(d) not in (None, name)]
            joins = [i for i, ds in deps.items()
                     if of[i] != name and idx[-1] in ds and i not in firsts]
            out.append(AgentStream(sid, name, len(idx), idx[0], idx[-1],
                                   max(spawn) if spawn else None,
                                   min(joins) if joins else None))
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
    """The numbers behind ``traces inspect``."""
    n = table.num_rows
    arrival = _np(_column(table, "arrival_ns"), np.int64)
    codes, n_sessions = session_codes(table) if n else (np.zeros(0, np.int64), 0)
    first = int(arrival.min()) if n else 0
    span = int(arrival.max() - first) if n else 0
    minutes = ((arrival - first) // 60_000_000_000).astype(np.int64)
    per_minute = np.bincount(minutes).tolist() if n else []
    inputs = _np(_column(table, "input_tokens"), np.int64)
    outputs = _np(_column(table, "output_tokens"), np.int64)
    think_col = _column(table, "think_ns")
    think = _np(think_col.drop_null(), np.float64) / 1e9 if think_col.null_count < n else np.zeros(0)
    turns = np.bincount(codes, minlength=n_sessions).astype(np.float64)
    cached_col = _column(table, "cached_tokens")
    cached_total = int(pc.sum(cached_col).as_py() or 0) if cached_col.null_count < n else None
    hashes = _column(table, "hash_ids")
    total_blocks = int(pc.sum(pc.fill_null(pc.list_value_length(hashes.combine_chunks()), 0)).as_py() or 0)
    reuse: float | None = None
    implied: int | None = None
    implied_rows: np.ndarray | None = None
    if total_blocks:
        reuse = float(matched_blocks(table).sum()) / total_blocks
        implied_rows = implied_cached_tokens(table, block_size)
        implied = int(implied_rows.sum())
    known = _np(pc.is_valid(cached_col), bool) if cached_total is not None else None
    models: dict[str, int] = {}
    if "model" in table.column_names and _column(table, "model").null_count < n:
        vc = pc.value_counts(_column(table, "model").cast(pa.string()).combine_chunks())
        for item in vc.to_pylist():
            if item["values"] is not None:
                models[str(item["values"])] = int(item["counts"])
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
        turns_per_session=percentiles(turns),
        cached_tokens_total=cached_total,
        prefix_reuse=reuse,
        implied_cached_total=implied,
        models=models,
        sessions_cache=session_cache(table, block_size),
        agents=agent_streams(table),
        cached_input_total=int(inputs[known].sum()) if known is not None else None,
        implied_on_cached=(int(implied_rows[known].sum())
                           if known is not None and implied_rows is not None else None),
    )
