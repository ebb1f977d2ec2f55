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
        prompt, prompt + completion, completion)


def _final_usage(prompt: int, completion: int, cached: int | None) -> bytes:
    u = _usage(prompt, completion)
    if cached is not None:
        u += b',"prompt_tokens_details":{"cached_tokens":%d}' % cached
    return u + b"}"


_FINISH = {None: b"null", "length": b'"length"', "stop": b'"stop"', "abort": b'"abort"'}


class CompletionsEncoder:
    """SSE chunks of one streamed /v1/completions response."""

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

    def __init__(self, *, rid: str, created: int, model: str, table: TokenTable,
                 prompt_ids: Sequence[int], return_token_ids: bool, include_usage: bool,
                 continuous_usage: bool) -> None:
        self.head = (b'data: {"id":' + orjson.dumps(rid) + b',"object":"text_completion","created":%d,"model":' % created
                     + orjson.dumps(model) + b',"choices":[{"index":0,"text":')
        self.table = table
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.return_ids = return_token_ids
        self.include_usage = include_usage
        self.continuous = include_usage and continuous_usage
        self.completion_tokens = 0
        self.tail_fp = b',"system_fingerprint":' + orjson.dumps(SYSTEM_FINGERPRINT) + b"}\n\n"

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        t = self.table
        first = self.completion_tokens == 0
        self.completion_tokens += len(ids)
        parts = [self.head, t.text(ids), b',"logprobs":null,"finish_reason":', _FINISH[finish],
                 b',"stop_reason":null,"prompt_token_ids":']
        if self.return_ids:
            parts.append(t.id_list(self.prompt_ids) if first else b"null")
            parts.append(b',"token_ids":')
            parts.append(t.id_list(ids))
        else:
            parts.append(b'null,"token_ids":null')
        if self.continuous:
            parts.append(b'}],"usage":' + _usage(self.prompt_tokens, self.completion_tokens) + b"}}\n\n")
        else:
            parts.append(b'}],"usage":null}\n\n')
        return b"".join(parts)

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        """The usage chunk (when asked for) and [DONE]."""
        if not self.include_usage:
            return DONE
        return (self.head[:-len(b'{"index":0,"text":')] + b'],"usage":'
                + _final_usage(self.prompt_tokens, self.completion_tokens, cached)
                + self.tail_fp + DONE)


class ChatEncoder:
    """SSE chunks of one streamed /v1/chat/completions response."""

    __slots__ = ("base", "completion_tokens", "continuous", "include_usage", "prompt_ids",
                 "prompt_tokens", "return_ids", "table", "tail_fp")

    def __init__(self, *, rid: str, created: int, model: str, table: TokenTable,
                 prompt_ids: Sequence[int], return_token_ids: bool, include_usage: bool,
                 continuous_usage: bool) -> None:
        self.base = (b'data: {"id":' + orjson.dumps(rid) + b',"object":"chat.completion.chunk","created":%d,"model":' % created
                     + orjson.dumps(model) + b',"choices":[')
        self.table = table
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.return_ids = return_token_ids
        self.include_usage = include_usage
        self.continuous = include_usage and continuous_usage
        self.completion_tokens = 0
        self.tail_fp = b',"system_fingerprint":' + orjson.dumps(SYSTEM_FINGERPRINT) + b"}\n\n"

    def _usage_part(self) -> bytes:
        if not self.continuous:
            return b""
        return (b',"usage":' + _usage(self.prompt_tokens, self.completion_tokens)
                + b',"completion_tokens_details":null}')

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        t = self.table
        out = b""
        if self.completion_tokens == 0:
            prompt_ids = t.id_list(self.prompt_ids) if self.return_ids else b"null"
            out = (self.base + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                   + self._usage_part() + b',"prompt_token_ids":' + prompt_ids + b',"prompt_text":null}\n\n')
        self.completion_tokens += len(ids)
        token_ids = t.id_list(ids) if self.return_ids else b"null"
        if finish is None:
            fin = b'"finish_reason":null,'
        else:
            fin = b'"finish_reason":' + _FINISH[finish] + b',"stop_reason":null,'
        return (out + self.base + b'{"index":0,"delta":{"content":' + t.text(ids) + b'},"logprobs":null,'
                + fin + b'"token_ids":' + token_ids + b"}]" + self._usage_part() + b"}\n\n")

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        if not self.include_usage:
            return DONE
        return (self.base + b'],"usage":' + _final_usage(self.prompt_tokens, self.completion_tokens, cached)
                + self.tail_fp + DONE)


