"""The API dialects on the wire, in one import: the registry of ``engines.apis`` (one module
per API), its stream decoders, and ``build_request``/``API_PATHS`` by API name."""

from __future__ import annotations

from typing import Any

from agent_replay.engines.apis import DIALECTS, Decoder, Dialect, dialect
from agent_replay.engines.apis.base import encode_body, read_usage
from agent_replay.engines.apis.messages import MessagesStreamDecoder
from agent_replay.engines.apis.openai import StreamDecoder, count_token_ids
from agent_replay.engines.apis.responses import ResponsesStreamDecoder

API_PATHS: dict[str, str] = {name: d.route for name, d in DIALECTS.items()}
"""Request path (``{model}`` where the model is part of it) per API name."""


def build_request(api: str, **kw: Any) -> dict[str, Any]:
    """The JSON body of a streamed request of ``api`` (see ``Dialect.build``)."""
    return dialect(api).build(**kw)


__all__ = [
    "API_PATHS",
    "DIALECTS",
    "Decoder",
    "Dialect",
    "MessagesStreamDecoder",
    "ResponsesStreamDecoder",
    "StreamDecoder",
    "build_request",
    "count_token_ids",
    "dialect",
    "encode_body",
    "read_usage",
]
