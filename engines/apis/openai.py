"""What OpenAI's completions and chat completions share on the wire (as vLLM serves them):
the stream decoder, the token-id counter, the usage options and the usage the recorder asks
for.

The decoder is fed the ``data`` of each SSE event and returns the number of output tokens
that event carried, exactly:

* from ``token_ids`` when the request asked for ``return_token_ids`` (vLLM), counted
  without a full JSON parse (see ``count_token_ids``), or
* by differencing the cumulative ``usage.completion_tokens`` of continuous usage stats
  (``stream_options.continuous_usage_stats``).

Tokens are never assumed to be one per chunk. A stream that carries neither is decoded with
``exact = False`` and one token per content event, so the caller can flag it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from agent_replay.engines.apis.base import DONE, Dialect, error_text, usage_counts

_TOKEN_IDS_KEY = b'"token_ids":['
INJECT_USAGE = b'"stream_options":{"include_usage":true},'
"""Spliced after a body's opening brace to ask for the final usage chunk."""


def count_token_ids(data: bytes) -> int:
    """Output token ids in one OpenAI/vLLM stream event, -1 when it has no ``token_ids`` list.

    Finds the ``"token_ids":[`` key and counts the commas up to the closing bracket. That
    byte sequence cannot occur inside a JSON string (its quotes would be escaped) and
    ``"prompt_token_ids"`` does not contain it, so for the single-choice streams vLLM sends
    this equals ``len(choices[0]["token_ids"])`` of a full parse (tests prove it on
    captured streams).
    """
    i = data.find(_TOKEN_IDS_KEY)
    if i < 0:
        return -1
    start = i + 13
    end = data.find(b"]", start)
    if end < 0:
        return -1
    if end == start:
        return 0
    return data.count(b",", start, end) + 1


def _has_content(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice carries output: text, content, reasoning or tool calls."""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
    return bool(text)


class StreamDecoder:
    """Decodes one OpenAI-style (completions or chat) stream, event by event.

    ``feed(data)`` returns the output tokens the event carried (0 for events without
    output, e.g. the chat role chunk or the final usage chunk). After the stream, ``usage``
    is the last usage object seen, ``error`` the first error payload, ``done`` whether
    ``[DONE]`` arrived.
    """

    __slots__ = ("done", "error", "exact", "finish_reason", "tokens", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = False
        self.exact = True
        self.finish_reason: str | None = None
        self.tokens = 0
        """Output tokens counted so far."""

    def feed(self, data: bytes, event: str | None = None) -> int:
        k = count_token_ids(data)
        if k >= 0:
            self.tokens += k  # the hot path: no JSON parse
            return k
        if data == DONE:
            self.done = True
            return 0
        obj = orjson.loads(data)  # may raise orjson.JSONDecodeError: the caller classifies
        if not isinstance(obj, dict):
            raise ValueError("stream event is not a JSON object")
        if "error" in obj or obj.get("object") == "error":
            self.error = error_text(obj)
            return 0
        choices = obj.get("choices") or ()
        self._note_finish(choices)
        counted = self._usage_tokens(obj.get("usage"), bool(choices))
        if counted is not None:
            return counted
        if choices and _has_content(choices[0]):
            # Neither token ids nor continuous usage: one token per content chunk, inexact.
            self.exact = False
            self.tokens += 1
            return 1
        return 0

    def _note_finish(self, choices: Any) -> None:
        for c in choices:
            self.finish_reason = c.get("finish_reason") or self.finish_reason

    def _usage_tokens(self, usage: Any, has_choices: bool) -> int | None:
        """Keep the event's usage; the new output tokens its ``completion_tokens`` count
        (0 on a usage-only event), None when it has none."""
        if not isinstance(usage, dict):
            return None
        self.usage = usage
        ct = usage.get("completion_tokens")
        if not isinstance(ct, int):
            return None
        k = ct - self.tokens if has_choices else 0
        self.tokens = max(ct, self.tokens)
        return max(k, 0)

    def count_span(self, data: bytes, start: int, end: int) -> int:
        """``feed(data[start:end])`` for an event with a ``token_ids`` list, without copying
        the event out of the read; -1 (nothing counted, nothing changed) for any other
        event, which the caller then passes to ``feed``. Same count as
        ``count_token_ids(data[start:end])``."""
        # Searches without an end bound (checked after): on CPython 3.11 each bound costs
        # an argument conversion, a fair share of this per-chunk call.
        i = data.find(_TOKEN_IDS_KEY, start)
        if i < 0 or i + 13 > end:
            return -1
        s = i + 13
        e = data.find(b"]", s)
        if e < 0 or e >= end:
            return -1
        k = data.count(b",", s, e) + 1 if e > s else 0
        self.tokens += k
        return k

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        """(prompt_tokens, completion_tokens, cached_tokens) from the last usage seen."""
        return usage_counts(self.usage)


class OpenAIDialect(Dialect):
    """Completions and chat completions: ``stream_options`` usage, vLLM's token ids."""

    def _extras(self, body: dict[str, Any], max_tokens: int, vllm_extras: bool) -> None:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": vllm_extras}
        super()._extras(body, max_tokens, vllm_extras)
        if vllm_extras:
            body["return_token_ids"] = True

    def decoder(self) -> StreamDecoder:
        return StreamDecoder()

    def with_usage(self, raw: bytes, body: Mapping[str, Any]) -> bytes | None:
        """A stream that does not ask for ``stream_options.include_usage`` gets it (the
        prompt and output counts come from the final usage chunk, which the recorder
        later removes from what the client sees)."""
        if not self.streams(body):
            return None
        so = body.get("stream_options")
        if "stream_options" not in body:
            # Splice after the opening brace: every other byte of the body stays as sent.
            i = raw.index(b"{")
            return raw[: i + 1] + INJECT_USAGE + raw[i + 1 :]
        if so is None or (isinstance(so, Mapping) and so.get("include_usage") is not True):
            new = dict(body)
            new["stream_options"] = {**(so or {}), "include_usage": True}
            return orjson.dumps(new)
        return None
