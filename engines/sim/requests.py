"""Request bodies of the three APIs parsed and validated into one ``ParsedRequest``.

Pure: bytes in, a ParsedRequest or a ``BadRequest`` (status, message) out. Messages follow
vLLM's wording where it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from engines.sim.tokenizer import SimTokenizer, message_text


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param


@dataclass(slots=True)
class ParsedRequest:
    api: str  # "completions" | "chat" | "messages"
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    min_tokens: int = 0
    ignore_eos: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    seed: int | None = None


def _load(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"JSON decode error: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object")
    return data


def _bool(data: dict[str, Any], key: str, default: bool = False) -> bool:
    v = data.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{key}: Input should be a valid boolean", param=key)
    return v


def _int(data: dict[str, Any], key: str, lo: int) -> int | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{key}: Input should be a valid integer", param=key)
    if v < lo:
        raise BadRequest(f"{key} must be at least {lo}, got {v}.", param=key)
    return v


def _common(data: dict[str, Any], model_name: str) -> None:
    model = data.get("model")
    if model is not None and model != model_name:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    n = data.get("n")
    if n not in (None, 1):
        raise BadRequest("n: the simulated engine supports n=1 only", param="n")


def _stream_opts(data: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    opts = data.get("stream_options")
    if opts is None:
        return False, False
    if not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    if not isinstance(opts, dict):
        raise BadRequest("stream_options: Input should be a valid dictionary")
    include = _bool(opts, "include_usage")
    cont = _bool(opts, "continuous_usage_stats")
    return include, include and cont


def _check_len(prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    if prompt_len == 0:
        raise BadRequest("Prompt cannot be empty")
    if prompt_len >= max_model_len:
        raise BadRequest(
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model length "
            f"of {max_model_len}. Make sure that `max_model_len` is no smaller than the number "
            "of text tokens."
        )
    if prompt_len + max_tokens > max_model_len:
        raise BadRequest(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_len} input tokens ({max_tokens} > {max_model_len} - {prompt_len})."
        )


def _token_ids(v: list[Any], vocab: int) -> list[int]:
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int):
            raise BadRequest("prompt: token ids must be integers", param="prompt")
        if not 0 <= t < vocab:
            raise BadRequest(f"Token id {t} is out of vocabulary", param="prompt")
    return v


def _sampling(data: dict[str, Any], req: ParsedRequest) -> ParsedRequest:
    req.min_tokens = _int(data, "min_tokens", 0) or 0
    if req.min_tokens > req.max_tokens:
        raise BadRequest(
            f"min_tokens must be less than or equal to max_tokens={req.max_tokens}, got "
            f"{req.min_tokens}.", param="min_tokens"
        )
    req.ignore_eos = _bool(data, "ignore_eos")
    req.return_token_ids = _bool(data, "return_token_ids")
    seed = data.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest("seed: Input should be a valid integer", param="seed")
        req.seed = seed
    return req


def parse_completions(body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int) -> ParsedRequest:
    data = _load(body)
    _common(data, model_name)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = _token_ids(prompt, tok.vocab_size)
    elif isinstance(prompt, list):
        raise BadRequest("prompt: the simulated engine takes one prompt per request", param="prompt")
    else:
        raise BadRequest("prompt: Field required (a string or a list of token ids)", param="prompt")
    stream = _bool(data, "stream")
    include, cont = _stream_opts(data, stream)
    max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = 16 if "max_tokens" not in data else max_model_len - len(ids)
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest("completions", ids, max_tokens, stream, include_usage=include,
                        continuous_usage=cont)
    return _sampling(data, req)


def parse_chat(body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int) -> ParsedRequest:
    data = _load(body)
    _common(data, model_name)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages: Field required (a non-empty list of messages)", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages.{i}.role: Field required", param="messages")
    ids = tok.chat_ids(messages, _bool(data, "add_generation_prompt", True))
    stream = _bool(data, "stream")
    include, cont = _stream_opts(data, stream)
    max_tokens = _int(data, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = max(1, max_model_len - len(ids))
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest("chat", ids, max_tokens, stream, include_usage=include, continuous_usage=cont)
    return _sampling(data, req)


def anthropic_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic ``system`` + ``messages`` as OpenAI-style messages for the chat template."""
    out: list[dict[str, Any]] = []
    system = data.get("system")
    if system:
        out.append({"role": "system", "content": message_text({"content": system})})
    for m in data.get("messages") or []:
        out.append(m)
    return out


def parse_messages(body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int) -> ParsedRequest:
    data = _load(body)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages: Field required (a non-empty list of messages)", param="messages")
    max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    model = data.get("model")
    if model is not None and model != model_name:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    ids = tok.chat_ids(anthropic_messages(data))
    stream = _bool(data, "stream")
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest("messages", ids, max_tokens, stream, include_usage=True, continuous_usage=True)
    return _sampling(data, req)
