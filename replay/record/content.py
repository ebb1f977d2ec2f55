"""A request's prompt as data: conversation items, prefix-block hashes, and the stored
``content`` with secrets removed. No I/O.

Prefix-block hashes (content mode ``hashed``, the default). The prompt is cut into blocks
of ``block_size`` units; block i's id is a BLAKE2b digest of block i and the id of block i-1, so an id stands for its block and everything before it (Mooncake semantics), and
two requests share the first n ids exactly when their prompts share the first n blocks.
The units are, best first:

1. the prompt's token ids, when a completions request sends token ids;
2. tokens of the configured tokenizer (``tokenizers`` JSON file), each prompt part
   (tools, system, every message) tokenized on its own, so a part's tokens never depend
   on what follows it;
3. otherwise bytes of the same parts.

For 2 and 3 the units are cut by the server's token count, not by a fixed ratio: the
prompt has ceil(input_tokens / block_size) blocks, and where a block ends in the bytes is
decided once per prefix (``PromptHasher``): a prompt that starts like an earlier one keeps
the earlier one's boundaries for as long as its bytes match, and the rest of its blocks
are spread evenly over the rest of its bytes. Boundaries therefore stay put as a
conversation grows, and sessions that share a system prompt and tools share its blocks,
whatever the ratio of bytes to the server's tokens (``BYTES_PER_TOKEN`` is used only to
estimate a prompt's length when the server did not report it).

A token-id prompt's list has exactly ceil(input_tokens / block_size) ids too: cut at the
end, or extended by ids chained from the last one. The chain starts from a seed that is
random per recording unless one is given, so an id cannot be checked against a guessed
text; a fixed seed keeps ids comparable across recordings.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson

from agent_replay.engines.apis import dialect
from agent_replay.traces.hashing import hash_bytes, hashes_after

BYTES_PER_TOKEN = 4
"""Fallback: bytes of prompt text that stand for one token."""


def _drop_cache_control(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _drop_cache_control(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [_drop_cache_control(v) for v in obj]
    return obj


def _norm_item(item: Any) -> Any:
    """A message as the model sees it: ``cache_control`` markers (which clients move from
    turn to turn) removed, string content written as one text block."""
    item = _drop_cache_control(item)
    if isinstance(item, dict) and isinstance(item.get("content"), str):
        item = {**item, "content": [{"type": "text", "text": item["content"]}]}
    return item


def conversation(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The conversation items of a request (``Dialect.conversation``), normalized. Empty
    where the prompt is not a conversation (completions)."""
    return [_norm_item(m) for m in dialect(api).conversation(body)]


def prompt_parts(api: str, body: Mapping[str, Any]) -> list[Any] | np.ndarray:
    """The prompt in order (tools, system/instructions, items), or a completions
    request's token ids."""
    d = dialect(api)
    if d.token_ids:  # a prompt field, not a conversation
        p = d.prompt(body)
        if isinstance(p, list) and p and isinstance(p[0], list):
            p = p[0]  # a batch of prompts: the first stands for the request
        if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
            return np.asarray(p, dtype=np.int64)
        if isinstance(p, list):
            return [str(x) for x in p]
        return [p] if isinstance(p, str) else []
    parts: list[Any] = []
    tools = d.tools(body)
    if tools:
        parts.append({"tools": _drop_cache_control(tools)})
    system = d.system(body)
    if isinstance(system, str):
        parts.append({"role": "system", "content": [{"type": "text", "text": system}]})
    elif system:
        parts.append({"role": "system", "content": _drop_cache_control(system)})
    parts.extend(conversation(api, body))
    return parts


_NOT_SEEN = frozenset({"role", "content", "id", "status"})
"""Keys of a conversation item not rendered beside its role and content: an item's own
``id`` and ``status`` (Responses items) are bookkeeping the model never reads, and a
client may give its own items fresh ids in every session (Codex does), which would end
the shared prefix of two sessions at the first such item."""


