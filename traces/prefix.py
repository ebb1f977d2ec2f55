"""An unbounded prefix cache fed requests in arrival order, a slice at a time.

``PrefixCache.step`` takes the next requests (in arrival order: their hash-id lists and
prompt sizes) and returns, per request, the leading blocks whose hash an earlier request
already had (``matched``: the block-level reuse) and the prompt tokens the cache serves,
counted as the server counts them (``implied``: ``traces.stats.implied_hits``' rules). What
it keeps between steps is one entry per distinct hash id (the most tokens of that block an
earlier request left), so a trace of any length is summarized in memory that grows with its
distinct blocks, not with its rows.
"""

from __future__ import annotations

import numpy as np

SERVER_BLOCK = 16
"""The server's own cache block in tokens, for the implied figures: vLLM's default block
size, and the simulated engine's."""

STEP_ELEMENTS = 1 << 19
"""Hash ids handled at once inside ``step``: its working arrays stay near 50 MB."""


SMALL_LEVEL = 1 << 16
"""Ids the small level of ``_SortedMap`` may hold before it is merged, at the least."""


class _Level:
    """Sorted distinct keys with a value each."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.vals = np.zeros(0, np.int32)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted ``keys``: where each is (or would go), and whether it is there."""
        at = np.searchsorted(self.keys, keys)
        if not self.keys.size:
            return at, np.zeros(keys.size, bool)
        return at, self.keys[np.minimum(at, self.keys.size - 1)] == keys

    def insert(self, at: np.ndarray, keys: np.ndarray, vals: np.ndarray) -> None:
        self.keys = np.insert(self.keys, at, keys)
        self.vals = np.insert(self.vals, at, vals.astype(np.int32))


class _SortedMap:
    """Hash id -> tokens, in two sorted levels: new ids go to a small level that is merged
    into the large one when it reaches an eighth of it, so that adding a slice's ids copies
    the small level, not every id seen."""

    def __init__(self) -> None:
        self.big = _Level()
        self.small = _Level()

    @property
    def size(self) -> int:
        return self.big.keys.size + self.small.keys.size

    def get(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted distinct ``keys``: whether each is held, and its value (0 if not)."""
        vals = np.zeros(keys.size, np.int64)
        known = np.zeros(keys.size, bool)
        for level in (self.big, self.small):
            at, there = level.find(keys)
            vals[there] = level.vals[at[there]]
            known |= there
        return known, vals

    def put(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Set sorted distinct ``keys`` to ``vals``."""
        new = np.ones(keys.size, bool)
        for level in (self.big, self.small):
            at, there = level.find(keys)
            level.vals[at[there]] = vals[there]
            new &= ~there
        if new.any():
            at, _ = self.small.find(keys[new])
            self.small.insert(at, keys[new], vals[new])
        if self.small.keys.size > max(SMALL_LEVEL, self.big.keys.size // 8):
            at, _ = self.big.find(self.small.keys)
            self.big.insert(at, self.small.keys, self.small.vals)
            self.small = _Level()


class PrefixCache:
    """The cache's contents: sorted distinct hash ids and, per id, the most tokens of its
    block that an earlier request left in whole ``server_block``-token blocks."""

    def __init__(self, block_size: int, server_block: int = SERVER_BLOCK) -> None:
        self.block_size = int(block_size)
        bs = self.block_size
        self.server_block = server_block if server_block > 1 and bs % server_block == 0 else 1
        self.held = _SortedMap()
        """Hash id -> the most tokens of its block held (at most ``block_size``)."""

    def step(
        self, lengths: np.ndarray, flat: np.ndarray, inputs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per request (taken in the given order, after every earlier step's): matched
        blocks and implied cached tokens. Request r has hash ids
        ``flat[starts[r]:starts[r] + lengths[r]]`` and ``inputs[r]`` prompt tokens."""
        lengths = np.asarray(lengths, np.int64)
        flat = np.asarray(flat, np.int64)
        inputs = np.asarray(inputs, np.int64)
        n = lengths.size
        matched = np.zeros(n, np.int64)
        implied = np.zeros(n, np.int64)
        ends = np.cumsum(lengths)
        lo = 0
        while lo < n:  # slices of at most STEP_ELEMENTS hash ids (at least one request)
            first = int(ends[lo - 1]) if lo else 0
            hi = max(lo + 1, int(np.searchsorted(ends, first + STEP_ELEMENTS, "right")))
            stop = int(ends[hi - 1])
            m, h = self._slice(lengths[lo:hi], flat[first:stop], inputs[lo:hi])
            matched[lo:hi] = m
            implied[lo:hi] = h
            lo = hi
        return matched, implied

    def _slice(
        self, lengths: np.ndarray, flat: np.ndarray, inputs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n = lengths.size
        bs, sb = self.block_size, self.server_block
        if flat.size == 0:
            return np.zeros(n, np.int64), np.zeros(n, np.int64)
        row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        pos = np.arange(flat.size, dtype=np.int64) - starts[row_of]
        need = np.clip(inputs[row_of] - pos * bs, 0, bs)
        cover = need // sb * sb
        # elements grouped by hash id, each group in request order (a stable sort keeps it)
        o = np.argsort(flat, kind="stable")
        fo, ro = flat[o], row_of[o]
        new_group = np.empty(o.size, bool)
        new_group[0] = True
        np.not_equal(fo[1:], fo[:-1], out=new_group[1:])
        gid = np.cumsum(new_group) - 1
        # what earlier steps left, looked up once per distinct id (sorted: cache-friendly)
        keys = fo[new_group]
        known, prior = self.held.get(keys)
        # what earlier requests of this slice left
        seen = np.empty(o.size, bool)
        seen[o] = (ro[new_group][gid] < ro) | known[gid]
        step = np.int64(bs + 1)
        running = np.maximum.accumulate(cover[o] + gid * step) - gid * step  # max so far, in group
        first_of_row = np.empty(o.size, bool)
        first_of_row[0] = True
        first_of_row[1:] = new_group[1:] | (ro[1:] != ro[:-1])
        idx = np.maximum.accumulate(np.where(first_of_row, np.arange(o.size), 0))
        before = np.where(new_group[idx], 0, running[np.maximum(idx - 1, 0)])
        have = np.empty(o.size, np.int64)
        have[o] = np.maximum(before, prior[gid])
        # per request: leading blocks seen, and tokens served up to the first block no
        # earlier request left whole
        big = np.iinfo(np.int64).max
        nonempty = lengths > 0
        matched = lengths.copy()
        stop = np.full(n, big, np.int64)
        if nonempty.any():
            first_miss = np.minimum.reduceat(np.where(seen, big, pos), starts[nonempty])
            matched[nonempty] = np.minimum(first_miss, lengths[nonempty])
            stop[nonempty] = np.minimum.reduceat(np.where(have < bs, pos, big), starts[nonempty])
        counted = pos <= stop[row_of]
        hit = np.bincount(row_of, np.where(counted, np.minimum(have, need), 0), minlength=n)
        cap = (inputs - 1) // sb * sb if sb > 1 else inputs
        implied = np.maximum(0, np.minimum(hit.astype(np.int64), cap))
        # remember this slice's blocks: the most each id's requests left, merged in
        last = np.empty(o.size, bool)
        last[:-1] = new_group[1:]
        last[-1] = True
        self.held.put(keys, np.maximum(running[last], prior))
        return matched, implied
