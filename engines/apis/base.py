"""The ``Dialect`` interface: one API on the wire, for the replay client, the recorder and the
simulated engine alike. Pure: no sockets, no clocks.

A dialect builds a streamed request body, decodes the streamed answer event by event
(output tokens per event, exactly where the stream says so), reads usage, names the
conversation, system prompt and session hint of a request body, reads the model's reply back
out of a response (session inference), and says which request paths it answers (the
recorder). One module per API subclasses it; ``engines.apis`` is the registry. An API the
simulated engine serves without code of its own also implements the serving hooks
(``serve_request``, ``stream_encoder``, ``response_body``, ``error_body``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import orjson

from agent_replay.engines.replies import Reply
from agent_replay.engines.sse import SSEEvent

DONE = b"[DONE]"


class Decoder(Protocol):
    """A stream decoder: ``feed(data, event)`` returns the output tokens of one event (the
    ``event:`` name is given for APIs with typed events). After the stream, ``usage`` is the
    last usage seen, ``error`` the first error payload, ``done`` whether the end arrived,
    ``exact`` whether every count came from the server."""

    usage: dict[str, Any] | None
    error: str | None
    done: bool
    finish_reason: str | None

    @property
    def exact(self) -> bool: ...

    def feed(self, data: bytes, event: str | None = None) -> int: ...

    def result_usage(self) -> tuple[int | None, int | None, int | None]: ...


class ServedRequest(NamedTuple):
    """A request body as the simulated engine needs it (``Dialect.serve_request``)."""

    messages: list[dict[str, Any]]
    """The prompt as chat messages (system first), for the engine's chat template."""
    tools: list[Any] | None
    max_tokens: int | None
    """None: the body does not say (the engine fills the context)."""
    model: str | None
    stream: bool


