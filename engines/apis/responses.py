"""OpenAI Responses (``/v1/responses``): ``response.*`` typed events.

Each delta event (output text, function-call arguments, reasoning, refusal) counts one token
provisionally; the final ``response.completed`` carries ``usage.output_tokens``. As with
Anthropic streams, the counts are exact when that total equals the number of deltas (every
delta carries at least one token); otherwise ``exact`` is False. The simulated engine sends
one delta per engine step, so without speculation it is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from agent_replay.engines.apis.base import DONE, Dialect, as_messages, error_text, read_usage
from agent_replay.engines.replies import Reply, event_object, norm_text, responses_output
from agent_replay.engines.sse import SSEEvent

_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
    }
)
_END = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStreamDecoder:
    """Decodes an OpenAI Responses stream (see the module text)."""

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
        if kind in _DELTAS:
            if obj.get("delta"):
                self._output += 1
                return 1
            return 0
        if kind in _END:
            self._end(obj.get("response") or {})
        elif kind == "error":
            self.error = error_text(obj)
        return 0

    def _end(self, resp: dict[str, Any]) -> None:
        """The final event's response: its usage, error and why it ended."""
        self.done = True
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
        self.finish_reason = (
            "length"
            if details.get("reason") == "max_output_tokens"
            else status
            if isinstance(status, str)
            else None
        )

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        return read_usage(self.usage)


class Responses(Dialect):
    name = "responses"
    route = "/v1/responses"
    typed_events = True
    id_prefix = "resp_"
    prompt_fields = ("input",)

    def _fill(self, body: dict[str, Any], model: str, prompt: Any, max_tokens: int) -> None:
        body["model"] = model
        body["stream"] = True
        if prompt is not None or "input" not in body:
            body["input"] = as_messages(prompt)
        body.pop("max_tokens", None)
        body["max_output_tokens"] = max_tokens
        body.pop("previous_response_id", None)  # a replay sends the whole conversation
        body["store"] = False

    def decoder(self) -> ResponsesStreamDecoder:
        return ResponsesStreamDecoder()

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        inp = body.get("input")
        if isinstance(inp, str):
            return [{"role": "user", "content": inp}]
        return list(inp) if isinstance(inp, list) else []

    def system(self, body: Mapping[str, Any]) -> Any:
        return body.get("instructions")

    def reply_from_json(self, obj: Any) -> Reply | None:
        return responses_output(obj.get("output")) if isinstance(obj, dict) else None

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        for ev in events:
            obj = event_object(ev)
            if (ev.event or obj.get("type")) in ("response.completed", "response.incomplete"):
                return responses_output((obj.get("response") or {}).get("output"))
        return Reply(norm_text(""), ())


DIALECT = Responses()
