"""Prompt materialization: trace hash ids -> the prompt a server sees.

Token-id prompts (completions): every prefix-block hash id maps to ``block_size`` token
ids, deterministically: the ids come from splitmix64 over a seed that is a keyed BLAKE2b
of (salt, clone, hash id), so they are the same in every process, on every machine and
in every run with the same salt (Python's salted ``hash()`` is never used). Ids lie in
``[low, vocab_size)``: the ``low`` first ids of a vocabulary hold the special and byte
tokens in the tokenizers we know. The last block is cut so the prompt has exactly
``input_tokens`` ids. Equal hash ids give equal blocks, so a server sees exactly the prefix
sharing the trace recorded; a different salt or clone gives disjoint blocks.

Text prompts (chat, messages): each hash id maps to a deterministic run of pseudo-words;
the tail is grown or shrunk until the target's tokenizer (``POST /tokenize``, fed the same
messages the request will carry, chat template included) counts exactly ``input_tokens``.
``fit_text`` is the search, written against an injected async counter so it is tested
without a server.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

DEFAULT_VOCAB_SIZE = 32000
DEFAULT_LOW_ID = 1000
_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def block_seed(salt: int, clone: int, hash_id: int) -> int:
    """The 64-bit seed of one block: BLAKE2b keyed by nothing secret, stable everywhere."""
    raw = f"{salt & _M64}:{clone}:{hash_id}".encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def splitmix64(seed: int, n: int) -> np.ndarray:
    """``n`` splitmix64 outputs from ``seed`` as uint64 (vectorized, wrapping arithmetic)."""
    x = np.arange(1, n + 1, dtype=np.uint64)
    x *= np.uint64(_GOLDEN)
    x += np.uint64(seed & _M64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def block_ids(seed: int, n: int, vocab_size: int, low: int) -> np.ndarray:
    """``n`` token ids in ``[low, vocab_size)`` from ``seed`` (int64)."""
    span = np.uint64(vocab_size - low)
    return (splitmix64(seed, n) % span).astype(np.int64) + low


class TokenPrompts:
    """Token-id prompts from hash ids, with an LRU cache of materialized blocks."""

    def __init__(
        self,
        block_size: int,
        *,
        salt: int = 0,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        low: int = DEFAULT_LOW_ID,
        cache_blocks: int = 8192,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0 <= low < vocab_size:
            raise ValueError(f"need 0 <= low ({low}) < vocab_size ({vocab_size})")
        self.block_size = block_size
        self.salt = salt
        self.vocab_size = vocab_size
        self.low = low
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._cache_blocks = cache_blocks

    def block(self, hash_id: int, clone: int = 0) -> np.ndarray:
        key = (clone, hash_id)
        arr = self._cache.get(key)
        if arr is not None:
            self._cache.move_to_end(key)
            return arr
        arr = block_ids(block_seed(self.salt, clone, hash_id), self.block_size, self.vocab_size, self.low)
        self._cache[key] = arr
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return arr

    def prompt(self, hash_ids: Sequence[int], input_tokens: int, clone: int = 0) -> np.ndarray:
        """Exactly ``input_tokens`` ids; blocks beyond the hash ids must not be needed
        (the plan gives every row enough hash ids)."""
        bs = self.block_size
        need = -(-input_tokens // bs)
        if need > len(hash_ids):
            raise ValueError(f"{input_tokens} tokens need {need} blocks of {bs}, got {len(hash_ids)} hash ids")
        if need == 0:
            return np.zeros(0, dtype=np.int64)
        parts = [self.block(h, clone) for h in hash_ids[:need]]
        out = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        return out[:input_tokens]


# --- text prompts -------------------------------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "vi", "ro", "de", "fa", "gu", "po", "zi", "be",
              "ch", "an", "or", "el", "is", "um", "qu", "ny", "ex", "ho")


def _word(v: int) -> str:
    a = _SYLLABLES[v % 24]
    b = _SYLLABLES[(v >> 5) % 24]
    c = _SYLLABLES[(v >> 10) % 24] if (v >> 15) & 1 else ""
    return a + b + c


def block_words(seed: int, n: int) -> list[str]:
    """``n`` deterministic pseudo-words from ``seed``."""
    return [_word(int(v)) for v in splitmix64(seed, n) >> np.uint64(40)]


class TextPrompts:
    """Text built from hash ids: ``words_per_block`` words per block, then a tail."""

    def __init__(self, *, salt: int = 0, words_per_block: int = 256) -> None:
        self.salt = salt
        self.words_per_block = max(1, words_per_block)
        self._cache: OrderedDict[tuple[int, int], str] = OrderedDict()

    def prefix(self, hash_ids: Sequence[int], clone: int = 0) -> str:
        out = []
        for h in hash_ids:
            key = (clone, h)
            text = self._cache.get(key)
            if text is None:
                text = " ".join(block_words(block_seed(self.salt, clone, h), self.words_per_block))
                self._cache[key] = text
                if len(self._cache) > 4096:
                    self._cache.popitem(last=False)
            out.append(text)
        return " ".join(out)

    def tail(self, seed_key: int, n_words: int) -> str:
        if n_words <= 0:
            return ""
        return " ".join(block_words(block_seed(self.salt, -1, seed_key), n_words))


Counter = Callable[[str], Awaitable[int]]


async def fit_text(
    prefix: str,
    tail_words: Callable[[int], str],
    target: int,
    count: Counter,
    *,
    max_calls: int = 24,
) -> tuple[str, int]:
    """Find a text ``prefix + tail_words(n)`` (or a cut of the prefix) whose token count is
    ``target``. Returns (text, count); count differs from ``target`` only when the
    tokenizer cannot reach it (then the closest below is returned).

    ``count`` is the target's tokenizer applied to the request as it will be sent.
    """
    calls = 0

    async def measure(text: str) -> int:
        nonlocal calls
        calls += 1
        return await count(text)

    def join(n: int) -> str:
        t = tail_words(n)
        return f"{prefix} {t}" if prefix and t else prefix or t

    base = await measure(prefix)
    if base == target:
        return prefix, base
    if base > target:
        # The prefix alone is too long: cut words off its end.
        words = prefix.split(" ")
        wlo, whi = 0, len(words)  # count(words[:wlo]) <= target < count(words[:whi]) (assumed)
        best = ("", await measure(""))
        while wlo < whi and calls < max_calls:
            mid = (wlo + whi + 1) // 2
            text = " ".join(words[:mid])
            c = await measure(text)
            if c == target:
                return text, c
            if c < target:
                wlo, best = mid, (text, c)
            else:
                whi = mid - 1
    else:
        # Grow the tail: secant estimate first, then bisection on the word count.
        lo = 0
        n = max(1, target - base)
        hi: int | None = None
        best = (join(0), base)
        while calls < max_calls:
            text = join(n)
            c = await measure(text)
            if c == target:
                return text, c
            if c < target:
                lo, best = n, (text, c)
            else:
                hi = n
            if hi is None:
                per = max((c - base) / n, 0.25)
                n = n + max(1, int((target - c) / per))
            else:
                if hi - lo <= 1:
                    break
                n = (lo + hi) // 2
    # Word granularity may step over the target: top up with one-character words, which
    # are one token each in the tokenizers we know.
    text, c = best
    while c < target and calls < max_calls:
        cand = (text + " a" * (target - c)) if text else " ".join(["a"] * (target - c))
        cc = await measure(cand)
        if cc == target:
            return cand, cc
        if cc > target:
            break
        text, c = cand, cc
    return text, c