class Dialect:
    """One API. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    """The trace's ``api`` value."""
    route: ClassVar[str]
    """The request path; ``{model}`` where the model is part of it."""
    path_pattern: ClassVar[str] = ""
    """The recorder's regex for this API's paths (matched at the end of a request path, so
    that a base URL with a prefix is understood); empty: the route without its version."""
    token_ids: ClassVar[bool] = False
    """The prompt can be sent as token ids."""
    typed_events: ClassVar[bool] = False
    """Stream events carry an ``event:`` name the decoder is fed with the data."""
    id_prefix: ClassVar[str] = ""
    """The prefix of a response id (``chatcmpl-``, ``msg_``...)."""
    key_env: ClassVar[str] = "OPENAI_API_KEY"
    """The environment variable that holds the API key where none is given."""
    key_header: ClassVar[str] = ""
    """A header that carries the key besides ``Authorization: Bearer`` (e.g. ``x-api-key``)."""
    prompt_fields: ClassVar[tuple[str, ...]] = ()
    """The body fields that carry the prompt (a recorded body that has one is replayed as is)."""

    def __init__(self) -> None:
        pattern = self.path_pattern or re.escape("/" + self.route.strip("/").split("/", 1)[1])
        self._path_re = re.compile(f"(?:{pattern})$")

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"

    # the client side ------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The request path of an API whose path does not name the model."""
        return self.route

    def url_path(self, model: str) -> str:
        """The path (and query) a request for ``model`` is sent to."""
        return self.route

    def build(
        self,
        *,
        model: str,
        prompt: Any,
        max_tokens: int,
        vllm_extras: bool = True,
        temperature: float | None = 0.0,
        base: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The JSON body of a streamed request.

        ``prompt`` is a sequence of token ids (``token_ids`` APIs), a string (one user
        message), or a list of messages. ``base`` is a recorded request body to replay: its
        fields are kept except the ones that control the stream and the output length,
        which are set here. With ``vllm_extras`` the body asks vLLM to honour the output
        length exactly (``ignore_eos``, ``min_tokens``) and, where the API has them, to
        report tokens per chunk. Servers that reject unknown fields need it off.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        body: dict[str, Any] = dict(base) if base else {}
        self._fill(body, model, prompt, max_tokens)
        if temperature is not None and "temperature" not in body:
            body["temperature"] = temperature
        self._extras(body, max_tokens, vllm_extras)
        return body

    def _fill(self, body: dict[str, Any], model: str, prompt: Any, max_tokens: int) -> None:
        raise NotImplementedError

    def _extras(self, body: dict[str, Any], max_tokens: int, vllm_extras: bool) -> None:
        if vllm_extras:
            body["ignore_eos"] = True
            body["min_tokens"] = max_tokens

    def carries_prompt(self, body: Mapping[str, Any]) -> bool:
        """A recorded body that holds its prompt (replayed as recorded)."""
        return any(f in body for f in self.prompt_fields)

    def recorded_prompt(self, body: Mapping[str, Any]) -> Any:
        """What ``build`` gets as ``prompt`` to replay a recorded body: None (the body's own
        conversation is kept) except where the prompt is a field ``build`` sets."""
        return None

    def decoder(self) -> Decoder:
        """A fresh stream decoder."""
        raise NotImplementedError

    def usage(
        self, usage: Any, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        """(prompt, output, cached) tokens of this API's usage object."""
        return read_usage(usage, uncached_input)

    def stream_usage(
        self, dec: Decoder, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        """(prompt, output, cached) tokens a recorded stream reported."""
        return self.usage(dec.usage)

    def response_usage(
        self, obj: Any, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        """(prompt, output, cached) tokens of a response body that is not a stream."""
        if not isinstance(obj, dict):
            return None, None, None
        return self.usage(obj.get("usage"), uncached_input)

    # the recorder side ----------------------------------------------------------------

    def match(self, path: str) -> int:
        """How much of ``path`` (no query) names this API: the length of the matched end,
        0 when it is not this API's. The longest match wins (``/chat/completions`` over
        ``/completions``)."""
        m = self._path_re.search(path.rstrip("/"))
        return len(m.group(0)) if m else 0

    def path_model(self, path: str) -> str | None:
        """The model a request path names (None where the body names it)."""
        return None

    def path_streams(self, path: str) -> bool:
        """The path itself asks for a stream."""
        return False

    def model(self, body: Mapping[str, Any]) -> str | None:
        m = body.get("model")
        return m if isinstance(m, str) else None

    def streams(self, body: Mapping[str, Any]) -> bool:
        """The body asks for a streamed answer."""
        return body.get("stream") is True

    def session_hint(self, body: Mapping[str, Any]) -> Any:
        """What the body says of the end user (a session key where nothing better is)."""
        return body.get("user")

    def with_usage(self, raw: bytes, body: Mapping[str, Any]) -> bytes | None:
        """``raw`` asking the server for the usage the recorder needs, or None when it needs
        no change. Only a byte splice or a re-encoding: the rest goes as sent."""
        return None

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """The conversation items a request carries, as chat-style items (``role``,
        ``content``), in order; empty where the prompt is not a conversation."""
        return []

    def system(self, body: Mapping[str, Any]) -> Any:
        """The system prompt outside the conversation items, or None."""
        return None

    def tools(self, body: Mapping[str, Any]) -> Any:
        """The tools the request offers (None: none)."""
        return body.get("tools") or None

    def prompt(self, body: Mapping[str, Any]) -> Any:
        """The prompt field of an API whose prompt is not a conversation, else None."""
        return None

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        """The model's reply carried by a recorded stream."""
        return None

    def reply_from_json(self, obj: Any) -> Reply | None:
        """The model's reply in a non-streamed response body."""
        return None

    # serving hooks (an API the simulated engine serves through its dialect) -------------

    serves: ClassVar[bool] = False
    """The serving hooks below are implemented."""

    def serve_request(self, data: dict[str, Any], path_model: str | None) -> ServedRequest:
        """The request as the engine needs it; ``ValueError`` with a message on a bad body."""
        raise NotImplementedError

    def stream_encoder(self, *, rid: str, created: int, model: str, prompt_tokens: int) -> Any:
        """An encoder of one streamed answer: ``chunk(text, n_tokens, finish)`` per engine
        step and ``final(cached, finish)``, each returning the SSE bytes to send."""
        raise NotImplementedError

    def response_body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        """The JSON body of an answer that is not streamed."""
        raise NotImplementedError

    def error_body(self, message: str, status: int, kind: str | None = None) -> bytes:
        """The JSON body of an error answer; ``kind`` its ``type`` where the API's error
        shape has a free one (OpenAI's), else the API's own type for ``status``."""
        err: dict[str, Any] = {"message": message}
        if kind is not None:
            err["type"] = kind
        err["code"] = status
        return orjson.dumps({"error": err})


def as_messages(prompt: Any) -> list[dict[str, Any]]:
    """A text prompt as one user message; a list of messages as it is."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError("chat/messages prompts are text or a list of messages, not token ids")


def encode_body(body: Mapping[str, Any]) -> bytes:
    """JSON bytes of a body; numpy arrays of token ids serialize directly."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def error_text(obj: dict[str, Any]) -> str:
    """An error payload as one string."""
    err = obj.get("error", obj)
    return err if isinstance(err, str) else orjson.dumps(err).decode()


def usage_counts(usage: Mapping[str, Any] | None) -> tuple[int | None, int | None, int | None]:
    """(prompt, completion, cached) of an OpenAI-style usage object."""
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


def _messages_usage(
    usage: dict[str, Any], uncached_input: bool
) -> tuple[int | None, int | None, int | None]:
    """``read_usage`` of a Messages usage with cache fields."""
    inp = usage.get("input_tokens")
    read = usage.get("cache_read_input_tokens") or 0
    made = usage.get("cache_creation_input_tokens") or 0
    total = inp + (read + made if uncached_input else 0) if isinstance(inp, int) else None
    out = usage.get("output_tokens")
    return total, out if isinstance(out, int) else None, read if isinstance(read, int) else None


def read_usage(
    usage: Any, uncached_input: bool = False
) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens, output tokens, cached prompt tokens) of a usage object of the OpenAI
    and Anthropic APIs.

    Messages usage: vLLM reports the whole prompt in ``input_tokens``; Anthropic's API
    (``uncached_input``) only the uncached part, the prompt being that plus
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``. Responses usage has
    ``input_tokens`` and ``input_tokens_details.cached_tokens``."""
    if not isinstance(usage, dict):
        return None, None, None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        return _messages_usage(usage, uncached_input)
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and "prompt_tokens" not in usage:
        return usage.get("input_tokens"), usage.get("output_tokens"), details.get("cached_tokens")
    return usage_counts(usage)
