"""The API dialects on the wire: request bodies and streamed-response decoding for OpenAI
completions, OpenAI chat completions, OpenAI responses and Anthropic messages (as vLLM
serves them).

One object per API (``DIALECTS``, a ``Dialect`` each): its path, request builder, stream
decoder, usage reader, conversation items and reply reconstruction (for the recorder) and
the simulated engine's parser and encoder, so the replay client, the recorder and the
simulated engine speak an API through the same object. Pure: no sockets, no clocks. The streaming decoders are fed the ``data`` of each SSE event and
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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from agent_replay.engines.replies import Reply, reply_from_events, reply_from_json
from agent_replay.engines.sse import SSEEvent

API_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
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
    elif api == "responses":
        if prompt is not None or "input" not in body:
            body["input"] = _as_messages(prompt)
        body.pop("max_tokens", None)
        body["max_output_tokens"] = max_tokens
        body.pop("previous_response_id", None)  # a replay sends the whole conversation
        body["store"] = False
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


_RESPONSES_DELTAS = frozenset({
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
})
_RESPONSES_END = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStreamDecoder:
    """Decodes an OpenAI Responses stream (``response.*`` events).

    Each delta event (output text, function-call arguments, reasoning, refusal) counts one
    token provisionally; the final ``response.completed`` carries ``usage.output_tokens``.
    As with Anthropic streams, the counts are exact when that total equals the number of
    deltas (every delta carries at least one token); otherwise ``exact`` is False. The
    simulated engine sends one delta per engine step, so without speculation it is exact.
    """

    __slots__ = ("_counted", "_output", "done", "error", "finish_reason", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = False
        self.finish_reason: str | None = None
        self._output = 0
        self._counted: int | None = None

    @property
    def exact(self) -> bool:
        return self._counted is not None and self._counted == self._output

    def feed(self, data: bytes, event: str | None = None) -> int:
        if data == DONE:
            return 0
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("stream event is not a JSON object")
        kind = event or obj.get("type")
        if kind in _RESPONSES_DELTAS:
            if obj.get("delta"):
                self._output += 1
                return 1
            return 0
        if kind in _RESPONSES_END:
            self.done = True
            resp = obj.get("response") or {}
            usage = resp.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
                out = usage.get("output_tokens")
                if isinstance(out, int):
                    self._counted = out
            if resp.get("error"):
                self.error = orjson.dumps(resp["error"]).decode()
            status = resp.get("status")
            details = resp.get("incomplete_details") or {}
            self.finish_reason = ("length" if details.get("reason") == "max_output_tokens"
                                  else status if isinstance(status, str) else None)
        elif kind == "error":
            err = obj.get("error", obj)
            self.error = err if isinstance(err, str) else orjson.dumps(err).decode()
        return 0

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        return read_usage(self.usage)


def read_usage(usage: Any, uncached_input: bool = False
               ) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens, output tokens, cached prompt tokens) of a usage object of any API.

    Messages usage: vLLM reports the whole prompt in ``input_tokens``; Anthropic's API
    (``uncached_input``) only the uncached part, the prompt being that plus
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``. Responses usage has
    ``input_tokens`` and ``input_tokens_details.cached_tokens``."""
    if not isinstance(usage, dict):
        return None, None, None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        inp = usage.get("input_tokens")
        read = usage.get("cache_read_input_tokens") or 0
        made = usage.get("cache_creation_input_tokens") or 0
        total = inp + (read + made if uncached_input else 0) if isinstance(inp, int) else None
        out = usage.get("output_tokens")
        return total, out if isinstance(out, int) else None, read if isinstance(read, int) else None
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and "prompt_tokens" not in usage:
        return usage.get("input_tokens"), usage.get("output_tokens"), details.get("cached_tokens")
    return usage_counts(usage)


Decoder = StreamDecoder | MessagesStreamDecoder | ResponsesStreamDecoder


