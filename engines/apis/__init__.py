"""The APIs on the wire, one module each (a ``Dialect``), found by the trace's ``api`` name.

The replay client, the recorder and the simulated engine look a dialect up here and never
branch on an API's name. Adding an API is one module and its line below.
"""

from __future__ import annotations

from agent_replay.engines.apis import chat, completions, gemini, messages, responses
from agent_replay.engines.apis.base import Decoder, Dialect, ServedRequest

DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        completions.DIALECT,
        chat.DIALECT,
        messages.DIALECT,
        responses.DIALECT,
        gemini.DIALECT,
    )
}
"""Every API, by the trace's ``api`` name."""


def dialect(name: str) -> Dialect:
    """The dialect of an API name; ``ValueError`` naming the known ones otherwise."""
    d = DIALECTS.get(name)
    if d is None:
        raise ValueError(f"unknown api {name!r}; known: {', '.join(DIALECTS)}")
    return d


def dialect_for_path(path: str) -> Dialect | None:
    """The API a request path speaks (the longest matching end wins), or None."""
    best, length = None, 0
    for d in DIALECTS.values():
        n = d.match(path)
        if n > length:
            best, length = d, n
    return best


__all__ = ["DIALECTS", "Decoder", "Dialect", "ServedRequest", "dialect", "dialect_for_path"]
