"""A request's prompt as data: conversation items, prefix-block hashes, and the stored
``content`` with secrets removed. Pure functions; no I/O.

Prefix-block hashes (content mode ``hashed``, the default). The prompt is cut into blocks
of ``block_size`` units; block i's id is a BLAKE2b digest of block i and the id of block i-1, so an id stands for its block and everything before it (Mooncake semantics), and
two requests share the first n ids exactly when their prompts share the first n blocks.
The units are, best first:

1. the prompt's token ids, when a completions request sends token ids;
2. tokens of the configured tokenizer (``tokenizers`` JSON file), each prompt part
   (tools, system, every message) tokenized on its own, so a part's tokens never depend
   on what follows it;
3. otherwise bytes of the same parts, ``BYTES_PER_TOKEN`` bytes standing for one token:
   a block is ``block_size * BYTES_PER_TOKEN`` bytes. Boundaries depend only on the bytes
   before them, so they are stable as a conversation grows.

The list then has exactly ceil(input_tokens / block_size) ids (input_tokens as the server
reported it): cut at the end, or extended by ids chained from the last one, which match
another request only when the whole prompt matches. The chain starts from a seed that is
random per recording unless one is given, so an id cannot be checked against a guessed
text; a fixed seed keeps ids comparable across recordings.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def render(part: Any) -> str:
    """Text of one prompt part: its role, then text blocks as text and anything else as
    canonical JSON."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode()
    head = str(part.get("role") or part.get("type") or "")
    rest = {k: v for k, v in part.items() if k not in ("role", "content")}
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


class PromptHasher:
    """Prefix-block hash ids of request prompts (see the module text), computed with
    ``traces.hashing`` (a token block is hashed as its ids in 4-byte little-endian)."""

    def __init__(self, block_size: int, seed: int, tokenizer: Any | None = None) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.seed = seed & ((1 << 63) - 1)
        self.tokenizer = tokenizer

    @property
    def unit(self) -> str:
        return "tokens" if self.tokenizer is not None else f"bytes/{BYTES_PER_TOKEN}"

    def units(self, api: str, body: Mapping[str, Any]) -> tuple[bytes, int, int]:
        """(data, bytes per block, prompt length in tokens or estimated tokens)."""
        parts = prompt_parts(api, body)
        bs = self.block_size
        if isinstance(parts, np.ndarray):
            return parts.astype("<u4").tobytes(), bs * 4, len(parts)
        texts = [render(p) for p in parts]
        if self.tokenizer is not None:
            encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
            n = sum(len(e.ids) for e in encs)
            data = b"".join(np.asarray(e.ids, dtype="<u4").tobytes() for e in encs)
            return data, bs * 4, n
        data = "".join(texts).encode()
        return data, bs * BYTES_PER_TOKEN, -(-len(data) // BYTES_PER_TOKEN)

    def hash_ids(self, api: str, body: Mapping[str, Any],
                 input_tokens: int | None) -> tuple[list[int], int]:
        """The ids, exactly ceil(n / block_size) of them where n = ``input_tokens`` when
        known, else the estimated prompt length; and that estimate."""
        data, block_bytes, est = self.units(api, body)
        want = self.blocks(input_tokens, est)
        return fit_ids(hash_bytes(data[: want * block_bytes], block_bytes, self.seed), want), est

    def all_ids(self, api: str, body: Mapping[str, Any]) -> tuple[list[int], int]:
        """The ids of the whole prompt and its estimated length: ``hash_ids`` for any
        ``input_tokens`` is ``fit_ids(ids, blocks(input_tokens, est))``, so the ids can be
        computed before the answer tells the prompt's length."""
        data, block_bytes, est = self.units(api, body)
        return hash_bytes(data, block_bytes, self.seed), est

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