def usage_dict(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def completion_body(*, rid: str, created: int, model: str, text: str, finish: str | None,
                    token_ids: list[int] | None, prompt_ids: list[int] | None, prompt: int,
                    completion: int, cached: int | None) -> bytes:
    return orjson.dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                     "stop_reason": None, "token_ids": token_ids, "prompt_logprobs": None,
                     "prompt_token_ids": prompt_ids}],
        "service_tier": None, "system_fingerprint": None,
        "usage": usage_dict(prompt, completion, cached), "kv_transfer_params": None,
    })


def chat_body(*, rid: str, created: int, model: str, text: str, finish: str | None,
              token_ids: list[int] | None, prompt_ids: list[int] | None, prompt: int,
              completion: int, cached: int | None) -> bytes:
    return orjson.dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                             "annotations": None, "audio": None,
                                             "function_call": None, "tool_calls": [],
                                             "reasoning": None},
                     "logprobs": None, "finish_reason": finish, "stop_reason": None,
                     "token_ids": token_ids}],
        "service_tier": None, "system_fingerprint": None,
        "usage": usage_dict(prompt, completion, cached), "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids, "kv_transfer_params": None,
    })


def error_body(message: str, code: int, err_type: str = "BadRequestError") -> bytes:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}})


_ANTHROPIC_STOP = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn", None: None}


class MessagesEncoder:
    """SSE events of one streamed Anthropic /v1/messages response (vLLM's event sequence)."""

    __slots__ = ("completion_tokens", "delta_head", "mid", "prompt_tokens", "start", "table")

    def __init__(self, *, rid: str, model: str, table: TokenTable, prompt_tokens: int) -> None:
        self.table = table
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        msg: dict[str, Any] = {"id": rid, "type": "message", "role": "assistant", "content": [], "model": model,
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
        self.start = (b"event: message_start\ndata: " + orjson.dumps({"type": "message_start", "message": msg})
                      + b'\n\nevent: content_block_start\ndata: {"type":"content_block_start","index":0,'
                      b'"content_block":{"type":"text","text":""}}\n\n')
        self.delta_head = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                           b'"delta":{"type":"text_delta","text":')
        self.mid = b"}}\n\n"

    def chunk(self, ids: Sequence[int], finish: str | None) -> bytes:
        first = self.completion_tokens == 0
        self.completion_tokens += len(ids)
        body = self.delta_head + self.table.text(ids) + self.mid
        return self.start + body if first else body

    def final(self, cached: int | None, finish: str | None) -> bytes:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens}
        if cached is not None:
            usage["cache_read_input_tokens"] = cached
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": _ANTHROPIC_STOP.get(finish, "end_turn"), "stop_sequence": None},
                 "usage": usage}
        return (b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
                b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n"
                b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def messages_body(*, rid: str, model: str, text: str, finish: str | None, prompt: int,
                  completion: int, cached: int | None) -> bytes:
    usage: dict[str, Any] = {"input_tokens": prompt, "output_tokens": completion}
    if cached is not None:
        usage["cache_read_input_tokens"] = cached
    return orjson.dumps({
        "id": rid, "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": text}], "model": model,
        "stop_reason": _ANTHROPIC_STOP.get(finish, "end_turn"), "stop_sequence": None,
        "usage": usage,
    })


def anthropic_error_body(message: str, err_type: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": err_type, "message": message}})
