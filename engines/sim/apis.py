"""The APIs the simulated engine serves, by the trace's ``api`` name: for each, the request
parser, the stream encoder, the body of an answer that is not streamed and the error body.

vLLM's four (completions, chat, messages, responses) have the engine's own parsers (vLLM's
wording, ``requests``) and encoders (vLLM's captured field order, ``wire``). Any other API
registered in ``engines.apis`` whose dialect has the serving hooks is served through them
(``Served``); Gemini's with tool-call answers too (``sim.gemini``). The engine depends on
the wire code, never the reverse.
"""

from __future__ import annotations

from typing import Any

import orjson

from agent_replay.engines.apis import DIALECTS, Dialect
from agent_replay.engines.sim import gemini, wire
from agent_replay.engines.sim.requests import (
    BadRequest,
    ParsedRequest,
    parse_chat,
    parse_completions,
    parse_messages,
    parse_responses,
    responses_messages,
)
from agent_replay.engines.sim.requests import _check_len as check_len
from agent_replay.engines.sim.requests import _load as load_body
from agent_replay.engines.sim.requests import _sampling as sampling
from agent_replay.engines.sim.tokenizer import SimTokenizer


class SimApi:
    """One API as the engine serves it; the defaults are OpenAI's shapes."""

    tool_calls = True
    """The ``--tool-call`` rule applies (the API has tools and conversations)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.name = dialect.name

    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        raise NotImplementedError

    def conversation(self, data: dict[str, Any]) -> list[Any]:
        """The conversation a request ends with, as chat-style messages (the tool-call rule)."""
        msgs = data.get("messages")
        return msgs if isinstance(msgs, list) else []

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        """The encoder of one streamed answer: ``chunk(ids, finish)``, ``final(cached, finish)``."""
        raise NotImplementedError

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        raise NotImplementedError

    def error(self, exc: BadRequest) -> bytes:
        return openai_error(exc)


def openai_error(exc: BadRequest) -> bytes:
    """An error body in OpenAI's (and vLLM's) shape."""
    return orjson.dumps(
        {
            "error": {
                "message": exc.message,
                "type": exc.err_type,
                "param": exc.param,
                "code": exc.status,
            }
        }
    )


class _Completions(SimApi):
    tool_calls = False

    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        return parse_completions(body, tok, model_name, max_model_len)

    def conversation(self, data: dict[str, Any]) -> list[Any]:
        return []

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        return wire.CompletionsEncoder(
            rid=rid,
            created=created,
            model=model,
            table=table,
            prompt_ids=parsed.prompt_ids,
            return_token_ids=parsed.return_token_ids,
            include_usage=parsed.include_usage,
            continuous_usage=parsed.continuous_usage,
        )

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        return wire.completion_body(
            rid=rid,
            created=created,
            model=model,
            text=text,
            finish=finish,
            token_ids=ids if parsed.return_token_ids else None,
            prompt_ids=list(parsed.prompt_ids) if parsed.return_token_ids else None,
            prompt=prompt,
            completion=completion,
            cached=cached,
        )


class _Chat(SimApi):
    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        return parse_chat(body, tok, model_name, max_model_len)

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        return wire.ChatEncoder(
            rid=rid,
            created=created,
            model=model,
            table=table,
            prompt_ids=parsed.prompt_ids,
            return_token_ids=parsed.return_token_ids,
            include_usage=parsed.include_usage,
            continuous_usage=parsed.continuous_usage,
            tool_call=parsed.tool_call,
        )

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        return wire.chat_body(
            rid=rid,
            created=created,
            model=model,
            text=text,
            finish=finish,
            token_ids=ids if parsed.return_token_ids else None,
            prompt_ids=list(parsed.prompt_ids) if parsed.return_token_ids else None,
            prompt=prompt,
            completion=completion,
            cached=cached,
            tool_call=parsed.tool_call,
        )


class _Messages(SimApi):
    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        return parse_messages(body, tok, model_name, max_model_len)

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        return wire.MessagesEncoder(
            rid=rid,
            model=model,
            table=table,
            prompt_tokens=len(parsed.prompt_ids),
            tool_call=parsed.tool_call,
        )

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        return wire.messages_body(
            rid=rid,
            model=model,
            text=text,
            finish=finish,
            prompt=prompt,
            completion=completion,
            cached=cached,
            tool_call=parsed.tool_call,
        )

    def error(self, exc: BadRequest) -> bytes:
        kind = (
            "not_found_error"
            if exc.status == 404
            else ("overloaded_error" if exc.status == 503 else "invalid_request_error")
        )
        return wire.anthropic_error_body(exc.message, kind)


class _Responses(SimApi):
    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        return parse_responses(body, tok, model_name, max_model_len)

    def conversation(self, data: dict[str, Any]) -> list[Any]:
        return responses_messages(data)

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        return wire.ResponsesEncoder(
            rid=rid,
            created=created,
            model=model,
            table=table,
            prompt_tokens=len(parsed.prompt_ids),
            tool_call=parsed.tool_call,
        )

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        return wire.responses_body(
            rid=rid,
            created=created,
            model=model,
            text=text,
            finish=finish,
            prompt=prompt,
            completion=completion,
            cached=cached,
            tool_call=parsed.tool_call,
        )


class Served(SimApi):
    """An API served through its dialect's serving hooks (``Dialect.serve_request`` ...)."""

    tool_calls = False

    def parse(
        self,
        body: bytes,
        tok: SimTokenizer,
        model_name: str,
        max_model_len: int,
        path_model: str | None,
    ) -> ParsedRequest:
        data = load_body(body)
        try:
            req = self.dialect.serve_request(data, path_model)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if req.model is not None and req.model != model_name:
            raise BadRequest(
                f"The model `{req.model}` does not exist.", 404, "NotFoundError", "model"
            )
        ids = tok.chat_ids(req.messages, tools=req.tools)
        max_tokens = (
            req.max_tokens if req.max_tokens is not None else max(1, max_model_len - len(ids))
        )
        check_len(len(ids), max_tokens, max_model_len)
        parsed = ParsedRequest(
            self.name, ids, max_tokens, req.stream, include_usage=True, continuous_usage=True
        )
        return sampling(data, parsed)

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        return _TextEncoder(
            self.dialect.stream_encoder(
                rid=rid, created=created, model=model, prompt_tokens=len(parsed.prompt_ids)
            ),
            tok.texts(),
        )

    def body(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        text: str,
        ids: list[int],
        parsed: ParsedRequest,
        finish: str | None,
        prompt: int,
        completion: int,
        cached: int | None,
    ) -> bytes:
        return self.dialect.response_body(
            rid=rid,
            created=created,
            model=model,
            text=text,
            finish=finish,
            prompt=prompt,
            completion=completion,
            cached=cached,
        )

    def error(self, exc: BadRequest) -> bytes:
        return self.dialect.error_body(exc.message, exc.status)


