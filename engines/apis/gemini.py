"""Google's Gemini ``generateContent`` API, streamed: ``POST
/v1beta/models/{model}:streamGenerateContent?alt=sse``. The model is part of the path.

A request carries ``contents`` (turns of ``role`` user/model with ``parts``), an optional
``systemInstruction`` and ``tools``, and ``generationConfig.maxOutputTokens``. The stream is
SSE ``data:`` events, each a ``GenerateContentResponse`` (``candidates[0].content.parts``
text, ``usageMetadata``), with no end marker: the candidate's ``finishReason`` ends it.

Tokens per event come from differencing the cumulative ``usageMetadata.candidatesTokenCount``
when every text event carries it. Otherwise each text event counts one token provisionally,
and the stream is exact only if the final count equals the number of text events (as for
Anthropic streams). With ``vllm_extras`` the body also carries vLLM's ``ignore_eos`` and
``min_tokens`` (the simulated engine honours them; Google's API rejects unknown fields, so
replay against it with ``--no-vllm-extras``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from agent_replay.engines.apis.base import (
    DONE,
    Dialect,
    ServedRequest,
    as_messages,
    error_text,
)
from agent_replay.engines.replies import Reply, event_object, norm_text
from agent_replay.engines.sse import SSEEvent

_PATH = re.compile(r"/models/([^:]+):(streamGenerateContent|generateContent)$")
_FINISH = {"length": "MAX_TOKENS", "stop": "STOP", "tool_calls": "STOP"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _parts(obj: Any) -> list[Any]:
    parts = obj.get("parts") if isinstance(obj, dict) else None
    return parts if isinstance(parts, list) else []


def _text(parts: list[Any]) -> str:
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def _usage(meta: Any) -> tuple[int | None, int | None, int | None]:
    if not isinstance(meta, dict):
        return None, None, None
    return (
        meta.get("promptTokenCount"),
        meta.get("candidatesTokenCount"),
        meta.get("cachedContentTokenCount"),
    )


class GeminiStreamDecoder:
    """Decodes one ``streamGenerateContent`` SSE stream (see the module text)."""

    __slots__ = ("_counted", "_output", "_provisional", "done", "error", "finish_reason", "usage")

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = False
        self.finish_reason: str | None = None
        self._output = 0
        self._counted: int | None = None
        self._provisional = False

    @property
    def exact(self) -> bool:
        if not self._provisional:
            return True
        return self._counted is not None and self._counted == self._output

    def feed(self, data: bytes, event: str | None = None) -> int:
        if data == DONE:
            return 0
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("stream event is not a JSON object")
        if "error" in obj:
            self.error = error_text(obj)
            return 0
        meta = obj.get("usageMetadata")
        out = None
        if isinstance(meta, dict):
            self.usage = meta
            out = meta.get("candidatesTokenCount")
        cands = obj.get("candidates")
        c0 = cands[0] if isinstance(cands, list) and cands and isinstance(cands[0], dict) else {}
        if c0.get("finishReason"):
            self.finish_reason = c0["finishReason"]
            self.done = True
        if any(
            isinstance(p, dict) and (p.get("text") or p.get("functionCall"))
            for p in _parts(c0.get("content"))
        ):
            if isinstance(out, int) and not self._provisional:
                k = max(out - self._output, 0)
                self._output = max(out, self._output)
                self._counted = out
                return k
            self._provisional = True
            self._output += 1
            if isinstance(out, int):
                self._counted = out
            return 1
        if isinstance(out, int):
            self._counted = out
        return 0

    def result_usage(self) -> tuple[int | None, int | None, int | None]:
        prompt, _, cached = _usage(self.usage)
        return prompt, self._counted, cached


def call_id(part: Any) -> str | None:
    """What identifies a ``functionCall`` part when the client sends it back: its name and
    arguments (None: not a call). Not its ``id``: Google's API may send none, and Gemini
    CLI makes up its own and prefixes the name to one it got."""
    fc = part.get("functionCall") if isinstance(part, dict) else None
    if not isinstance(fc, dict):
        return None
    args = orjson.dumps(fc.get("args") or {}, option=orjson.OPT_SORT_KEYS)
    return f"{fc.get('name')}:{hashlib.blake2b(args, digest_size=8).hexdigest()}"


def _reply(objs: Iterable[Any]) -> Reply:
    """The reply in ``GenerateContentResponse`` objects: the text of its parts (thoughts
    aside: clients keep them out of the history they send back) and its calls."""
    parts = [p for obj in objs for p in _candidate_parts(obj) if isinstance(p, dict)]
    texts = [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
    calls = [ident for ident in map(call_id, parts) if ident is not None]
    return Reply(norm_text("".join(texts)), tuple(calls))


def _candidate_parts(obj: Any) -> list[Any]:
    """The parts of a response's first candidate."""
    cands = obj.get("candidates") if isinstance(obj, dict) else None
    c0 = cands[0] if isinstance(cands, list) and cands else None
    return _parts(c0.get("content")) if isinstance(c0, dict) else []


