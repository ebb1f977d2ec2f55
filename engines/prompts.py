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
    return splitmix64_rows([seed], n)[0]


def splitmix64_rows(seeds: Sequence[int], n: int) -> np.ndarray:
    """``splitmix64(seed, n)`` for every seed at once: one row per seed."""
    x = np.arange(1, n + 1, dtype=np.uint64)[None, :] * np.uint64(_GOLDEN)
    x = x + np.asarray([sd & _M64 for sd in seeds], dtype=np.uint64)[:, None]
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
        self._prefixes: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        """The first k blocks joined, by (clone, k-th hash id, k): a child extends its
        parent's prefix with its new blocks only (joining 3,000 blocks one by one costs
        ~2.5 ms of the event loop)."""
        self._prefix_tokens = 0

    PREFIX_CACHE_TOKENS = 16 << 20
    """Token ids kept in joined prefixes (8 bytes each)."""

    def block(self, hash_id: int, clone: int = 0) -> np.ndarray:
        return self.blocks([hash_id], clone)[0]

    def blocks(self, hash_ids: Sequence[int], clone: int = 0) -> list[np.ndarray]:
        """``block(h, clone)`` for every hash id, the missing ones generated together (one
        vectorized splitmix64 pass: block by block, 1,000 new blocks held the event loop
        for about 30 ms)."""
        cache = self._cache
        out: list[np.ndarray | None] = []
        missing: dict[int, int] = {}
        for i, h in enumerate(hash_ids):
            arr = cache.get((clone, h))
            if arr is None:
                missing.setdefault(h, i)
            else:
                cache.move_to_end((clone, h))
            out.append(arr)
        if missing:
            made = self._make(list(missing), clone)
            out = [made[h] if a is None else a for h, a in zip(hash_ids, out, strict=True)]
        return [a for a in out if a is not None]

    def _make(self, hash_ids: list[int], clone: int) -> dict[int, np.ndarray]:
        """New blocks for ``hash_ids``, in one pass, put in the cache (the least recently
        used ones leave it)."""
        span = np.uint64(self.vocab_size - self.low)
        seeds = [block_seed(self.salt, clone, h) for h in hash_ids]
        rows = (splitmix64_rows(seeds, self.block_size) % span).astype(np.int64) + self.low
        made = dict(zip(hash_ids, rows, strict=True))
        for h, row in made.items():
            self._cache[(clone, h)] = row
        while len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return made

    def uncached(self, hash_ids: Sequence[int], input_tokens: int, clone: int = 0) -> Sequence[int]:
        """The hash ids ``prompt`` would have to materialize block by block: those after
        the longest cached prefix (a caller can make them ahead, in slices, with
        ``blocks``)."""
        need = -(-input_tokens // self.block_size)
        k = min(input_tokens // self.block_size, len(hash_ids))
        while k > 0 and (clone, hash_ids[k - 1], k) not in self._prefixes:
            k -= 1
        return hash_ids[k:need]

    def prompt(self, hash_ids: Sequence[int], input_tokens: int, clone: int = 0) -> np.ndarray:
        """Exactly ``input_tokens`` ids; blocks beyond the hash ids must not be needed
        (the plan gives every row enough hash ids)."""
        bs = self.block_size
        need = -(-input_tokens // bs)
        if need > len(hash_ids):
            raise ValueError(
                f"{input_tokens} tokens need {need} blocks of {bs}, got {len(hash_ids)} hash ids"
            )
        if need == 0:
            return np.zeros(0, dtype=np.int64)
        full = input_tokens // bs
        k, head = self._longest_prefix(hash_ids, full, clone)
        parts = [head] if head is not None else []
        parts += self.blocks(hash_ids[k:need], clone)
        out = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        if full > k and full >= 2:
            self._keep_prefix(out[: full * bs].copy(), hash_ids[full - 1], full, clone)
        return out[:input_tokens]

    def _longest_prefix(
        self, hash_ids: Sequence[int], full: int, clone: int
    ) -> tuple[int, np.ndarray | None]:
        """(k, the first k blocks joined) for the longest joined prefix held of at most
        ``full`` blocks; (0, None) when none is held."""
        for k in range(full, 0, -1):
            key = (clone, hash_ids[k - 1], k)
            head = self._prefixes.get(key)
            if head is not None:
                self._prefixes.move_to_end(key)
                return k, head
        return 0, None

    def _keep_prefix(self, pre: np.ndarray, last_id: int, k: int, clone: int) -> None:
        """Hold the first ``k`` blocks joined (the least recently used prefixes leave past
        ``PREFIX_CACHE_TOKENS``)."""
        pre.setflags(write=False)  # the caller owns what it gets: ``pre`` is a copy
        cache = self._prefixes
        cache[(clone, last_id, k)] = pre
        self._prefix_tokens += pre.size
        while self._prefix_tokens > self.PREFIX_CACHE_TOKENS and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self._prefix_tokens -= old.size


# --- text prompts -------------------------------------------------------------------

_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ne",
    "su",
    "ta",
    "vi",
    "ro",
    "de",
    "fa",
    "gu",
    "po",
    "zi",
    "be",
    "ch",
    "an",
    "or",
    "el",
    "is",
    "um",
    "qu",
    "ny",
    "ex",
    "ho",
)


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


class _Fit:
    """The search of ``fit_text``, its calls to the counter counted."""

    def __init__(
        self,
        prefix: str,
        tail_words: Callable[[int], str],
        target: int,
        count: Counter,
        max_calls: int,
    ) -> None:
        self.prefix, self.tail_words, self.target = prefix, tail_words, target
        self.count, self.max_calls = count, max_calls
        self.calls = 0

    async def measure(self, text: str) -> int:
        self.calls += 1
        return await self.count(text)

    def join(self, n: int) -> str:
        t = self.tail_words(n)
        return f"{self.prefix} {t}" if self.prefix and t else self.prefix or t

    async def cut_prefix(self) -> tuple[str, int]:
        """The prefix alone is too long: cut words off its end (bisection on the word
        count). The text reaching the target, else the longest below it."""
        words = self.prefix.split(" ")
        wlo, whi = 0, len(words)  # count(words[:wlo]) <= target < count(words[:whi]) (assumed)
        best = ("", await self.measure(""))
        while wlo < whi and self.calls < self.max_calls:
            mid = (wlo + whi + 1) // 2
            text = " ".join(words[:mid])
            c = await self.measure(text)
            if c == self.target:
                return text, c
            if c < self.target:
                wlo, best = mid, (text, c)
            else:
                whi = mid - 1
        return best

    async def grow_tail(self, base: int) -> tuple[str, int]:
        """Grow the tail after the prefix (``base`` tokens): secant estimate first, then
        bisection on the word count. The text reaching the target, else the longest below
        it."""
        target = self.target
        lo, n, hi = 0, max(1, target - base), None
        best = (self.join(0), base)
        while self.calls < self.max_calls:
            text = self.join(n)
            c = await self.measure(text)
            if c == target:
                return text, c
            if c < target:
                lo, best = n, (text, c)
            else:
                hi = n
            if hi is None:
                n = n + max(1, int((target - c) / max((c - base) / n, 0.25)))
            elif hi - lo <= 1:
                break
            else:
                n = (lo + hi) // 2
        return best

    async def top_up(self, text: str, c: int) -> tuple[str, int]:
        """Word granularity may step over the target: top up with one-character words,
        which are one token each in the tokenizers we know."""
        while c < self.target and self.calls < self.max_calls:
            cand = (
                (text + " a" * (self.target - c)) if text else " ".join(["a"] * (self.target - c))
            )
            cc = await self.measure(cand)
            if cc == self.target:
                return cand, cc
            if cc > self.target:
                break
            text, c = cand, cc
        return text, c


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
    fit = _Fit(prefix, tail_words, target, count, max_calls)
    base = await fit.measure(prefix)
    if base == target:
        return prefix, base
    best = await (fit.cut_prefix() if base > target else fit.grow_tail(base))
    return await fit.top_up(*best)


# --- block-aligned text prompts -----------------------------------------------------


_COMMON = [
    "the",
    "and",
    "for",
    "are",
    "but",
    "not",
    "you",
    "all",
    "any",
    "can",
    "had",
    "her",
    "was",
    "one",
    "our",
    "out",
    "day",
    "get",
    "has",
    "him",
    "his",
    "how",
    "man",
    "new",
    "now",
    "old",
    "see",
    "two",
    "way",
    "who",
    "boy",
    "did",
    "its",
    "let",
    "put",
    "say",
    "she",
    "too",
    "use",
    "time",
    "year",
    "work",
    "back",
    "call",
    "came",
    "come",
    "each",
    "even",
    "find",
    "from",
    "give",
    "good",
    "hand",
    "have",
    "here",
    "high",
    "just",
    "keep",
    "kind",
    "know",
    "last",
    "left",
    "life",
    "line",
    "long",
    "look",
    "made",
    "make",
    "many",
    "more",
    "most",
    "move",
    "much",
    "must",
    "name",
    "near",
    "need",
    "next",
    "only",
    "open",
    "over",
    "part",
    "play",
    "read",
    "same",
    "seem",
    "show",
    "side",
    "some",
    "such",
    "take",
    "tell",
    "than",
    "that",
    "them",
    "then",
    "they",
    "this",
    "turn",
    "very",
    "want",
    "well",
    "went",
    "were",
    "what",
    "when",
    "will",
    "with",
    "word",
    "also",
    "area",
    "away",
    "best",
    "body",
    "book",
    "both",
    "case",
    "city",
    "door",
    "down",
    "face",
    "fact",
    "feel",
    "form",
    "full",
    "game",
    "girl",
    "hear",
    "help",
    "home",
    "hour",
    "idea",
    "into",
    "king",
    "land",
    "late",
    "lead",
    "less",
    "live",
    "mind",
    "miss",
    "note",
    "page",
    "plan",
    "real",
    "rest",
    "road",
    "room",
    "rule",
    "run",
    "sea",
    "set",
    "sit",
    "six",
    "ten",
    "top",
    "try",
    "war",
    "yes",
    "yet",
    "act",
    "add",
    "age",
    "ago",
    "air",
    "arm",
    "ask",
    "bad",
    "bed",
    "big",
    "box",
    "bus",
    "buy",
    "car",
    "cut",
    "dog",
    "eat",
    "end",
    "eye",
    "far",
    "few",
    "fly",
    "fun",
    "god",
    "gun",
    "hot",
    "job",
    "key",
    "kid",
    "law",
    "lay",
    "leg",
    "lie",
    "lot",
    "low",
    "map",
    "mom",
    "net",
    "oil",
    "pay",
    "per",
    "red",
    "sun",
    "tax",
    "tea",
    "win",
]


def candidate_words(n: int, salt: int = 0) -> list[str]:
    """``n`` distinct short words to calibrate against a tokenizer: common English words
    (one token in the BPE vocabularies we know), then pseudo-words of two syllables."""
    out = list(dict.fromkeys(_COMMON))[:n]
    seen = set(out)
    seed = block_seed(salt, -2, 0)
    k = 0
    while len(out) < n and k < 64:
        for v in splitmix64(seed + k, 4 * n) >> np.uint64(40):
            w = _SYLLABLES[int(v) % 24] + _SYLLABLES[(int(v) >> 5) % 24]
            if w not in seen:
                seen.add(w)
                out.append(w)
                if len(out) == n:
                    break
        k += 1
    return out


class AlignedText:
    """Text prompts built without a tokenizer round trip, block-aligned through the chat
    template.

    ``words`` are words the target's tokenizer counts as exactly one token each, also in
    sequence (calibrated once per run against ``POST /tokenize``: see
    ``replay.textcal``); one user message of k such words is ``overhead + k`` prompt tokens,
    ``head`` of them before the content. The content of a request of ``input_tokens``
    tokens is then ``input_tokens - overhead`` words: hash block 0 gives the first
    ``block_size - head`` words and block i the next ``block_size``, so the server's
    token block i holds exactly hash block i's words. The block the content ends in gives
    as many of its words as fit, the beginning of what its id gives in full: the template's
    last tokens may end the prompt inside a block the trace counts whole, and a partial
    last block may recur whole in a longer prompt; either way the server blocks before the
    template are shared. Words unique to the request fill what the hash ids do not cover.
    Equal hash ids give equal server blocks, different ones different blocks, and the count
    is exact with no request-time call.
    """

    def __init__(
        self,
        words: Sequence[str],
        *,
        head: int,
        overhead: int,
        block_size: int,
        salt: int = 0,
        cache_blocks: int = 8192,
    ) -> None:
        if len(words) < 2:
            raise ValueError("need at least 2 one-token words")
        if not 0 <= head <= overhead:
            raise ValueError(f"need 0 <= head ({head}) <= overhead ({overhead})")
        self.words = np.asarray(list(words), dtype=object)
        self.head = head
        self.overhead = overhead
        self.block_size = block_size
        self.salt = salt
        self._first = block_size - head % block_size
        self._cache: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._prefixes: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        """Joined text of the first k blocks, by (clone, k-th hash id, k): a child extends
        its parent's prefix with its new blocks only (a 3,000-block prompt costs ~10 ms
        to join block by block)."""
        self._prefix_chars = 0

    def _pick(self, seed: int, n: int) -> str:
        idx = (splitmix64(seed, n) % np.uint64(len(self.words))).astype(np.int64)
        return " ".join(self.words[idx].tolist())

    def block(self, hash_id: int, clone: int, n: int) -> str:
        key = (clone, hash_id, n)
        text = self._cache.get(key)
        if text is not None:
            self._cache.move_to_end(key)
            return text
        text = self._pick(block_seed(self.salt, clone, hash_id), n)
        self._cache[key] = text
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return text

    def _blocks(self, hash_ids: Sequence[int], start: int, end: int, clone: int) -> list[str]:
        """The texts of blocks ``start..end-1``: cached ones looked up, the others made in
        one vectorized pass (one block at a time costs ~60 us each)."""
        bs, first = self.block_size, self._first
        out: list[str | None] = []
        missing: list[int] = []
        for i in range(start, end):
            text = self._cache.get((clone, hash_ids[i], first if i == 0 else bs))
            out.append(text)
            if text is None:
                missing.append(i)
        if missing:
            seeds = [block_seed(self.salt, clone, hash_ids[i]) for i in missing]
            idx = (splitmix64_rows(seeds, bs) % np.uint64(len(self.words))).astype(np.int64)
            rows = self.words[idx].tolist()
            for i, row in zip(missing, rows, strict=True):
                n = first if i == 0 else bs
                text = " ".join(row[:n])
                out[i - start] = text
                self._cache[(clone, hash_ids[i], n)] = text
            while len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        return out  # type: ignore[return-value]

    def layout(self, n_hash_ids: int, input_tokens: int) -> tuple[int, int, int] | None:
        """(whole hash blocks used, words of the next hash block, tail words) of a prompt,
        or None when it is shorter than the template."""
        content = input_tokens - self.overhead
        if content < 1:
            return None
        bs = self.block_size
        end = self.head + content  # the server's position after the content
        full = min(n_hash_ids, end // bs)
        used = 0 if full == 0 else self._first + (full - 1) * bs
        if used > content:  # head beyond a block: nothing aligns
            return 0, 0, content
        part = content - used if full < n_hash_ids else 0
        return full, part, content - used - part

    def prompt(
        self, hash_ids: Sequence[int], input_tokens: int, clone: int, tail_key: int
    ) -> str | None:
        """The user message's text, or None when ``input_tokens`` is below the template's
        own tokens."""
        lay = self.layout(len(hash_ids), input_tokens)
        if lay is None:
            return None
        full, part, tail = lay
        prefix = self._prefix(hash_ids, full, clone)
        pieces = [prefix] if prefix else []
        if part:
            pieces.append(self.block(hash_ids[full], clone, part))
        if tail:
            pieces.append(self._pick(block_seed(self.salt, -1, tail_key), tail))
        return " ".join(pieces)

    PREFIX_CACHE_CHARS = 128 << 20

    def _prefix(self, hash_ids: Sequence[int], full: int, clone: int) -> str:
        """The joined words of the first ``full`` hash blocks, from the longest cached
        prefix (ids chain, so one id stands for its whole prefix)."""
        if full == 0:
            return ""
        cache = self._prefixes
        k = full
        text = ""
        while k > 0:
            hit = cache.get((clone, hash_ids[k - 1], k))
            if hit is not None:
                text = hit
                cache.move_to_end((clone, hash_ids[k - 1], k))
                break
            k -= 1
        if k == full:
            return text
        parts = [text] if text else []
        parts += self._blocks(hash_ids, k, full, clone)
        text = " ".join(parts)
        cache[(clone, hash_ids[full - 1], full)] = text
        self._prefix_chars += len(text)
        while self._prefix_chars > self.PREFIX_CACHE_CHARS and len(cache) > 1:
            _, old = cache.popitem(last=False)
            self._prefix_chars -= len(old)
        return text