class _Gemini(Served):
    """Gemini's API, served through its dialect, with tool-call answers (``sim.gemini``)."""

    tool_calls = True

    def conversation(self, data: dict[str, Any]) -> list[Any]:
        return gemini.conversation(data)

    def encoder(
        self,
        *,
        rid: str,
        created: int,
        model: str,
        table: wire.TokenTable,
        tok: SimTokenizer,
        parsed: ParsedRequest,
    ) -> Any:
        if parsed.tool_call is None:
            return super().encoder(
                rid=rid, created=created, model=model, table=table, tok=tok, parsed=parsed
            )
        return gemini.GeminiToolEncoder(
            rid=rid, model=model, prompt_tokens=len(parsed.prompt_ids), call=parsed.tool_call
        )


class _TextEncoder:
    """The engine's ``chunk(ids, finish)`` over a dialect encoder that takes text."""

    __slots__ = ("_enc", "_texts")

    def __init__(self, enc: Any, texts: list[str]) -> None:
        self._enc = enc
        self._texts = texts

    def chunk(self, ids: list[int], finish: str | None) -> bytes:
        t = self._texts
        return bytes(self._enc.chunk("".join([t[i] for i in ids]), len(ids), finish))

    def final(self, cached: int | None, finish: str | None = None) -> bytes:
        return bytes(self._enc.final(cached, finish))


_OWN: dict[str, type[SimApi]] = {
    "completions": _Completions,
    "chat": _Chat,
    "messages": _Messages,
    "responses": _Responses,
    "gemini": _Gemini,
}

SIM_APIS: dict[str, SimApi] = {
    name: _OWN[name](d) if name in _OWN else Served(d)
    for name, d in DIALECTS.items()
    if name in _OWN or d.serves
}
"""Every API the engine serves, by name."""
