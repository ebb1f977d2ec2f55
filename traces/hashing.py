"""Stable prefix-block hashes (Mooncake semantics: each id covers its block and every
block before it). Never Python's salted ``hash()``: the same input gives the same ids in
every process, on every machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_MASK = (1 << 63) - 1


def _h(prev: int, payload: bytes) -> int:
    d = hashlib.blake2b(prev.to_bytes(8, "little", signed=False) + payload, digest_size=8).digest()
    return int.from_bytes(d, "little") & _MASK


def hash_bytes(data: bytes, block_bytes: int, seed: int = 0) -> list[int]:
    """Prefix hashes of ``data`` cut into ``block_bytes``-byte blocks (last one may be short)."""
    out: list[int] = []
    prev = seed & _MASK
    for start in range(0, len(data), block_bytes):
        prev = _h(prev, data[start : start + block_bytes])
        out.append(prev)
    return out


def hash_tokens(token_ids: Sequence[int], block_size: int, seed: int = 0) -> list[int]:
    """Prefix hashes of token ids cut into ``block_size``-token blocks."""
    out: list[int] = []
    prev = seed & _MASK
    for start in range(0, len(token_ids), block_size):
        block = token_ids[start : start + block_size]
        prev = _h(prev, b"".join(int(t).to_bytes(4, "little", signed=False) for t in block))
        out.append(prev)
    return out


def extend_hashes(shared: Sequence[int], n_blocks: int, tag: str) -> list[int]:
    """``n_blocks`` prefix hashes whose first ``len(shared)`` are ``shared`` and whose
    remaining ids are new, derived from the last shared id and ``tag`` (which must be
    unique per request, e.g. ``"file#session#index"``). For sources that give token counts
    and cache figures but no content."""
    shared = list(shared[:n_blocks])
    return shared + hashes_after(shared[-1] if shared else 0, len(shared), n_blocks, tag)


def hashes_after(last: int, start: int, n_blocks: int, tag: str) -> list[int]:
    """The new ids of ``extend_hashes`` alone: blocks ``start`` to ``n_blocks - 1``
    chained from ``last``, the id of block ``start - 1`` (0 when ``start`` is 0)."""
    out: list[int] = []
    prev = int(last)
    tag_b = tag.encode()
    for k in range(start, n_blocks):
        prev = _h(prev, tag_b + k.to_bytes(4, "little"))
        out.append(prev)
    return out


def chain_hashes(
    parent_ids: Sequence[int] | None,
    parent_input: int | None,
    input_tokens: int,
    cached_tokens: int | None,
    block_size: int,
    tag: str,
) -> list[int]:
    """Hash ids for a request of a content-less source that gives token counts.

    The conversation is taken as append-only: a request whose prompt is at least as long as
    its parent's starts with the parent's prompt, so it shares the parent's full blocks.
    A shorter prompt (the context was compacted or reset) shares only the prefix the
    original server reported as cached (``cached_tokens``), none when unknown.
    """
    n_blocks = -(-input_tokens // block_size)
    if not parent_ids or parent_input is None:
        return extend_hashes([], n_blocks, tag)
    shared_tokens = parent_input if input_tokens >= parent_input else (cached_tokens or 0)
    shared_blocks = min(shared_tokens, input_tokens, parent_input) // block_size
    return extend_hashes(list(parent_ids[:shared_blocks]), n_blocks, tag)


def cached_prefix_hashes(
    parent_ids: Sequence[int] | None,
    cached_tokens: int,
    input_tokens: int,
    block_size: int,
    tag: str,
    shared_tag: str,
) -> list[int]:
    """Hash ids for a request of a content-less source that reports how much of its prompt
    the server had cached: the request's ``cached_tokens`` are its parent's leading blocks
    (as many full blocks as the count covers, at most all of the parent's), and the rest
    are new (``tag``). A request without a parent whose prompt was cached shares that
    prefix with every other such request of the same ``shared_tag`` (a system prompt the
    server had from another session)."""
    n_blocks = -(-input_tokens // block_size)
    k = min(max(cached_tokens, 0), input_tokens) // block_size
    if parent_ids:
        shared = list(parent_ids[:k])
    else:
        shared = hashes_after(0, 0, k, shared_tag)
    return extend_hashes(shared, n_blocks, tag)
