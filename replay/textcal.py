"""Calibrating ``engines.prompts.AlignedText`` against the target's tokenizer, once per
run, before its first request (a few ``POST /tokenize`` calls; none per request).

1. One-token words: pseudo-words are tried in batches; a batch whose text is as many
   tokens as words is all one-token words (each word is at least one token). Batches that
   are not are halved until their words are sorted.
2. The chat template: one user message of k such words must be ``overhead + k`` tokens for
   two different k (else the words are not independent in sequence and calibration
   fails); ``head`` is how many tokens precede the content (the common prefix of two
   messages that differ in their first word).

A target without ``/tokenize`` takes ``--tokenizer`` (its tokenizer, loaded locally:
``calibrate_offline``, the template overhead then read from two real requests' usage), or
fails with a hint: ``--api completions`` (token-id prompts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent_replay.engines.prompts import AlignedText, candidate_words

TokenizeFn = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""POSTs a /tokenize body and returns the response (``count``, ``tokens``)."""

WANT_WORDS = 96
BATCH = 16


class CalibrationError(Exception):
    """The tokenizer does not behave as ``AlignedText`` needs (words not independent)."""


async def _one_token_words(
    count: Callable[[str], Awaitable[Mapping[str, Any]]], salt: int
) -> list[str]:
    """Step 1 of the module text, with ``count`` answering as ``/tokenize`` does."""
    base = int((await count(""))["count"])
    words: list[str] = []
    pending = [
        candidate_words(4 * WANT_WORDS, salt)[i : i + BATCH]
        for i in range(0, 4 * WANT_WORDS, BATCH)
    ]
    calls = 0
    while pending and len(words) < WANT_WORDS and calls < 200:
        batch = pending.pop(0)
        calls += 1
        n = int((await count(" " + " ".join(batch)))["count"]) - base
        if n == len(batch):
            words.extend(batch)
        elif len(batch) > 1:
            half = len(batch) // 2
            pending[:0] = [batch[:half], batch[half:]]
    if len(words) < 8:
        raise CalibrationError(f"only {len(words)} one-token words found")
    return words


async def calibrate(tokenize: TokenizeFn, model: str, block_size: int, salt: int) -> AlignedText:
    async def tokens_msg(text: str) -> list[int]:
        data = await tokenize({"model": model, "messages": [{"role": "user", "content": text}]})
        return [int(t) for t in data["tokens"]]

    async def count_raw(text: str) -> Mapping[str, Any]:
        return await tokenize({"model": model, "prompt": text, "add_special_tokens": False})

    words = await _one_token_words(count_raw, salt)
    k1, k2 = 37, 3 * block_size + 11
    t1 = await tokens_msg(" ".join(words[i % len(words)] for i in range(k1)))
    t2 = await tokens_msg(" ".join(words[(i + 1) % len(words)] for i in range(k2)))
    o1, o2 = len(t1) - k1, len(t2) - k2
    if o1 != o2 or o1 < 0:
        raise CalibrationError(f"template overhead differs with length ({o1} vs {o2})")
    head = 0
    while head < min(len(t1), len(t2)) and t1[head] == t2[head]:
        head += 1
    head = min(head, o1)
    return AlignedText(words, head=head, overhead=o1, block_size=block_size, salt=salt)


def load_tokenizer(name_or_path: str) -> Any:
    """A ``tokenizers`` tokenizer: a ``tokenizer.json`` file, a folder holding one, or a
    Hugging Face model name (downloaded by the ``tokenizers`` library)."""
    from pathlib import Path

    from agent_replay.errors import InputError

    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(
            "--tokenizer needs the tokenizer extra: pip install 'agent-replay[tokenizer]'"
        ) from None
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        if path.is_file():
            return Tokenizer.from_file(str(path))
        return Tokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # the library's errors: missing file, no such model, offline
        raise InputError(f"--tokenizer {name_or_path}: cannot load ({exc})") from None


ProbeFn = Callable[[str], Awaitable[int]]
"""Sends one user message of this text to the target (one output token) and returns the
prompt tokens its usage reports."""


async def calibrate_offline(
    tokenizer: Any, probe: ProbeFn, block_size: int, salt: int
) -> AlignedText:
    """``calibrate`` for a target without ``/tokenize``: one-token words from a local
    tokenizer (the target's own, given by ``--tokenizer``), the template's overhead from
    two real requests' usage. Where the content starts is not known: ``head`` 0 puts the
    blocks' words at or after the server's block boundaries, so requests that share k hash
    ids still share k server blocks."""

    async def count_prompt(text: str) -> Mapping[str, Any]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        return {"count": len(ids), "tokens": ids}

    words = await _one_token_words(count_prompt, salt)
    k1, k2 = 37, 3 * block_size + 11
    o1 = await probe(" ".join(words[i % len(words)] for i in range(k1))) - k1
    o2 = await probe(" ".join(words[(i + 1) % len(words)] for i in range(k2))) - k2
    if o1 != o2 or o1 < 0:
        raise CalibrationError(
            f"template overhead differs with length ({o1} vs {o2}): "
            "is --tokenizer the target's tokenizer?"
        )
    return AlignedText(words, head=0, overhead=o1, block_size=block_size, salt=salt)
