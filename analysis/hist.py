"""Latency histograms: HdrHistogram layout and wire format, recorded with numpy.

``Hist`` wraps ``hdrh.HdrHistogram`` (3 significant digits, integer units). It keeps the
reference layout and the V2 encoding, so snapshots are mergeable across worker processes
and readable by any HdrHistogram tool, but it records and queries through a numpy view of
the counts array: recording a request's few hundred inter-token gaps is one vectorized call
instead of a few hundred Python calls, and a percentile is one ``cumsum`` instead of a Python
loop over 30,000 buckets.

Values outside ``[0, highest]`` are not recorded: ``record`` returns ``False`` and the value
is counted in ``dropped`` (HdrHistogram itself drops them silently), so a report can show it.

``percentile_summary`` is the exact counterpart for data that fits in memory: numpy over
the raw values, inverted-CDF (the smallest observed value with at least p% of the samples at
or below it), with the sample count and a flag for percentiles the count cannot support.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
"""The percentiles every table shows (plus max)."""

DEFAULT_HIGHEST = 3_600 * 10**9
"""One hour in nanoseconds: the default upper bound of a latency histogram."""

SIGNIFICANT_FIGURES = 3

RECORD_BLOCK = 1 << 16
"""Values per step of ``Hist.record_many``."""


FEW = "*"
"""The mark of a percentile over fewer samples than ``min_count_for`` asks, everywhere."""


def min_count_for(p: float) -> int:
    """Samples a percentile needs to mean anything: P50 needs 2, P90 10, P99 100, P99.9 1000."""
    if p >= 100.0:
        return 1
    return max(1, round(1.0 / (1.0 - p / 100.0)))


@dataclass(frozen=True, slots=True)
class Summary:
    """Percentiles of one metric with the count behind them.

    ``values`` maps each percentile to its value (``None`` when there are no samples);
    ``reliable`` maps it to whether ``count`` is large enough (see ``min_count_for``).
    """

    count: int
    values: dict[float, float | None]
    max: float | None
    mean: float | None
    reliable: dict[float, bool]
    exact: bool
    dropped: int = 0

    def get(self, p: float) -> float | None:
        return self.values.get(p)


def rank(p: float, count: int) -> int:
    """1-based rank of the sample at percentile ``p`` of ``count``: the smallest r with
    r >= p% of count (inverted CDF), in integer arithmetic so that P99.9 of 20,000 is the
    19,980th sample and not the 19,981st. (The reference HdrHistogram rounds p% of count to
    the nearest integer instead; we use the same rank everywhere, exact or histogram.)"""
    milli = round(min(max(p, 0.0), 100.0) * 1000)
    return max(1, -(-milli * count // 100_000))


def _reliability(count: int, ps: Sequence[float]) -> dict[float, bool]:
    return {p: count >= min_count_for(p) for p in ps}


PERCENTILE_METHODS = ("nearest", "linear")
"""``nearest``: nearest rank (``rank``), ours everywhere. ``linear``: linear interpolation
between the closest ranks, x[floor(k)] + frac(k) (x[floor(k)+1] - x[floor(k)]) with
k = (n - 1) p / 100 (numpy's default; InferenceX's ``percentile``), for the figures that
must match InferenceX AgentX."""


def percentile_summary(
    values: np.ndarray,
    ps: Sequence[float] = PERCENTILES,
    weights: np.ndarray | None = None,
    method: str = "nearest",
) -> Summary:
    """Exact percentiles of ``values`` (NaN entries ignored), optionally weighted by integer
    ``weights`` (a value with weight k counts as k samples), by ``method`` (see
    ``PERCENTILE_METHODS``; ``linear`` takes no weights)."""
    if method not in PERCENTILE_METHODS:
        raise ValueError(f"unknown percentile method {method!r}")
    v = np.asarray(values, dtype=np.float64)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    keep = ~np.isnan(v)
    if w is not None:
        keep &= w > 0
        w = w[keep]
    v = v[keep]
    if v.size == 0:
        return Summary(0, {p: None for p in ps}, None, None, _reliability(0, ps), True)
    if method == "linear":
        return _linear(v, w, ps)
    if w is None:
        count = int(v.size)
        ranks = sorted({rank(p, count) - 1 for p in ps})
        part = np.partition(v, ranks)
        out: dict[float, float | None] = {p: float(part[rank(p, count) - 1]) for p in ps}
        mean = float(v.mean())
    else:
        count, out, mean = _weighted_nearest(v, w, ps)
    return Summary(count, out, float(v.max()), mean, _reliability(count, ps), True)


def _linear(v: np.ndarray, w: np.ndarray | None, ps: Sequence[float]) -> Summary:
    """Linear-interpolation percentiles of ``v`` (non-empty, unweighted)."""
    if w is not None:
        raise ValueError("linear percentiles take no weights")
    lin = np.percentile(v, list(ps), method="linear")
    return Summary(
        int(v.size),
        {p: float(x) for p, x in zip(ps, lin, strict=True)},
        float(v.max()),
        float(v.mean()),
        _reliability(int(v.size), ps),
        True,
    )


def _weighted_nearest(
    v: np.ndarray, w: np.ndarray, ps: Sequence[float]
) -> tuple[int, dict[float, float | None], float]:
    """Nearest-rank percentiles of ``v`` weighted by ``w`` (non-empty): the sample count,
    each percentile, the weighted mean."""
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    total = cum[-1]
    count = int(total)
    out: dict[float, float | None] = {}
    for p in ps:
        # The first value whose cumulative weight reaches the rank.
        idx = int(np.searchsorted(cum, rank(p, count), side="left"))
        out[p] = float(v[min(idx, v.size - 1)])
    return count, out, float(np.dot(v, w) / total)


def _block(c: np.ndarray | None, start: int) -> np.ndarray | None:
    return None if c is None else c[start : start + RECORD_BLOCK]


def _in_range(
    vb: np.ndarray, cb: np.ndarray | None, top: int
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The values in [0, top] with their counts, and how many samples were out of range."""
    ok = (vb >= 0) & (vb <= top)
    lost = int((~ok).sum()) if cb is None else int(cb[~ok].sum())
    return vb[ok], None if cb is None else cb[ok], lost


