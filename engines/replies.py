"""A model's reply, reduced to what identifies it when the client sends it back as part of
its next request: the reply's text (whitespace collapsed) and its tool-call ids. Pure.

Used by session inference (``replay.record.sessions``) through the API dialects
(``engines.dialects``): a request whose conversation is an earlier request's conversation
plus that request's reply continues that request's session.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


def _norm(text: str) -> str:
    return " ".join(text.split())


def _content_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") in ("text", "output_text") \
                    and isinstance(b.get("text"), str):
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
        for tc in it.get("tool_calls") or ():
            if isinstance(tc, dict) and tc.get("id"):
                ids.append(str(tc["id"]))
    return Reply(_norm("".join(texts)), tuple(ids))


def reply_from_json(api: str, obj: Any) -> Reply | None:
    """The reply in a non-streamed response body."""
    if not isinstance(obj, dict):
        return None
    if api == "chat":
        choices = obj.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None
        return reply_from_items([choices[0].get("message") or {}])
    if api == "messages":
        return reply_from_items([{"role": "assistant", "content": obj.get("content")}])
    if api == "responses":
        return _responses_output(obj.get("output"))
    return None


def _responses_output(output: Any) -> Reply | None:
    if not isinstance(output, list):
        return None
    items = [o for o in output if isinstance(o, dict)]
    msgs = [{"role": "assistant", "content": o.get("content")} if o.get("type") == "message"
            else o for o in items]
    return reply_from_items(msgs)


def reply_from_events(api: str, events: Iterable[SSEEvent]) -> Reply | None:
    """The reply carried by a stream's events."""
    texts: list[str] = []
    ids: list[str] = []
    for ev in events:
        if ev.data == b"[DONE]":
            continue
        try:
            obj = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        if api == "chat":
            for c in obj.get("choices") or ():
                if not isinstance(c, dict) or c.get("index", 0) != 0:
                    continue
                delta = c.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    texts.append(delta["content"])
                for tc in delta.get("tool_calls") or ():
                    if isinstance(tc, dict) and tc.get("id"):
                        ids.append(str(tc["id"]))
        elif api == "messages":
            kind = ev.event or obj.get("type")
            if kind == "content_block_start":
                block = obj.get("content_block") or {}
                if block.get("type") == "tool_use" and block.get("id"):
                    ids.append(str(block["id"]))
                if isinstance(block.get("text"), str):
                    texts.append(block["text"])
            elif kind == "content_block_delta":
                delta = obj.get("delta") or {}
                if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                    texts.append(delta["text"])
        elif api == "responses":
            kind = ev.event or obj.get("type")
            if kind in ("response.completed", "response.incomplete"):
                return _responses_output((obj.get("response") or {}).get("output"))
        else:
            return None
    return Reply(_norm("".join(texts)), tuple(ids))
