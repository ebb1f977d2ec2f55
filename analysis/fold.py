"""Per-chunk samples folded straight into histograms, a block of rows at a time.

A million results rows hold ~80 million chunks. ``chunk_samples`` materializes every ITL and
chunk-gap sample of a batch (several arrays of the batch's chunk count); ``fold_chunks``
computes the same samples (docs/metrics.md: chunk gap c_j - c_(j-1), ITL the gap / k_j counted
k_j times, tokens per chunk k_j) for a few thousand rows at a time and adds them to the
histograms at once, so its temporaries stay in the CPU cache. The samples and their counts
are exactly those of ``chunk_samples``.
"""

from __future__ import annotations

import numpy as np

from agent_replay.analysis.hist import Hist
from agent_replay.analysis.metrics import Lists

FOLD_BLOCK = 1 << 16
"""Chunks per step (rows are never split across steps)."""


def _cuts(offsets: np.ndarray, block: int) -> np.ndarray:
    """Row indices splitting the rows into steps of about ``block`` chunks each."""
    n = offsets.size - 1
    total = int(offsets[-1])
    if total <= block:
        return np.array([0, n], dtype=np.int64)
    targets = np.arange(block, total, block, dtype=np.int64)
    cuts = np.searchsorted(offsets, targets, side="right")
    return np.unique(np.concatenate(([0], np.clip(cuts, 1, n), [n])))


def fold_chunks(
    c: Lists,
    k: Lists,
    rows: np.ndarray | None,
    itl: Hist,
    gap: Hist,
    block: int = FOLD_BLOCK,
    exact: np.ndarray | None = None,
) -> np.ndarray:
    """Record the ITL and chunk-gap samples of the rows selected by the boolean ``rows``
    (None: every row) into ``itl`` and ``gap``; return the tokens-per-chunk counts of those
    rows (``out[k]`` = chunks carrying k tokens).

    ``exact`` (boolean per row, None: every row) marks the rows whose tokens per chunk are
    exact: the chunk gaps of every selected row are recorded, the ITL samples and tokens per
    chunk only of the selected rows that are exact."""
    _check_same_lists(c, k)
    offsets = c.offsets
    tpc = np.zeros(0, dtype=np.int64)
    if c.values.size == 0:
        return tpc
    n = offsets.size - 1
    lengths = np.diff(offsets)
    every = _all_with_chunks(rows, n, lengths)
    all_exact = _all_with_chunks(exact, n, lengths)
    cuts = _cuts(offsets, block)
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        a, b = int(offsets[r0]), int(offsets[r1])
        if a == b:
            continue
        cv = c.values[a:b]
        kv = k.values[a:b]
        # keep[i]: position a + i is a gap's end (not a row's first chunk) of a selected row
        keep = np.ones(b - a, dtype=bool)
        starts = offsets[r0:r1] - a
        keep[starts[starts < b - a]] = False
        sel = None
        if not every:
            sel = np.repeat(rows[r0:r1], lengths[r0:r1])  # type: ignore[index]
            keep &= sel
        keep_itl = None  # gap ends whose ITL samples count (None: the same as keep)
        if not all_exact:
            ex = np.repeat(exact[r0:r1], lengths[r0:r1])  # type: ignore[index]
            keep_itl = keep & ex
            sel = ex if sel is None else sel & ex
        tpc = add_counts(tpc, _chunk_counts(kv if sel is None else kv[sel]))
        _record_gaps(cv, kv, keep, keep_itl, itl, gap)
    return tpc


def _check_same_lists(c: Lists, k: Lists) -> None:
    if c.values.size != k.values.size or not np.array_equal(c.offsets, k.offsets):
        raise ValueError("chunk_ns and chunk_tokens differ in length")


def _all_with_chunks(flags: np.ndarray | None, n: int, lengths: np.ndarray) -> bool:
    """Whether every row with chunks is flagged (None: every row is)."""
    return flags is None or bool(flags[:n][lengths > 0].all())


def add_counts(total: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``total + counts`` of two bincounts of any lengths (in place into the longer one)."""
    if counts.size > total.size:
        counts[: total.size] += total
        return counts
    total[: counts.size] += counts
    return total


def _chunk_counts(kt: np.ndarray) -> np.ndarray:
    """Chunks per token count (``out[k]``: chunks carrying k tokens); a negative count,
    unknown, is left out."""
    if kt.size and kt.min() < 0:
        kt = kt[kt >= 0]
    return np.bincount(kt)


def _record_gaps(
    cv: np.ndarray,
    kv: np.ndarray,
    keep: np.ndarray,
    keep_itl: np.ndarray | None,
    itl: Hist,
    gap: Hist,
) -> None:
    """The chunk gaps ending at ``keep`` into ``gap``, and their ITL samples (each gap over
    its chunk's tokens) into ``itl``, only those ending at ``keep_itl`` when given."""
    d = np.subtract(cv[1:], cv[:-1])
    g = d[keep[1:]]
    if keep_itl is not None:
        gap.record_many(g)
        gi = d[keep_itl[1:]]
        ki = kv[1:][keep_itl[1:]]
        itl.record_many(_floor_div(gi, ki, d), ki)
        return
    kj = kv[1:][keep[1:]]
    if kj.size and kj.min() == 1 and kj.max() == 1:
        # one token per chunk (no speculative decoding): each ITL sample is the gap
        gap.record_many(g, also=itl)
    else:
        gap.record_many(g)
        itl.record_many(_floor_div(g, kj, d), kj)


def _floor_div(g: np.ndarray, k: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """g // max(k, 1), through float64 (exact for |g| < 2**53: the correctly rounded
    quotient of two such integers never crosses an integer) and several times faster than
    integer division; written into ``scratch``."""
    if k.size and k.min() < 1:
        k = np.maximum(k, 1)
    q = np.true_divide(g, k)
    np.floor(q, out=q)
    out = scratch[: g.size]
    out[...] = q
    return out
