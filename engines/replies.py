"""A model's reply, reduced to what identifies it when the client sends it back as part of
its next request: the reply's text (whitespace collapsed) and its tool-call ids. Pure.

Used by session inference (``replay.record.sessions``) through the API dialects
(``engines.apis``): a request whose conversation is an earlier request's conversation
plus that request's reply continues that request's session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from agent_replay.engines.sse import SSEEvent


class Reply(NamedTuple):
    text: str
    tool_ids: tuple[str, ...]

    def matches(self, other: Reply) -> bool:
        if self.tool_ids or other.tool_ids:
            return self.tool_ids == other.tool_ids
        return self.text == other.text


def norm_text(text: str) -> str:
    """Whitespace collapsed: how a reply's text is compared."""
    return " ".join(text.split())


def _content_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for b in content:
            if (
                isinstance(b, dict)
                and b.get("type") in ("text", "output_text")
                and isinstance(b.get("text"), str)
            ):
                out.append(b["text"])
    return out


def _content_ids(content: Any) -> list[str]:
    out: list[str] = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id"):
                out.append(str(b["id"]))
    return out


def is_reply_item(item: Any) -> bool:
    """An item the model produced: an assistant message, a Responses function call or
    reasoning item."""
    if not isinstance(item, dict):
        return False
    return item.get("role") == "assistant" or item.get("type") in ("function_call", "reasoning")


def tool_call_ids(calls: Any) -> list[str]:
    """The ids of an OpenAI ``tool_calls`` list (those that have one)."""
    return [str(tc["id"]) for tc in calls or () if isinstance(tc, dict) and tc.get("id")]


def reply_from_items(items: Sequence[Any]) -> Reply:
    """The reply formed by the model-produced items ``items`` (as a client sends them)."""
    texts: list[str] = []
    ids: list[str] = []
    for it in items:
        if not isinstance(it, dict):
            continue
        if it.get("type") == "function_call":
            ids.append(str(it.get("call_id") or it.get("id") or ""))
            continue
        if it.get("type") == "reasoning":
            continue
        texts.extend(_content_text(it.get("content")))
        ids.extend(_content_ids(it.get("content")))
        ids.extend(tool_call_ids(it.get("tool_calls")))
    return Reply(norm_text("".join(texts)), tuple(ids))


def responses_output(output: Any) -> Reply | None:
    """The reply in a Responses ``output`` list."""
    if not isinstance(output, list):
        return None
    items = [o for o in output if isinstance(o, dict)]
    msgs = [
        {"role": "assistant", "content": o.get("content")} if o.get("type") == "message" else o
        for o in items
    ]
    return reply_from_items(msgs)


def event_object(ev: SSEEvent) -> dict[str, Any]:
    """A stream event's JSON object; empty for ``[DONE]`` and anything that is not one."""
    if ev.data == b"[DONE]":
        return {}
    try:
        obj = orjson.loads(ev.data)
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}
