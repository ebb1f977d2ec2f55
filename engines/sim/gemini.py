"""Gemini's ``streamGenerateContent`` answered with a tool call (``--tool-call``).

The tool-call rule (``requests.plan_tool_call``) reads a Gemini request as chat-style
messages: a content holding a ``functionResponse`` part is a tool result (answered with
text), any other content of role ``user`` a user's turn; ``tools`` offer the functions
of their ``functionDeclarations``.

Gemini streams a function call whole, never its arguments in pieces: the answer's engine
steps are events that carry only the running ``usageMetadata.candidatesTokenCount`` (no
candidate), and the last carries the ``functionCall`` part, ``finishReason: STOP`` and
the cached prompt tokens. The call's output tokens are its arguments' pieces, as for the
other APIs, so the counts stay exact; a reader that counts tokens per event sees them all
arrive with the call, as from Google's API.
"""

from __future__ import annotations

from typing import Any

import orjson

from agent_replay.engines.sim.requests import ToolCall


def _parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _block(part: Any) -> dict[str, Any]:
    if isinstance(part, dict) and part.get("functionResponse") is not None:
        return {"type": "tool_result"}
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    return {"type": "other"}


def conversation(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's ``contents`` as chat-style messages for the tool-call rule (see the
    module text)."""
    return [
        {
            "role": "assistant" if c.get("role") == "model" else "user",
            "content": [_block(p) for p in _parts(c)],
        }
        for c in data.get("contents") or ()
        if isinstance(c, dict)
    ]


class GeminiToolEncoder:
    """The engine's ``chunk(ids, finish)`` / ``final(cached, finish)`` for an answer that
    is one function call (see the module text)."""

    __slots__ = ("_done", "call", "model", "prompt", "rid")

    def __init__(self, *, rid: str, model: str, prompt_tokens: int, call: ToolCall) -> None:
        self.rid = rid
        self.model = model
        self.prompt = prompt_tokens
        self.call = call
        self._done = 0

    def _event(self, cand: dict[str, Any] | None, cached: int | None) -> bytes:
        meta: dict[str, Any] = {
            "promptTokenCount": self.prompt,
            "candidatesTokenCount": self._done,
            "totalTokenCount": self.prompt + self._done,
        }
        if cached is not None:
            meta["cachedContentTokenCount"] = cached
        obj: dict[str, Any] = {"candidates": [cand]} if cand is not None else {}
        obj.update(usageMetadata=meta, modelVersion=self.model, responseId=self.rid)
        return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"

    def chunk(self, ids: list[int], finish: str | None) -> bytes:
        self._done += len(ids)
        return b"" if finish is not None else self._event(None, None)

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        part = {"functionCall": {"name": self.call.name, "args": orjson.loads(self.call.arguments)}}
        cand = {"content": {"parts": [part], "role": "model"}, "finishReason": "STOP", "index": 0}
        return self._event(cand, cached)
