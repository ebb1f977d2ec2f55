"""OpenAI chat completions (``/v1/chat/completions``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent_replay.engines.apis.base import as_messages
from agent_replay.engines.apis.openai import OpenAIDialect
from agent_replay.engines.replies import (
    Reply,
    event_object,
    norm_text,
    reply_from_items,
    tool_call_ids,
)
from agent_replay.engines.sse import SSEEvent


class Chat(OpenAIDialect):
    name = "chat"
    route = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    prompt_fields = ("messages",)

    def _fill(self, body: dict[str, Any], model: str, prompt: Any, max_tokens: int) -> None:
        body["model"] = model
        body["stream"] = True
        if prompt is not None or "messages" not in body:
            body["messages"] = as_messages(prompt)
        body.pop("max_tokens", None)
        body["max_completion_tokens"] = max_tokens

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        msgs = body.get("messages")
        return list(msgs) if isinstance(msgs, list) else []

    def reply_from_json(self, obj: Any) -> Reply | None:
        if not isinstance(obj, dict):
            return None
        choices = obj.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None
        return reply_from_items([choices[0].get("message") or {}])

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        texts: list[str] = []
        ids: list[str] = []
        for ev in events:
            for delta in _first_choice_deltas(event_object(ev)):
                if isinstance(delta.get("content"), str):
                    texts.append(delta["content"])
                ids.extend(tool_call_ids(delta.get("tool_calls")))
        return Reply(norm_text("".join(texts)), tuple(ids))


def _first_choice_deltas(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The deltas of a stream event's choice 0 (a reply is read from the first choice)."""
    return [
        c.get("delta") or {}
        for c in obj.get("choices") or ()
        if isinstance(c, dict) and c.get("index", 0) == 0
    ]


DIALECT = Chat()
