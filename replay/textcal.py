"""Calibrating ``engines.prompts.AlignedText`` against the target's tokenizer, once per
run, before its first request (a few ``POST /tokenize`` calls; none per request).

1. One-token words: pseudo-words are tried in batches; a batch whose text is as many
   tokens as words is all one-token words (each word is at least one token). Batches that
   are not are halved until their words are sorted.
2. The chat template: one user message of k such words must be ``overhead + k`` tokens for
   two different k (else the words are not independent in sequence and calibration
   fails); ``head`` is how many tokens precede the content (the common prefix of two
   messages that differ in their first word).

A target without ``/tokenize`` fails with a hint: ``--api completions`` (token-id prompts)
or an offline tokenizer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from engines.prompts import AlignedText, candidate_words

TokenizeFn = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""POSTs a /tokenize body and returns the response (``count``, ``tokens``)."""

WANT_WORDS = 96
BATCH = 16


class CalibrationError(Exception):
    """The tokenizer does not behave as ``AlignedText`` needs (words not independent)."""


async def calibrate(tokenize: TokenizeFn, model: str, block_size: int, salt: int
                    ) -> AlignedText:
    async def count_prompt(text: str) -> int:
        return int((await tokenize({"model": model, "prompt": text,
                                    "add_special_tokens": False}))["count"])

    async def tokens_msg(text: str) -> list[int]:
        data = await tokenize({"model": model,
                               "messages": [{"role": "user", "content": text}]})
        return [int(t) for t in data["tokens"]]

    base = await count_prompt("")
    words: list[str] = []
    pending = [candidate_words(4 * WANT_WORDS, salt)[i:i + BATCH]
               for i in range(0, 4 * WANT_WORDS, BATCH)]
    calls = 0
    while pending and len(words) < WANT_WORDS and calls < 200:
        batch = pending.pop(0)
        calls += 1
        n = await count_prompt(" " + " ".join(batch)) - base
        if n == len(batch):
            words.extend(batch)
        elif len(batch) > 1:
            half = len(batch) // 2
            pending[:0] = [batch[:half], batch[half:]]
    if len(words) < 8:
        raise CalibrationError(f"only {len(words)} one-token words found")
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