class Hist:
    """An HdrHistogram in integer units (ns by default) with vectorized recording."""

    __slots__ = ("_counts", "_h", "dropped")

    def __init__(
        self,
        highest: int = DEFAULT_HIGHEST,
        *,
        lowest: int = 1,
        significant_figures: int = SIGNIFICANT_FIGURES,
        _h: HdrHistogram | None = None,
    ) -> None:
        if highest >= 2**53:
            raise ValueError("highest must be below 2**53 (values are indexed through float64)")
        self._h = _h if _h is not None else HdrHistogram(lowest, highest, significant_figures)
        self._counts: np.ndarray = np.ctypeslib.as_array(self._h.counts)
        self.dropped = 0

    # -- recording ---------------------------------------------------------------------
    @property
    def highest(self) -> int:
        return int(self._h.highest_trackable_value)

    def record(self, value: int, count: int = 1) -> bool:
        """Record ``count`` samples of integer ``value``; False (and counted as dropped) when
        out of range."""
        if (
            value < 0
            or value > self._h.highest_trackable_value
            or not self._h.record_value(int(value), count)
        ):
            self.dropped += count
            return False
        return True

    def _tally(self, vb: np.ndarray, cb: np.ndarray | None, first: int, last: int) -> np.ndarray:
        """Samples per bucket of the span [first, last] of values ``vb`` (counts ``cb``)."""
        idx = self._indices(vb)
        idx -= first
        if cb is None:
            return np.bincount(idx, minlength=last + 1 - first)
        # float64 weights are exact for counts below 2**53
        return np.bincount(idx, weights=cb, minlength=last + 1 - first).astype(np.int64)

    def record_many(
        self, values: np.ndarray, counts: np.ndarray | None = None, *, also: Hist | None = None
    ) -> int:
        """Record integer ``values`` (each ``counts[i]`` times), and the same samples into
        ``also`` (a histogram of the same layout) when given: the bucket arithmetic is done
        once. Returns how many samples were dropped as out of range (also added to
        ``dropped`` of both).

        Large inputs are folded in blocks of ``RECORD_BLOCK`` values: each step's temporaries
        then stay in the CPU cache instead of streaming several arrays of the input's size
        through memory."""
        v = np.asarray(values, dtype=np.int64)
        c = None if counts is None else np.asarray(counts, dtype=np.int64)
        if v.size == 0:
            return 0
        self._check_layout(v, c, also)
        targets = [self] if also is None else [self, also]
        top = self._h.highest_trackable_value
        # counts below 2**63 read the same as int64: add into them in place
        cells = [t._counts.view(np.int64) for t in targets]
        lost = added = 0
        lo, hi = top + 1, -1
        for start in range(0, v.size, RECORD_BLOCK):
            vb, cb = v[start : start + RECORD_BLOCK], _block(c, start)
            b_lo, b_hi = int(vb.min()), int(vb.max())
            if b_lo < 0 or b_hi > top:
                vb, cb, out = _in_range(vb, cb, top)
                lost += out
                if vb.size == 0:
                    continue
                b_lo, b_hi = int(vb.min()), int(vb.max())
            added += self._add_block(cells, vb, cb, b_lo, b_hi)
            lo, hi = min(lo, b_lo), max(hi, b_hi)
        for t in targets:
            t._account(lost, added, lo, hi)
        return lost

    def _check_layout(self, v: np.ndarray, c: np.ndarray | None, also: Hist | None) -> None:
        if c is not None and c.shape != v.shape:
            raise ValueError("values and counts differ in length")
        if also is not None and also._counts.shape != self._counts.shape:
            raise ValueError("cannot record into histograms with different ranges")

    def _add_block(
        self, cells: list[np.ndarray], vb: np.ndarray, cb: np.ndarray | None, b_lo: int, b_hi: int
    ) -> int:
        """Add a block of in-range values (from ``b_lo`` to ``b_hi``) into the bucket counts
        ``cells``; the samples added."""
        # only the span of buckets this block touches (indices grow with the value)
        first, last = (
            int(self._indices(np.array([b_lo]))[0]),
            int(self._indices(np.array([b_hi]))[0]),
        )
        tally = self._tally(vb, cb, first, last)
        for cell in cells:
            cell[first : last + 1] += tally
        return int(vb.size) if cb is None else int(cb.sum())

    def _account(self, lost: int, added: int, lo: int, hi: int) -> None:
        """The totals after a ``record_many``: dropped, count, min and max (when any value
        from ``lo`` to ``hi`` was added)."""
        self.dropped += lost
        if hi >= 0:
            h = self._h
            h.total_count += added
            h.min_value = min(h.min_value, lo)
            h.max_value = max(h.max_value, hi)

    def _indices(self, v: np.ndarray) -> np.ndarray:
        """HdrHistogram's counts index of each value in [0, highest] (the reference's
        arithmetic: bucket = bit_length(v | sub_bucket_mask) - unit_magnitude
        - sub_bucket_half_count_magnitude - 1, index = ((bucket + 1) << half_count_magnitude)
        + (v >> (bucket + unit_magnitude)) - half_count), computed in place."""
        h = self._h
        hm, um = h.sub_bucket_half_count_magnitude, h.unit_magnitude
        t = np.bitwise_or(v, h.sub_bucket_mask)
        # floor(log2(x)) of 0 < x < 2**53 is the exponent field of float64(x), exactly, and
        # bit_length(x) is one more; so bucket = exponent field - 1023 - um - hm.
        bucket = t.astype(np.float64).view(np.int64)
        np.right_shift(bucket, 52, out=bucket)
        np.subtract(bucket, 1023 + um + hm, out=bucket)
        if um:
            np.add(bucket, um, out=t)
            np.right_shift(v, t, out=t)
        else:
            np.right_shift(v, bucket, out=t)
        # ((bucket + 1) << hm) - half_count == bucket << hm, as half_count == 1 << hm
        np.left_shift(bucket, hm, out=bucket)
        np.add(bucket, t, out=bucket)
        return bucket

    # -- queries -----------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self._h.total_count)

    @property
    def max(self) -> int | None:
        return int(self._h.get_max_value()) if self.count else None

    @property
    def min(self) -> int | None:
        return int(self._h.get_min_value()) if self.count else None

    def mean(self) -> float | None:
        """Mean of the bucket midpoints, weighted by their counts."""
        if not self.count:
            return None
        h = self._h
        nz = np.nonzero(self._counts)[0].astype(np.int64)
        bucket = (nz >> h.sub_bucket_half_count_magnitude) - 1
        sub = (nz & (h.sub_bucket_half_count - 1)) + h.sub_bucket_half_count
        first = bucket < 0
        sub = np.where(first, sub - h.sub_bucket_half_count, sub)
        bucket = np.where(first, 0, bucket)
        low = (sub << (bucket + h.unit_magnitude)).astype(np.float64)
        width = (np.int64(1) << (bucket + h.unit_magnitude)).astype(np.float64)
        mids = low + np.floor(width / 2)
        return float(np.dot(mids, self._counts[nz].astype(np.float64)) / self.count)

    def percentiles(self, ps: Iterable[float] = PERCENTILES) -> dict[float, int | None]:
        """Value at each percentile: the highest equivalent value of the bucket holding the
        sample of rank ``rank(p, count)`` (HdrHistogram's convention for the value)."""
        ps = list(ps)
        if not self.count:
            return {p: None for p in ps}
        cum = np.cumsum(self._counts, dtype=np.uint64)
        out: dict[float, int | None] = {}
        for p in ps:
            target = rank(p, self.count)
            idx = int(np.searchsorted(cum, target, side="left"))
            value = self._h.get_value_from_index(idx)
            out[p] = int(
                self._h.get_highest_equivalent_value(value)
                if p
                else self._h.get_lowest_equivalent_value(value)
            )
        if self.max is not None:  # never report beyond the largest recorded value's bucket
            out = {p: (min(v, self.max) if v is not None else None) for p, v in out.items()}
        return out

    def cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """The distribution as (value, fraction of samples at or below it), one point per
        occupied bucket, the value being the bucket's highest equivalent value: the
        convention of ``percentiles``, so the smallest value whose fraction reaches p% is
        the P-th percentile."""
        nz = np.nonzero(self._counts)[0]
        if nz.size == 0:
            return np.zeros(0), np.zeros(0)
        h = self._h
        values = np.array(
            [h.get_highest_equivalent_value(h.get_value_from_index(int(i))) for i in nz],
            dtype=np.float64,
        )
        values = np.minimum(values, float(self._h.get_max_value()))
        frac = np.cumsum(self._counts[nz], dtype=np.float64) / self.count
        return values, frac

    def summary(self, ps: Sequence[float] = PERCENTILES) -> Summary:
        vals = self.percentiles(ps)
        return Summary(
            self.count,
            {p: (float(v) if v is not None else None) for p, v in vals.items()},
            float(self.max) if self.max is not None else None,
            self.mean(),
            _reliability(self.count, ps),
            False,
            self.dropped,
        )

    # -- merge and wire ----------------------------------------------------------------
    def merge(self, other: Hist) -> None:
        """Add ``other``'s samples (same layout) into this histogram."""
        if other._counts.shape != self._counts.shape:
            raise ValueError("cannot merge histograms with different ranges")
        if other.count:
            self._counts += other._counts
            h = self._h
            h.total_count += other.count
            h.min_value = min(h.min_value, other._h.min_value)
            h.max_value = max(h.max_value, other._h.max_value)
        self.dropped += other.dropped

    def encode(self) -> str:
        """HdrHistogram V2 compressed, base64 (ASCII). ``dropped`` travels separately."""
        return bytes(self._h.encode()).decode("ascii")

    @classmethod
    def decode(cls, encoded: str | bytes, dropped: int = 0) -> Hist:
        raw = encoded.encode("ascii") if isinstance(encoded, str) else encoded
        base64.b64decode(raw, validate=True)  # a clear error on garbage, before hdrh's own
        h = cls(_h=HdrHistogram.decode(raw))
        h.dropped = dropped
        return h

    def copy(self) -> Hist:
        return Hist.decode(self.encode(), self.dropped)