def _contents(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    """Chat messages as Gemini ``contents`` and a ``systemInstruction`` (None: none)."""
    contents, system = [], None
    for m in messages:
        content = m.get("content")
        parts = content if isinstance(content, list) else [{"text": str(content or "")}]
        if m.get("role") == "system":
            system = {"parts": parts}
            continue
        contents.append(
            {"role": "model" if m.get("role") == "assistant" else "user", "parts": parts}
        )
    return contents, system


class Gemini(Dialect):
    name = "gemini"
    route = "/v1beta/models/{model}:streamGenerateContent"
    path_pattern = _PATH.pattern.rstrip("$")
    key_env = "GEMINI_API_KEY"
    key_header = "x-goog-api-key"
    prompt_fields = ("contents",)
    serves = True

    def url_path(self, model: str) -> str:
        return self.route.replace("{model}", model) + "?alt=sse"

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
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        body: dict[str, Any] = dict(base) if base else {}
        if prompt is not None or "contents" not in body:
            body["contents"], system = _contents(as_messages(prompt))
            if system is not None:
                body["systemInstruction"] = system
        config = dict(body.get("generationConfig") or {})
        config["maxOutputTokens"] = max_tokens
        if temperature is not None and "temperature" not in config:
            config["temperature"] = temperature
        body["generationConfig"] = config
        self._extras(body, max_tokens, vllm_extras)
        return body

    def decoder(self) -> GeminiStreamDecoder:
        return GeminiStreamDecoder()

    def usage(
        self, usage: Any, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        return _usage(usage)

    def response_usage(
        self, obj: Any, uncached_input: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        return _usage(obj.get("usageMetadata") if isinstance(obj, dict) else None)

    def path_model(self, path: str) -> str | None:
        m = _PATH.search(path.rstrip("/"))
        return m.group(1) if m else None

    def path_streams(self, path: str) -> bool:
        m = _PATH.search(path.rstrip("/"))
        return bool(m and m.group(2) == "streamGenerateContent")

    def session_hint(self, body: Mapping[str, Any]) -> Any:
        return None

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """The turns as chat-style items: role ``assistant`` for the model's, text parts as
        text blocks, other parts (function calls and responses) as they are."""
        items = []
        for c in body.get("contents") or ():
            if not isinstance(c, dict):
                continue
            blocks = [
                {"type": "text", "text": p["text"]}
                if isinstance(p, dict) and isinstance(p.get("text"), str)
                else p
                for p in _parts(c)
            ]
            items.append(
                {"role": "assistant" if c.get("role") == "model" else "user", "content": blocks}
            )
        return items

    def system(self, body: Mapping[str, Any]) -> Any:
        si = body.get("systemInstruction")
        return _text(_parts(si)) or None if si else None

    def reply_from_json(self, obj: Any) -> Reply | None:
        if not isinstance(obj, dict):
            return None
        return _reply([obj])

    def reply_from_events(self, events: Iterable[SSEEvent]) -> Reply | None:
        return _reply(event_object(ev) for ev in events)

    # serving hooks -----------------------------------------------------------------------

    def serve_request(self, data: dict[str, Any], path_model: str | None) -> ServedRequest:
        contents = data.get("contents")
        if (
            not isinstance(contents, list)
            or not contents
            or not all(isinstance(c, dict) and isinstance(c.get("parts"), list) for c in contents)
        ):
            raise ValueError("contents: a non-empty list of contents with parts is required")
        messages = []
        system = self.system(data)
        if system:
            messages.append({"role": "system", "content": system})
        for c in contents:
            text = "".join(
                p["text"] if isinstance(p.get("text"), str) else orjson.dumps(p).decode()
                for p in c["parts"]
                if isinstance(p, dict)
            )
            messages.append(
                {"role": "assistant" if c.get("role") == "model" else "user", "content": text}
            )
        config = data.get("generationConfig") or {}
        n = config.get("maxOutputTokens") if isinstance(config, dict) else None
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError("generationConfig.maxOutputTokens must be a positive integer")
        tools = data.get("tools") if isinstance(data.get("tools"), list) else None
        return ServedRequest(messages, tools or None, n, path_model, True)

    def stream_encoder(
        self, *, rid: str, created: int, model: str, prompt_tokens: int
    ) -> GeminiEncoder:
        return GeminiEncoder(rid=rid, model=model, prompt_tokens=prompt_tokens)

    def error_body(self, message: str, status: int, kind: str | None = None) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "status": _STATUS.get(status, "UNKNOWN"),
                }
            }
        )


class GeminiEncoder:
    """SSE events of one streamed answer: one per engine step with its text and the
    cumulative ``candidatesTokenCount``, then one with the ``finishReason`` and the cached
    prompt tokens."""

    __slots__ = ("_done", "model", "prompt", "rid")

    def __init__(self, *, rid: str, model: str, prompt_tokens: int) -> None:
        self.rid = rid
        self.model = model
        self.prompt = prompt_tokens
        self._done = 0

    def _event(self, text: str, finish: str | None, cached: int | None) -> bytes:
        cand: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
        if finish is not None:
            cand["finishReason"] = _FINISH.get(finish, "OTHER")
        cand["index"] = 0
        meta = {
            "promptTokenCount": self.prompt,
            "candidatesTokenCount": self._done,
            "totalTokenCount": self.prompt + self._done,
        }
        if cached is not None:
            meta["cachedContentTokenCount"] = cached
        obj = {
            "candidates": [cand],
            "usageMetadata": meta,
            "modelVersion": self.model,
            "responseId": self.rid,
        }
        return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"

    def chunk(self, text: str, n_tokens: int, finish: str | None) -> bytes:
        self._done += n_tokens
        return self._event(text, None, None)

    def final(self, cached: int | None, finish: str | None) -> bytes:
        return self._event("", finish or "stop", cached)


DIALECT = Gemini()
