"""Per-request and per-chunk metrics of docs/metrics.md, vectorized over Arrow record batches.

Names follow docs/metrics.md: S = intended_ns, s = sent_ns + connect_ns (the request's bytes handed
to its connection; s0 = sent_ns when the client started it), f = first_token_ns,
c_j = chunk_ns[j], k_j = chunk_tokens[j], N = sum k_j, e = end_ns. Every function here is
pure: a record batch (or table) of REQUEST_SCHEMA rows in, numpy arrays out; list columns are
read through their flattened values and offsets, never row by row.

Per-request values are float64 nanoseconds with NaN where a metric is undefined for a row
(no first token, a one-token output has no TPOT, a failed request has no E2E ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.results_schema import INEXACT

NS = 1_000_000_000


def _col(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    col = batch.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _f64(batch: pa.RecordBatch | pa.Table, name: str) -> np.ndarray:
    """A nullable integer column as float64 with NaN for nulls."""
    col = _col(batch, name)
    return (
        np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        if col.null_count == 0
        else np.asarray(col.cast(pa.float64()).fill_null(np.nan).to_numpy(), dtype=np.float64)
    )


def _i64(batch: pa.RecordBatch | pa.Table, name: str, fill: int = 0) -> np.ndarray:
    col = _col(batch, name)
    if col.null_count:
        col = col.fill_null(fill)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Lists:
    """A list column as flat integer values plus per-row [start, stop) offsets (null lists
    are empty)."""

    values: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _nulls(col: pa.Array) -> np.ndarray:
    return np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def lists(batch: pa.RecordBatch | pa.Table, name: str) -> Lists:
    col = _col(batch, name)
    offsets = np.asarray(col.offsets.to_numpy(), dtype=np.int64)
    if col.null_count and np.diff(offsets)[_nulls(col)].any():
        # A null list may own values (Arrow allows it); those are not the row's chunks.
        col = pc.if_else(pc.is_null(col), pa.scalar([], col.type), col)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        offsets = np.asarray(col.offsets.to_numpy(), dtype=np.int64)
    base = offsets[0]
    # Zero-copy view in the column's own integer type (int64 chunk times, int32 token counts).
    values = np.asarray(col.values.slice(base, offsets[-1] - base).to_numpy(zero_copy_only=False))
    return Lists(values, offsets - base)


def _first_last(lst: Lists, sums: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First and last element of each list (NaN where empty), and the row sums (zeros when
    ``sums`` is False)."""
    n = lst.offsets.size - 1
    lengths = lst.lengths
    has = lengths > 0
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    starts = lst.offsets[:-1][has]
    first[has] = lst.values[starts]
    last[has] = lst.values[lst.offsets[1:][has] - 1]
    total = np.zeros(n, dtype=np.int64)
    if sums and starts.size:
        # One pass, no running-sum array: segment i runs from the i-th non-empty row's start to
        # the next one's, which is exactly that row (empty rows in between own no values).
        # (in the values' own type: reduceat converting to another type is ~100x slower)
        total[has] = np.add.reduceat(lst.values, starts)
    return first, last, total


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Per-request metrics for every row of one batch (NaN where undefined)."""

    schedule_lag: np.ndarray  # s0 - S (the client started the request)
    connect: np.ndarray  # s - s0, NaN when a kept-alive connection was reused
    ttft: np.ndarray  # f - s
    ttft_intended: np.ndarray  # f - S
    e2e: np.ndarray  # e - s
    e2e_intended: np.ndarray  # e - S
    decode: np.ndarray  # c_m - c_1
    tpot: np.ndarray  # (c_m - c_1) / (N - k_1), N - k_1 >= 1
    tps: np.ndarray  # 1e9 / TPOT, tokens per second
    output_tokens: np.ndarray  # N = sum k_j (int64)
    decode_tokens: np.ndarray  # N - k_1 (int64, 0 when no chunks)
    chunks: np.ndarray  # m (int64)


def request_metrics(
    batch: pa.RecordBatch | pa.Table, c: Lists | None = None, k: Lists | None = None
) -> RequestMetrics:
    """Every per-request metric of docs/metrics.md for each row of ``batch`` (``c`` and ``k``:
    its chunk_ns and chunk_tokens lists, when the caller already has them)."""
    S = _f64(batch, "intended_ns")
    s0 = _f64(batch, "sent_ns")
    connect = _f64(batch, "connect_ns")
    s = s0 + np.nan_to_num(connect)
    f = _f64(batch, "first_token_ns")
    e = _f64(batch, "end_ns")
    c = lists(batch, "chunk_ns") if c is None else c
    k = lists(batch, "chunk_tokens") if k is None else k
    c1, cm, _ = _first_last(c, sums=False)
    k1, _, n_out = _first_last(k)
    k1 = np.nan_to_num(k1, nan=0.0).astype(np.int64)
    decode_tokens = n_out - k1
    decode = cm - c1
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(decode_tokens >= 1, decode / np.maximum(decode_tokens, 1), np.nan)
        tps = np.where(tpot > 0, NS / tpot, np.nan)
    # A request whose decode took zero time has infinite speed: not a number we can show.
    return RequestMetrics(
        schedule_lag=s0 - S,
        connect=connect,
        ttft=f - s,
        ttft_intended=f - S,
        e2e=e - s,
        e2e_intended=e - S,
        decode=decode,
        tpot=tpot,
        tps=tps,
        output_tokens=n_out,
        decode_tokens=decode_tokens,
        chunks=c.lengths,
    )


@dataclass(frozen=True, slots=True)
class ChunkSamples:
    """Per-chunk samples of one batch.

    ``itl`` holds one value per gap c_j - c_(j-1) (j >= 2), (c_j - c_(j-1)) / k_j in integer
    ns (floor), to be counted ``itl_weight`` = k_j times; ``chunk_gap`` holds the gaps
    themselves, one sample each; ``tokens`` holds every k_j (j >= 1).
    """

    itl: np.ndarray
    itl_weight: np.ndarray
    chunk_gap: np.ndarray
    tokens: np.ndarray


def chunk_samples(batch: pa.RecordBatch | pa.Table, rows: np.ndarray | None = None) -> ChunkSamples:
    """ITL, chunk gaps and tokens per chunk of the rows selected by the boolean ``rows``."""
    c = lists(batch, "chunk_ns")
    k = lists(batch, "chunk_tokens")
    return chunk_samples_from(c, k, rows)


def chunk_samples_from(c: Lists, k: Lists, rows: np.ndarray | None = None) -> ChunkSamples:
    if c.values.size != k.values.size or not np.array_equal(c.offsets, k.offsets):
        raise ValueError("chunk_ns and chunk_tokens differ in length")
    n = c.offsets.size - 1
    if c.values.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ChunkSamples(empty, empty, empty, empty)
    # Row of each flat position, then drop positions of unselected rows.
    keep_pos = np.ones(c.values.size, dtype=bool)
    if rows is not None and not rows[c.lengths > 0].all():
        keep_pos = np.repeat(rows[:n], c.lengths)
    # A gap ends at every position that is not the first of its row.
    is_first = np.zeros(c.values.size, dtype=bool)
    starts = c.offsets[:-1][c.lengths > 0]
    is_first[starts] = True
    gaps = np.empty(c.values.size, dtype=np.int64)
    gaps[0] = 0
    np.subtract(c.values[1:], c.values[:-1], out=gaps[1:])
    gap_pos = ~is_first
    gap_pos &= keep_pos
    gap = gaps[gap_pos]
    kj = k.values[gap_pos]
    safe_k = np.maximum(kj, 1)
    return ChunkSamples(itl=gap // safe_k, itl_weight=kj, chunk_gap=gap, tokens=k.values[keep_pos])


def served_output_tokens(
    completion: np.ndarray, streamed: np.ndarray, exact: np.ndarray
) -> np.ndarray:
    """Output tokens each request was served: the tokens its stream carried where they are
    exact (a server whose ``usage`` disagrees with its own stream is not believed: the row
    is flagged ``mismatch`` and the run counts it), else its usage's ``completion_tokens``
    (an inexact stream counts one token per content event), else the stream's count.
    ``completion`` is float with NaN for no usage; ``exact`` is ``exact_rows``."""
    usage = ~np.isnan(completion)
    return np.where(np.asarray(exact, dtype=bool) | ~usage, streamed, completion)


def exact_rows(batch: pa.RecordBatch | pa.Table) -> np.ndarray:
    """Rows whose tokens per chunk are exact: every row but those with error_kind
    ``inexact`` (the server sent neither token ids nor continuous usage). Only these rows
    count in per-token metrics (ITL, TPOT, request and session TPS, tokens per chunk)."""
    inexact = pc.equal(_col(batch, "error_kind"), INEXACT).fill_null(False)
    return ~np.asarray(inexact.to_numpy(zero_copy_only=False), dtype=bool)


def stats_rows(batch: pa.RecordBatch | pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(rows counted in latency statistics, rows counted at all): ``ok`` non-warmup rows and
    all non-warmup rows."""
    warm = _col(batch, "warmup").to_numpy(zero_copy_only=False).astype(bool)
    ok = np.asarray(
        pc.equal(_col(batch, "status"), "ok").fill_null(False).to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    counted = ~warm
    return ok & counted, counted
