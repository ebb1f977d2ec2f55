"""The simulated engine's prefix cache: an LRU over hash blocks of token ids.

Block ``i`` of a prompt covers tokens ``[i*block_size, (i+1)*block_size)``; its hash
chains the hash of block ``i-1``, so a hit on block ``i`` means the whole prefix up to it is
cached (vLLM's semantics). Only full blocks are cached. Python's hash of a tuple of ints is
not salted, so hashes are the same in every process and run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``ids``."""
    out: list[int] = []
    prev = 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(ids[start : start + block_size])))
        out.append(prev)
    return out


class PrefixCache:
    """LRU of block hashes with a capacity in blocks (0 disables caching)."""

    __slots__ = ("_lru", "block_size", "capacity")

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Number of leading blocks of ``hashes`` (at most ``max_blocks``) in the cache.

        The blocks that hit become the most recently used.
        """
        lru = self._lru
        n = 0
        for h in hashes[:max_blocks]:
            if h not in lru:
                break
            lru.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: Sequence[int]) -> None:
        """Add (or refresh) blocks, evicting the least recently used beyond capacity."""
        if self.capacity <= 0:
            return
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def clear(self) -> None:
        self._lru.clear()
