"""Request bodies of the four APIs parsed and validated into one ``ParsedRequest``.

Pure: bytes in, a ParsedRequest or a ``BadRequest`` (status, message) out. Messages follow
vLLM's wording where it is known.

The prompt is counted as vLLM's chat template renders it: the ``tools`` the request
offers, then the system prompt, then the conversation (``SimTokenizer.chat_ids``).

A tool-call answer (``ToolCallSpec``, ``engines sim --tool-call NAME=ARGS``, repeatable: the
first whose tool is offered applies): a request that offers a tool of that name and whose last conversation item is a user's message (not a tool
result) is answered with one call of that tool with those arguments. Its output is the
arguments text, one token per tokenizer piece, so the stream and its counts stay exact;
the agent runs the tool and sends the result, which the engine answers with text. A user
message made only of ``<system-reminder>`` or ``<task-notification>`` blocks is the
client's own note, not a user's turn (Claude Code and qwen-code tell the main agent so that
a background subagent finished), and is answered with text too: else each notice would
start another subagent.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agent_replay.engines.sim.tokenizer import SimTokenizer, message_text


class BadRequest(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    """The tool call the engine answers with when the request offers ``name``."""

    name: str
    arguments: str
    """JSON text of the call's arguments."""

    @classmethod
    def parse(cls, text: str) -> ToolCallSpec:
        """``NAME=ARGS_JSON`` (e.g. ``Bash={"command": "ls"}``); ``ValueError`` otherwise."""
        name, sep, args = text.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"tool call {text!r}: expected NAME=JSON_ARGUMENTS")
        try:
            obj = orjson.loads(args)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"tool call {text!r}: arguments are not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"tool call {text!r}: arguments must be a JSON object")
        return cls(name.strip(), args.strip())


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the engine answers with: name, arguments text and its pieces (one per
    output token), and a unique call id."""

    name: str
    arguments: str
    pieces: tuple[str, ...]
    call_id: str
    namespace: str | None = None
    """The Responses ``namespace`` tool that offers it (Codex's ``multi_agent_v1``)."""


@dataclass(slots=True)
class ParsedRequest:
    api: str  # the trace's api name
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    min_tokens: int = 0
    ignore_eos: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    seed: int | None = None
    tool_call: ToolCall | None = None


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
            f"{req.min_tokens}.",
            param="min_tokens",
        )
    req.ignore_eos = _bool(data, "ignore_eos")
    req.return_token_ids = _bool(data, "return_token_ids")
    seed = data.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest("seed: Input should be a valid integer", param="seed")
        req.seed = seed
    return req


def parse_completions(
    body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int
) -> ParsedRequest:
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
        raise BadRequest(
            "prompt: the simulated engine takes one prompt per request", param="prompt"
        )
    else:
        raise BadRequest("prompt: Field required (a string or a list of token ids)", param="prompt")
    stream = _bool(data, "stream")
    include, cont = _stream_opts(data, stream)
    max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = 16 if "max_tokens" not in data else max_model_len - len(ids)
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest(
        "completions", ids, max_tokens, stream, include_usage=include, continuous_usage=cont
    )
    return _sampling(data, req)


