"""Anthropic messages (``/v1/messages``, as vLLM and Anthropic serve it): ``event:`` typed SSE.

Tokens come from differencing the cumulative ``usage.output_tokens`` when delta events carry
it. vLLM's (and Anthropic's) deltas do not: then each ``content_block_delta`` counts one
token provisionally, and the stream is exact only if the final ``usage.output_tokens``
equals the number of deltas: every delta carries at least one token, so equal totals mean
every delta carried exactly one. Otherwise ``exact`` is False and the caller flags it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from agent_replay.engines.apis.base import DONE, Dialect, as_messages, error_text
from agent_replay.engines.replies import Reply, event_object, norm_text, reply_from_items
from agent_replay.engines.sse import SSEEvent


class MessagesStreamDecoder:
    """Decodes an Anthropic messages stream (see the module text)."""

    __slots__ = (
        "_counted",
        "_input",
        "_output",
        "_provisional",
        "cached",
        "done",
        "error",
        "finish_reason",
        "usage",
    )

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
        if self._ends(kind, obj):
            return 0
        if kind == "message_delta":
            self.finish_reason = (obj.get("delta") or {}).get("stop_reason") or self.finish_reason
        out = self._take_usage(kind, obj)
        if kind == "content_block_delta":
            return self._delta_tokens(out)
        if isinstance(out, int):
            self._counted = out
        return 0

    def _ends(self, kind: Any, obj: dict[str, Any]) -> bool:
        """Whether the event ends the stream (an error, or ``message_stop``)."""
        if kind == "error":
            self.error = error_text(obj)
            return True
        if kind == "message_stop":
            self.done = True
            return True
        return False

    def _take_usage(self, kind: Any, obj: dict[str, Any]) -> Any:
        """Merge the event's usage (``message_start`` carries it in its message); its
        cumulative ``output_tokens``, None without usage."""
        usage = (
            (obj.get("message") or {}).get("usage") if kind == "message_start" else obj.get("usage")
        )
        if not isinstance(usage, dict):
            return None
        self._merge_usage(usage)
        return usage.get("output_tokens")

    def _delta_tokens(self, out: Any) -> int:
        """The tokens a content delta carries: by the server's cumulative count when the
        event has one, else 1 (a provisional count, exact only if the server's final count
        agrees)."""
        if isinstance(out, int):
            k = max(out - self._output, 0)
            self._output = max(out, self._output)
            self._counted = out
            return k
        self._provisional = True
        self._output += 1
        return 1

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


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""Anthropic's error types by HTTP status; every other status is ``api_error``."""


class Messages(Dialect):
    name = "messages"
    route = "/v1/messages"
    typed_events = True
    id_prefix = "msg_"
    key_env = "ANTHROPIC_API_KEY"
    key_header = "x-api-key"
    prompt_fields = ("messages",)

    def _fill(self, body: dict[str, Any], model: str, prompt: Any, max_tokens: int) -> None:
        body["model"] = model
        body["stream"] = True
        if prompt is not None or "messages" not in body:
            body["messages"] = as_messages(prompt)
        body["max_tokens"] = max_tokens

    def decoder(self) -> MessagesStreamDecoder:
        return MessagesStreamDecoder()

    def error_body(self, message: str, status: int, kind: str | None = None) -> bytes:
        """Anthropic's shape; its ``type`` is one of the API's own, by ``status``."""
        return orjson.dumps(
            {
                "type": "error",
                "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message},
            }
        )

    def stream_usage(
        self, dec: Any, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        inp, out, cached = self.usage(dec.usage, uncached_input)
        if out is None and dec.usage is not None:
            out = dec.usage.get("output_tokens")
        return inp, out, cached

    def session_hint(self, body: Mapping[str, Any]) -> Any:
        md = body.get("metadata")
        return md.get("user_id") if isinstance(md, Mapping) else None

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        msgs = body.get("messages")
        return list(msgs) if isinstance(msgs, list) else []

    def system(self, body: Mapping[str, Any]) -> Any:
        return body.get("system")

    def reply_from_json(self, obj: Any) -> Reply | None:
        if not isinstance(obj, dict):
            return None
        return reply_from_items([{"role": "assistant", "content": obj.get("content")}])

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        texts: list[str] = []
        ids: list[str] = []
        for ev in events:
            obj = event_object(ev)
            kind = ev.event or obj.get("type")
            if kind == "content_block_start":
                _block_start(obj.get("content_block") or {}, texts, ids)
            elif kind == "content_block_delta":
                delta = obj.get("delta") or {}
                if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                    texts.append(delta["text"])
        return Reply(norm_text("".join(texts)), tuple(ids))


def _block_start(block: Mapping[str, Any], texts: list[str], ids: list[str]) -> None:
    """A content block's start: a tool call's id, or the text it opens with."""
    if block.get("type") == "tool_use" and block.get("id"):
        ids.append(str(block["id"]))
    if isinstance(block.get("text"), str):
        texts.append(block["text"])


DIALECT = Messages()