def render(part: Any, not_seen: frozenset[str] = _NOT_SEEN) -> str:
    """Text of one prompt part: its role, then text blocks as text and anything else as
    canonical JSON (without the keys in ``not_seen``: by default the item's own ``id`` and
    ``status``)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode()
    head = str(part.get("role") or part.get("type") or "")
    rest = {k: v for k, v in part.items() if k not in not_seen}
    out = [head]
    content = part.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str) and len(block) <= 2:
                out.append(block["text"])
            else:
                out.append(orjson.dumps(block, option=orjson.OPT_SORT_KEYS).decode())
    elif content is not None:
        out.append(orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode())
    if rest:
        out.append(orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode())
    return "\n".join(out) + "\n"


GRAIN_BYTES = 32
"""Prompt bytes are digested in grains of this many bytes; block boundaries fall between
grains (a 64-token block at 3-4 bytes a token spans 6-8 grains, a 16-token block 1.5-2).
A prompt that diverges from an earlier one inside it (aider drops the reminder it had
appended to the user's message) shares the blocks that end before the grain where the
bytes differ: a grain much longer than a server's block (64 bytes, about 18 tokens) lost
about a block there that the server cached."""

MAX_KNOWN_BLOCKS = 1 << 22
"""Block boundaries kept (past this, the oldest half of the prefixes they continue is
dropped; a prompt that continues one of those starts new boundaries there)."""

MAX_KNOWN_TAILS = 1 << 18
"""Prompts' last blocks kept, by the block before them (past this, the oldest half)."""

_K = 0x9E3779B97F4A7C15
_K_INV = pow(_K, -1, 1 << 64)
_MASK = (1 << 63) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise (wrapping uint64 arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_LANE_MULT = np.array(
    [
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53,
        0x27D4EB2F165667C5,
        0x94D049BB133111EB,
    ],
    dtype=np.uint64,
)


def grain_digests(data: bytes) -> np.ndarray:
    """A 64-bit digest of every ``GRAIN_BYTES`` bytes of ``data`` (the last grain padded,
    its length mixed in), vectorized: equal grains give equal digests. Not keyed: block ids
    are keyed hashes over prefixes of these (``PromptHasher``), and the digests themselves
    are never stored."""
    n = len(data)
    g = -(-n // GRAIN_BYTES)
    buf = np.zeros(g * GRAIN_BYTES, dtype=np.uint8)
    buf[:n] = np.frombuffer(data, dtype=np.uint8)
    lanes = buf.view("<u8").reshape(g, GRAIN_BYTES // 8)
    h = np.zeros(g, dtype=np.uint64)
    for j in range(lanes.shape[1]):
        h = _mix(h ^ (lanes[:, j] * _LANE_MULT[j]))
    if n % GRAIN_BYTES:
        h[-1:] = _mix(h[-1:] ^ np.uint64(n % GRAIN_BYTES))
    return h


def prefix_digests(grains: np.ndarray) -> np.ndarray:
    """``P[e]`` for e = 0..len(grains): a polynomial digest (mod 2**64) of the first e
    grains, all computed at once: P[e] = sum over i < e of grains[i] * K**(e-1-i)."""
    n = len(grains)
    inv = np.cumprod(np.full(n, _K_INV, dtype=np.uint64))  # K**-(i+1)
    pw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(n, _K, dtype=np.uint64)]))
    q = np.concatenate([[np.uint64(0)], np.cumsum(grains * inv, dtype=np.uint64)])
    return q * pw


YIELD_EVERY = 2048
"""Block ids computed between two offers of the GIL (the recorder's flush thread computes
them; a 30 MB prompt seen for the first time has 100,000 new blocks)."""


def _ids_at(seed: int, prefix: np.ndarray, ends: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Block ids (int64, >= 0) of blocks ``index`` ending at grains ``ends``: a BLAKE2b
    hash, keyed by the recording's seed, of the prefix digest at the end, the end and the
    index. An id stands for every byte before its end (Mooncake semantics), and cannot be
    checked against a guessed text without the seed."""
    key = hashlib.blake2b(key=seed.to_bytes(8, "little"), digest_size=8)
    rows = np.empty((len(ends), 3), dtype="<u8")
    rows[:, 0] = prefix[ends]
    rows[:, 1] = ends
    rows[:, 2] = index
    data = memoryview(rows.tobytes())
    out = bytearray()
    for i in range(len(ends)):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0.0005)
        h = key.copy()
        h.update(data[24 * i : 24 * i + 24])
        out += h.digest()
    return (np.frombuffer(bytes(out), dtype="<u8") & np.uint64(_MASK)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Run:
    """Full blocks one prompt placed after a known prefix: where each ends (grain), the
    prefix digest there and its id."""

    ends: np.ndarray
    digests: np.ndarray
    ids: np.ndarray

    def matching(self, prefix: np.ndarray, pos: int, most: int, start: int) -> int:
        """How many blocks from ``pos`` on (at most ``most``) a prompt with these prefix
        digests shares, having reached grain ``start``."""
        ends = self.ends[pos : pos + most]
        if not len(ends) or ends[0] < start:
            return 0
        inside = ends < len(prefix)
        same = inside & (prefix[np.where(inside, ends, 0)] == self.digests[pos : pos + len(ends)])
        return len(ends) if same.all() else int(np.argmin(same))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class PromptUnits:
    """What the block ids of one prompt are computed from (``PromptHasher.units``); small
    enough to cross from the big-body helper process."""

    prefix: np.ndarray
    """``prefix_digests`` of the rendered prompt's grains (uint64, one more than there are
    grains); empty for token-id prompts."""
    exact: np.ndarray | None
    """Token-id prompts: the ids of the prompt's own blocks (int64), else None."""
    complete: int
    """Grains wholly inside the prompt (the last one may be partial: its digest changes
    when the prompt grows, so no full block ends inside it)."""
    estimate: int
    """The prompt's length in tokens: exact for token ids and with a tokenizer, else
    ``ceil(bytes / BYTES_PER_TOKEN)``."""
    tail: bytes = b""
    """The units after the last whole grain (fewer than ``GRAIN_BYTES`` bytes)."""
    data: bytes | None = None
    """All the units, where they are at hand (not for a big body's prompt, which stays in
    the helper process): only a prompt with its units can be found to continue an earlier
    prompt's last block (``PromptHasher``)."""


@dataclass(slots=True)
class _Tail:
    """The last block of a prompt, where no later prompt's prefix digests can find it (it
    ends inside a grain, or is partial): its place, the bytes it ends with, its id."""

    index: int
    """The block's index in its prompt."""
    complete: int
    """Whole grains of the prompt."""
    digest: np.uint64
    """The prefix digest there."""
    tail: bytes
    """The prompt's bytes after them."""
    tokens: int
    """Tokens of the block (``block_size`` when full)."""
    id: int
    taken: bool = False
    """A partial block's id, once a longer prompt continued it: a second continuation (a
    sibling of the first) gets a block of its own, since the two differ after the
    partial block's end."""

    @property
    def end(self) -> int:
        return self.complete * GRAIN_BYTES + len(self.tail)


class PromptHasher:
    """Prefix-block hash ids of request prompts (see the module text).

    Where the units are not the server's tokens (bytes, or a tokenizer other than the
    server's), the server's token count decides how many blocks a prompt has and the bytes
    only where they are cut. A block boundary, once placed after a given prefix, stays
    put: a later prompt that starts with the same bytes gets the same boundaries and ids
    for as far as its bytes match (``ids``), and only the blocks after that are spread
    evenly over the remaining bytes, as many as the remaining tokens fill. So a
    conversation's next turn shares every full block of the turn before, and sessions that
    share a system prompt and tools share those blocks, whatever the bytes-per-token ratio
    of either.

    A prompt's last block usually ends inside a grain that a longer prompt fills
    differently, so prefix digests cannot find it; it is kept apart (``_Tail``). A later
    prompt that has matched every block before it and continues all of that prompt's
    bytes gets its id for the block in that place: a partial block then recurs as a full
    (or longer) one, which a prefix cache counts for the tokens the partial one filled
    (``traces.stats.implied_hits``), and a replay builds its tokens as the longer block's
    beginning. So a conversation's next turn shares the previous prompt's last, partial
    block too (on average half a block a turn, which a server with smaller blocks caches).

    The boundaries known so far are state: ``ids`` must see the requests in the order they
    finished (the recorder's flush does)."""

    def __init__(self, block_size: int, seed: int, tokenizer: Any | None = None) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.seed = seed & _MASK
        self.tokenizer = tokenizer
        self._next: dict[int, list[tuple[_Run, int]]] = {}
        """Id of a full block (-1 before the first) -> the runs of full blocks seen after
        it (and where in the run they start)."""
        self._stored = 0
        self._tails: dict[int, list[_Tail]] = {}
        """Id of the block before (-1: none) -> last blocks of prompts seen after it."""

    @property
    def unit(self) -> str:
        return "tokens" if self.tokenizer is not None else "bytes"

    def units(self, api: str, body: Mapping[str, Any]) -> PromptUnits:
        parts = prompt_parts(api, body)
        if isinstance(parts, np.ndarray):
            ids = hash_bytes(parts.astype("<u4").tobytes(), self.block_size * 4, self.seed)
            return PromptUnits(
                np.zeros(0, dtype=np.uint64), np.array(ids, dtype=np.int64), 0, len(parts)
            )
        texts = [render(p) for p in parts]
        if self.tokenizer is not None:
            encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
            est = sum(len(e.ids) for e in encs)
            data = b"".join(np.asarray(e.ids, dtype="<u4").tobytes() for e in encs)
        else:
            data = "".join(texts).encode()
            est = -(-len(data) // BYTES_PER_TOKEN)
        whole = len(data) // GRAIN_BYTES
        return PromptUnits(
            prefix_digests(grain_digests(data)), None, whole, est, data[whole * GRAIN_BYTES :], data
        )

    def hash_ids(
        self, api: str, body: Mapping[str, Any], input_tokens: int | None
    ) -> tuple[list[int], int]:
        """The ids, exactly ceil(n / block_size) of them where n = ``input_tokens`` when
        known, else the estimated prompt length; and that estimate."""
        u = self.units(api, body)
        return self.ids(u, input_tokens).tolist(), u.estimate

    def ids(self, u: PromptUnits, input_tokens: int | None) -> np.ndarray:
        """The block ids (int64) of a prompt of ``input_tokens`` tokens (the estimate when
        None; boundaries placed on an estimate are not remembered for later prompts)."""
        bs = self.block_size
        n = input_tokens if input_tokens is not None and input_tokens >= 0 else u.estimate
        want = -(-n // bs)
        if u.exact is not None:
            return fit_ids(u.exact, want)
        prefix = u.prefix
        total = max(len(prefix) - 1, 0)
        full = n // bs
        known: list[np.ndarray] = []
        k, prev, start = 0, -1, 0
        limit = min(full, want - 1)  # the last block always reaches the prompt's end
        while k < limit:  # the boundaries known after this prefix, while bytes match
            for run, pos in self._next.get(prev, ()):
                m = run.matching(prefix, pos, limit - k, start)
                if m:
                    known.append(run.ids[pos : pos + m])
                    k += m
                    prev, start = int(run.ids[pos + m - 1]), int(run.ends[pos + m - 1])
                    break
            else:
                break
        if want <= k or total == 0:
            if want > k:
                known.append(fit_ids(np.zeros(0, dtype=np.int64), want - k))
            return _joined(known)
        exact = input_tokens is not None and input_tokens >= 0  # not a guess
        cont = self._continued(prev, k, u, n, want) if exact else None
        # the rest: evenly over the remaining grains, as many blocks as the tokens left fill
        rest = n - k * bs
        j = np.arange(k, want, dtype=np.int64)
        t = np.minimum((j + 1 - k) * bs, rest)
        ends = start + (t * (total - start) + rest // 2) // rest
        inner = j < want - 1  # no inner boundary inside the last, partial grain
        ends[inner] = np.maximum(np.minimum(ends[inner], u.complete), start)
        ends[-1] = total
        if cont is not None:  # block k holds all of the continued prompt's bytes
            ends = np.maximum(ends, -(-cont.end // GRAIN_BYTES))
        new = _ids_at(self.seed, prefix, ends, j)
        if cont is not None:
            new[0] = cont.id
        # full blocks that end on a whole grain are boundaries a later prompt can reuse
        keep = full - k - (1 if full == want and total != u.complete else 0)
        if keep > 0 and exact:
            self._remember(prev, _Run(ends[:keep], prefix[ends[:keep]], new[:keep]))
        if exact and keep < want - k and u.data is not None:
            before = int(new[-2]) if want - k >= 2 else prev
            self._keep_tail(
                before,
                _Tail(
                    want - 1,
                    u.complete,
                    prefix[u.complete],
                    u.tail,
                    n - (want - 1) * bs,
                    int(new[-1]),
                ),
            )
        known.append(new)
        return _joined(known)

    def _continued(self, prev: int, k: int, u: PromptUnits, n: int, want: int) -> _Tail | None:
        """The last block of an earlier prompt that this one continues at block ``k``
        (after block ``prev``): every byte of that prompt begins this one, this one is
        longer, and its block k holds more tokens (the longest such; a partial one that a
        longer prompt already continued is not offered again)."""
        data, bs = u.data, self.block_size
        if data is None:
            return None
        best: _Tail | None = None
        for c in self._tails.get(prev, ()):
            if c.index != k or (c.taken and c.tokens < bs) or len(data) <= c.end:
                continue
            if n - k * bs < (c.tokens + 1 if c.tokens < bs else bs):
                continue
            if (
                (want - 1 > k and -(-c.end // GRAIN_BYTES) > u.complete)
                or c.complete >= len(u.prefix)
                or u.prefix[c.complete] != c.digest
            ):
                continue
            if data[c.complete * GRAIN_BYTES : c.end] == c.tail and (
                best is None or c.end > best.end
            ):
                best = c
        if best is not None and best.tokens < bs:
            best.taken = True
        return best

    def _keep_tail(self, prev: int, tail: _Tail) -> None:
        tails = self._tails.get(prev)
        if tails is None:
            if len(self._tails) >= MAX_KNOWN_TAILS:
                for key in list(itertools.islice(self._tails, len(self._tails) // 2)):
                    del self._tails[key]
            self._tails[prev] = [tail]
            return
        for c in tails:
            if c.id == tail.id and c.end == tail.end:
                return  # the same prompt again (a retry): the one kept stands
        if len(tails) < 8:
            tails.append(tail)

    def _remember(self, prev: int, run: _Run) -> None:
        nexts = self._next.get(prev)
        if nexts is None:
            if self._stored + len(run.ids) > MAX_KNOWN_BLOCKS:
                for key in list(itertools.islice(self._next, len(self._next) // 2)):
                    self._stored -= sum(len(r.ids) for r, _ in self._next.pop(key))
            self._next[prev] = [(run, 0)]
        elif len(nexts) < 8:
            nexts.append((run, 0))
        else:
            return
        self._stored += len(run.ids)

    def blocks(self, input_tokens: int | None, est: int) -> int:
        n = input_tokens if input_tokens is not None and input_tokens >= 0 else est
        return -(-n // self.block_size)


Ids = TypeVar("Ids", list[int], np.ndarray)


def fit_ids(ids: Ids, want: int) -> Ids:
    """Exactly ``want`` ids: ``ids`` cut, or extended by ids chained from the last one (a
    list stays a list, an int64 array an array)."""
    n = len(ids)
    if n >= want:
        return ids[:want]
    tail = hashes_after(ids[-1] if n else 0, n, want, "recorded:beyond-prompt")
    if isinstance(ids, np.ndarray):
        return np.concatenate([ids, np.array(tail, dtype=np.int64)])
    return ids + tail


def load_tokenizer(path: str) -> Any:
    """A ``tokenizers`` tokenizer from a ``tokenizer.json`` file."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)