class Dialect:
    """One API: everything the replay client, the recorder and the simulated engine need
    to speak it. Instances live in ``DIALECTS``; look one up with ``dialect(name)``."""

    __slots__ = ("name", "path", "token_ids", "typed_events")

    def __init__(self, name: str, *, token_ids: bool = False, typed_events: bool = False) -> None:
        self.name = name
        self.path = API_PATHS[name]
        self.token_ids = token_ids
        """The prompt can be sent as token ids."""
        self.typed_events = typed_events
        """Stream events carry an ``event:`` name the decoder is fed with the data."""

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"

    # the client side ----------------------------------------------------------------

    def build(self, *, model: str, prompt: Any, max_tokens: int, vllm_extras: bool = True,
              temperature: float | None = 0.0, base: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
        """The JSON body of a streamed request (see ``build_request``)."""
        return build_request(self.name, model=model, prompt=prompt, max_tokens=max_tokens,
                             vllm_extras=vllm_extras, temperature=temperature, base=base)

    def decoder(self) -> Decoder:
        """A fresh stream decoder; ``feed(data)`` (``feed(data, event)`` when
        ``typed_events``) returns the output tokens of one event."""
        if self.name == "messages":
            return MessagesStreamDecoder()
        if self.name == "responses":
            return ResponsesStreamDecoder()
        return StreamDecoder()

    def usage(self, usage: Any, uncached_input: bool = False
              ) -> tuple[int | None, int | None, int | None]:
        """(prompt, output, cached) tokens of this API's usage object."""
        return read_usage(usage, uncached_input)

    # the recorder side --------------------------------------------------------------

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """The conversation items a request carries (messages, Responses input items),
        as sent; empty for completions."""
        if self.name in ("chat", "messages"):
            msgs = body.get("messages")
            return list(msgs) if isinstance(msgs, list) else []
        if self.name == "responses":
            inp = body.get("input")
            if isinstance(inp, str):
                return [{"role": "user", "content": inp}]
            return list(inp) if isinstance(inp, list) else []
        return []

    def system(self, body: Mapping[str, Any]) -> Any:
        """The system prompt outside the conversation items (messages ``system``,
        responses ``instructions``), or None."""
        if self.name == "messages":
            return body.get("system")
        if self.name == "responses":
            return body.get("instructions")
        return None

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        """The model's reply carried by a recorded stream."""
        return reply_from_events(self.name, events)

    def reply_from_json(self, obj: Any) -> Reply | None:
        """The model's reply in a non-streamed response body."""
        return reply_from_json(self.name, obj)

    # the simulated engine's side ----------------------------------------------------

    def sim_parse(self, body: bytes, tok: Any, model_name: str, max_model_len: int) -> Any:
        """The simulated engine's ``ParsedRequest`` of a request body (or ``BadRequest``)."""
        from agent_replay.engines.sim import requests

        parse = {"completions": requests.parse_completions, "chat": requests.parse_chat,
                 "messages": requests.parse_messages,
                 "responses": requests.parse_responses}[self.name]
        return parse(body, tok, model_name, max_model_len)

    def sim_encoder(self, *, rid: str, created: int, model: str, table: Any, parsed: Any) -> Any:
        """The simulated engine's encoder of one streamed response: ``chunk(ids, finish)``
        per engine step and ``final(cached, finish)``."""
        from agent_replay.engines.sim import wire

        if self.name == "messages":
            return wire.MessagesEncoder(rid=rid, model=model, table=table,
                                        prompt_tokens=len(parsed.prompt_ids),
                                        tool_call=parsed.tool_call)
        if self.name == "responses":
            return wire.ResponsesEncoder(rid=rid, created=created, model=model, table=table,
                                         prompt_tokens=len(parsed.prompt_ids),
                                         tool_call=parsed.tool_call)
        if self.name == "chat":
            return wire.ChatEncoder(rid=rid, created=created, model=model, table=table,
                                    prompt_ids=parsed.prompt_ids,
                                    return_token_ids=parsed.return_token_ids,
                                    include_usage=parsed.include_usage,
                                    continuous_usage=parsed.continuous_usage,
                                    tool_call=parsed.tool_call)
        return wire.CompletionsEncoder(rid=rid, created=created, model=model, table=table,
                                       prompt_ids=parsed.prompt_ids,
                                       return_token_ids=parsed.return_token_ids,
                                       include_usage=parsed.include_usage,
                                       continuous_usage=parsed.continuous_usage)

    @property
    def id_prefix(self) -> str:
        """The prefix of a response id (``cmpl-``, ``chatcmpl-``, ``msg_``, ``resp_``)."""
        return {"completions": "cmpl-", "chat": "chatcmpl-", "messages": "msg_",
                "responses": "resp_"}[self.name]


DIALECTS: dict[str, Dialect] = {
    "completions": Dialect("completions", token_ids=True),
    "chat": Dialect("chat"),
    "messages": Dialect("messages", typed_events=True),
    "responses": Dialect("responses", typed_events=True),
}
"""Every API, by the trace's ``api`` name."""


def dialect(name: str) -> Dialect:
    """The dialect of an API name; ``ValueError`` naming the known ones otherwise."""
    d = DIALECTS.get(name)
    if d is None:
        raise ValueError(f"unknown api {name!r}; known: {', '.join(DIALECTS)}")
    return d