def parse_chat(
    body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int
) -> ParsedRequest:
    data = _load(body)
    _common(data, model_name)
    messages = data.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise BadRequest(
            "messages: Field required (a non-empty list of messages)", param="messages"
        )
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages.{i}.role: Field required", param="messages")
    ids = tok.chat_ids(messages, _bool(data, "add_generation_prompt", True), tools=_tools(data))
    stream = _bool(data, "stream")
    include, cont = _stream_opts(data, stream)
    max_tokens = _int(data, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = max(1, max_model_len - len(ids))
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest(
        "chat", ids, max_tokens, stream, include_usage=include, continuous_usage=cont
    )
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


def parse_messages(
    body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int
) -> ParsedRequest:
    data = _load(body)
    messages = data.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise BadRequest(
            "messages: Field required (a non-empty list of messages)", param="messages"
        )
    max_tokens = _int(data, "max_tokens", 1)
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    model = data.get("model")
    if model is not None and model != model_name:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    ids = tok.chat_ids(anthropic_messages(data), tools=_tools(data))
    stream = _bool(data, "stream")
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest(
        "messages", ids, max_tokens, stream, include_usage=True, continuous_usage=True
    )
    return _sampling(data, req)


def _tools(data: dict[str, Any]) -> list[Any] | None:
    tools = data.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools: Input should be a valid list", param="tools")
    return tools or None


def tool_names(tools: Any) -> dict[str, str | None]:
    """Names of the tools a request offers, in any API's shape, each with the Responses
    ``namespace`` tool that groups it (None: none)."""
    out: dict[str, str | None] = {}
    for t in tools if isinstance(tools, list) else ():
        if not isinstance(t, dict):
            continue
        if t.get("type") == "namespace" and isinstance(t.get("name"), str):
            for inner in tool_names(t.get("tools")):
                out.setdefault(inner, t["name"])
            continue
        if isinstance(t.get("functionDeclarations"), list):  # Gemini's group of functions
            out.update(dict.fromkeys(tool_names(t["functionDeclarations"])))
            continue
        fn = t.get("function")
        name = fn.get("name") if isinstance(fn, dict) else t.get("name")
        if isinstance(name, str):
            out[name] = None
    return out


def _user_turn(items: list[Any]) -> bool:
    """The last conversation item (system reminders after it aside: Claude Code appends
    some) is a user's message, not a tool result."""
    last = None
    for it in reversed(items):
        if not (isinstance(it, dict) and it.get("role") in ("system", "developer")):
            last = it
            break
    if not isinstance(last, dict) or last.get("role") != "user":
        return False
    content = last.get("content")
    if isinstance(content, list):
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return False
        texts = [b.get("text") if isinstance(b, dict) else b for b in content]
        return not texts or not all(
            isinstance(t, str) and t.lstrip().startswith(NOTE) for t in texts
        )
    return not (isinstance(content, str) and content.lstrip().startswith(NOTE))


NOTE = ("<system-reminder>", "<task-notification>")
"""How Claude Code opens a text block of its own in a user message (not the user's words),
and how qwen-code opens its notice that a background subagent finished."""


def plan_tool_call(
    req: ParsedRequest,
    specs: Sequence[ToolCallSpec],
    data: dict[str, Any],
    items: list[Any],
    tok: SimTokenizer,
    max_model_len: int,
) -> ParsedRequest:
    """Make ``req`` answer with the first of ``specs`` whose tool the request offers, on a
    user's turn (see the module text): its output becomes the arguments' pieces, exactly."""
    offered = tool_names(data.get("tools"))
    spec = next((s for s in specs if s.name in offered), None)
    if spec is None or not _user_turn(items):
        return req
    pieces = tuple(tok.pieces(spec.arguments))
    call_id = "call_" + secrets.token_hex(12)  # unique, as a real model's are
    req.tool_call = ToolCall(spec.name, spec.arguments, pieces, call_id, offered[spec.name])
    n = max(1, len(pieces))
    _check_len(len(req.prompt_ids), n, max_model_len)
    req.max_tokens = n
    req.min_tokens = n
    req.ignore_eos = True
    return req


def responses_messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses ``instructions`` + ``input`` items as OpenAI-style chat messages: message
    items keep their role and content parts; a ``function_call`` becomes an assistant
    message with that call; a ``function_call_output`` a tool message; other items
    (reasoning...) count as their JSON."""
    out: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    inp = data.get("input")
    if isinstance(inp, str):
        return [*out, {"role": "user", "content": inp}]
    for i, item in enumerate(inp if isinstance(inp, list) else ()):
        if not isinstance(item, dict):
            raise BadRequest(f"input.{i}: Input should be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and "type" not in item):
            role = item.get("role")
            if not isinstance(role, str):
                raise BadRequest(f"input.{i}.role: Field required", param="input")
            out.append({"role": role, "content": item.get("content")})
        elif kind == "function_call":
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"name": item.get("name"), "arguments": item.get("arguments")}],
                }
            )
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": item.get("output")})
        else:
            out.append({"role": "assistant", "content": orjson.dumps(item).decode()})
    return out


def parse_responses(
    body: bytes, tok: SimTokenizer, model_name: str, max_model_len: int
) -> ParsedRequest:
    data = _load(body)
    _common(data, model_name)
    inp = data.get("input")
    if not (isinstance(inp, str) and inp) and not (isinstance(inp, list) and inp):
        raise BadRequest("input: Field required (text or a non-empty list of items)", param="input")
    if data.get("previous_response_id"):
        raise BadRequest(
            "previous_response_id: the simulated engine stores no responses; "
            "send the whole conversation",
            param="previous_response_id",
        )
    ids = tok.chat_ids(responses_messages(data), tools=_tools(data))
    stream = _bool(data, "stream")
    max_tokens = _int(data, "max_output_tokens", 1)
    if max_tokens is None:
        max_tokens = max(1, max_model_len - len(ids))
    _check_len(len(ids), max_tokens, max_model_len)
    req = ParsedRequest(
        "responses", ids, max_tokens, stream, include_usage=True, continuous_usage=True
    )
    return _sampling(data, req)
