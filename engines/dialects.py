"""The API dialects on the wire: a view of ``engines.apis`` (the registry, one module per
API) under the names the rest of the code has long imported."""

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
