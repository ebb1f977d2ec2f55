"""The API dialects on the wire: request bodies and streamed-response decoding for OpenAI
completions, OpenAI chat completions and Anthropic messages (as vLLM serves them).

One place for the wire, shared by the replay client, the recorder and the tests. Pure:
no sockets, no clocks. The streaming decoders are fed the ``data`` of each SSE event and
return the number of output tokens that event carried, exactly:

* from ``token_ids`` when the request asked for ``return_token_ids`` (vLLM), counted
  without a full JSON parse (see ``count_token_ids``), or
* by differencing the cumulative ``usage.completion_tokens`` of continuous usage stats
  (``stream_options.continuous_usage_stats``), or, for Anthropic, ``usage.output_tokens``.

Tokens are never assumed to be one per chunk. A stream that carries neither is decoded
with ``exact = False`` on the decoder and one token per content event, so the caller can
flag it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

API_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
}
"""Request path per API name (the trace's ``api`` column)."""

TOKEN_ID_APIS = frozenset({"completions"})
"""APIs whose prompt can be sent as token ids."""

DONE = b"[DONE]"
_TOKEN_IDS_KEY = b'"token_ids":['


def build_request(
    api: str,
    *,
    model: str,
    prompt: Any,
    max_tokens: int,
    vllm_extras: bool = True,
    temperature: float | None = 0.0,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed request.

    ``prompt`` is a sequence of token ids (completions), a string (any API: one user
    message for chat/messages), or a list of messages (chat/messages). ``base`` is a
    recorded request body to replay: its fields are kept except the ones that control the
    stream and the output length, which are set here.

    With ``vllm_extras`` the body asks vLLM to honour the output length exactly
    (``ignore_eos``, ``min_tokens``) and to report tokens per chunk (``return_token_ids``,
    continuous usage). Servers that reject unknown fields need ``vllm_extras=False``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    body: dict[str, Any] = dict(base) if base else {}
    body["model"] = model
    body["stream"] = True
    if api == "completions":
        body["prompt"] = prompt
        body["max_tokens"] = max_tokens
    elif api == "chat":
        if prompt is not None or "messages" not in body:
            body["messages"] = _as_messages(prompt)
        body.pop("max_tokens", None)
        body["max_completion_tokens"] = max_tokens
    elif api == "messages":
        if prompt is not None or "messages" not in body:
            body["messages"] = _as_messages(prompt)
        body["max_tokens"] = max_tokens
    else:
        raise ValueError(f"unknown api {api!r}; known: {', '.join(API_PATHS)}")
    if temperature is not None and "temperature" not in body:
        body["temperature"] = temperature
    if api in ("completions", "chat"):
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": vllm_extras}
    if vllm_extras:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
        if api in ("completions", "chat"):
            body["return_token_ids"] = True
    return body


def _as_messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError("chat/messages prompts are text or a list of messages, not token ids")


def encode_body(body: Mapping[str, Any]) -> bytes:
    """JSON bytes of a body; numpy arrays of token ids serialize directly."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


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

    def feed(self, data: bytes) -> int:
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
            err = obj.get("error", obj)
            self.error = err if isinstance(err, str) else orjson.dumps(err).decode()
            return 0
        choices = obj.get("choices") or ()
        for c in choices:
            fr = c.get("finish_reason")
            if fr:
                self.finish_reason = fr
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            ct = usage.get("completion_tokens")
            if isinstance(ct, int):
                k = ct - self.tokens if choices else 0
                self.tokens = max(ct, self.tokens)
                return max(k, 0)
        if not choices:
            return 0
        # Neither token ids nor continuous usage: one token per content chunk, inexact.
        c0 = choices[0]
        text = c0.get("text")
        if text is None:
            delta = c0.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        if text:
            self.exact = False
            self.tokens += 1
            return 1
        return 0

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        """(prompt_tokens, completion_tokens, cached_tokens) from the last usage seen."""
        return usage_counts(self.usage)


def usage_counts(usage: Mapping[str, Any] | None) -> tuple[int | None, int | None, int | None]:
    if not usage:
        return None, None, None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    cached = None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        cached = details.get("cached_tokens")
    if cached is None and "cache_read_input_tokens" in usage:
        cached = usage.get("cache_read_input_tokens")
    return prompt, completion, cached


class MessagesStreamDecoder:
    """Decodes an Anthropic messages stream (``event:`` typed SSE).

    Tokens come from differencing the cumulative ``usage.output_tokens`` when delta events
    carry it. vLLM's (and Anthropic's) deltas do not: then each ``content_block_delta``
    counts one token provisionally, and the stream is exact only if the final
    ``usage.output_tokens`` equals the number of deltas: every delta carries at least one
    token, so equal totals mean every delta carried exactly one. Otherwise ``exact`` is
    False and the caller flags the request.
    """

    __slots__ = ("_counted", "_input", "_output", "_provisional", "cached", "done", "error",
                 "finish_reason", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = False
        self.finish_reason: str | None = None
        self.cached: int | None = None
        self._input: int | None = None
        self._output = 0  # tokens attributed to events so far
        self._counted: int | None = None  # the server's cumulative output_tokens
        self._provisional = False

    @property
    def exact(self) -> bool:
        if not self._provisional:
            return True
        return self._counted is not None and self._counted == self._output

    def feed(self, data: bytes, event: str | None = None) -> int:
        if data == DONE:
            self.done = True
            return 0
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("stream event is not a JSON object")
        kind = event or obj.get("type")
        if kind == "error":
            err = obj.get("error", obj)
            self.error = err if isinstance(err, str) else orjson.dumps(err).decode()
            return 0
        if kind == "message_stop":
            self.done = True
            return 0
        usage = obj.get("usage")
        if kind == "message_start":
            usage = (obj.get("message") or {}).get("usage")
        if kind == "message_delta":
            fr = (obj.get("delta") or {}).get("stop_reason")
            if fr:
                self.finish_reason = fr
        out = usage.get("output_tokens") if isinstance(usage, dict) else None
        if isinstance(usage, dict):
            self._merge_usage(usage)
        if kind == "content_block_delta":
            if isinstance(out, int):
                k = max(out - self._output, 0)
                self._output = max(out, self._output)
                self._counted = out
                return k
            self._provisional = True
            self._output += 1
            return 1
        if isinstance(out, int):
            self._counted = out
        return 0

    def _merge_usage(self, usage: Mapping[str, Any]) -> None:
        if self.usage is None:
            self.usage = {}
        for key, val in usage.items():
            if val is not None:
                self.usage[key] = val
        if isinstance(usage.get("input_tokens"), int) and usage["input_tokens"] > 0:
            self._input = usage["input_tokens"]
        if isinstance(usage.get("cache_read_input_tokens"), int):
            self.cached = usage["cache_read_input_tokens"]

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        if self.usage is None:
            return None, None, None
        # Anthropic reports uncached input in input_tokens; vLLM reports the whole prompt
        # there. Keep what the server said: callers compare it with the trace.
        return self._input, self._counted, self.cached
