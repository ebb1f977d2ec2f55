"""What the recorder needs to know about a request on the wire, and the one change it may
make to it. Pure: bytes and dicts in, values out.

The only rewrite is the dialect's (``Dialect.with_usage``): a streamed chat/completions
request that does not ask for ``stream_options.include_usage`` gets it (the prompt and output
token counts come from the final usage chunk), and ``ResponseObserver`` later removes that
extra chunk from the bytes the client sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from agent_replay.engines.apis import dialect, dialect_for_path

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""RFC 9110 section 7.6.1 connection-specific fields, never forwarded."""


AGENT_SESSION_HEADERS: tuple[str, ...] = (
    "X-Claude-Code-Session-Id",
    "session-id",
    "session_id",
    "thread-id",
    "thread_id",
)
"""Headers real agents name their session with (Claude Code; Codex CLI), read after the
configured ``--session-header``."""

AGENT_ID_HEADER = "x-claude-code-agent-id"
"""Claude Code's subagent id (``replay.record.agents``)."""

PARENT_SESSION_HEADER = "x-parent-session-id"
"""opencode's parent session, sent by a subagent's (child session's) requests."""

PARENT_THREAD_HEADER = "x-codex-parent-thread-id"
"""Codex's parent thread, sent by a subagent thread's requests (which name their own thread
in ``thread-id`` and the root's session in ``session-id``)."""


def agent_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What a request's headers say about its agent: ``agent_id`` (a Claude Code subagent;
    a Codex subagent's thread) and ``parent_session`` (the session that spawned this one,
    opencode)."""
    out = {}
    agent = headers.get(AGENT_ID_HEADER)
    if not agent and headers.get(PARENT_THREAD_HEADER):
        agent = headers.get("thread-id") or headers.get("thread_id")
    if agent:
        out["agent_id"] = agent
    parent = headers.get(PARENT_SESSION_HEADER)
    if parent:
        out["parent_session"] = parent
    return out


def header_session(headers: Mapping[str, str], configured: str) -> str | None:
    """The session a request's headers name: the configured header, else the first of
    ``AGENT_SESSION_HEADERS`` present (``headers`` is case-insensitive)."""
    for name in (configured, *AGENT_SESSION_HEADERS):
        value = headers.get(name)
        if value:
            return value
    return None


def api_for(method: str, path: str) -> str | None:
    """The API a request speaks (its dialect matches the end of the path, so that a base
    URL with a prefix such as ``/openai/v1/chat/completions`` is understood too), or None
    for anything the recorder only forwards."""
    if method != "POST":
        return None
    d = dialect_for_path(path)
    return d.name if d is not None else None


def end_to_end_headers(headers: Any, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The headers a proxy forwards: without hop-by-hop fields, those the ``Connection``
    field names, and ``drop`` (lower-case names). ``headers`` is a multidict or a list of
    pairs; repeated fields keep their order."""
    items = list(headers.items()) if hasattr(headers, "items") else list(headers)
    named: set[str] = set()
    for k, v in items:
        if k.lower() == "connection":
            named.update(t.strip().lower() for t in v.split(",") if t.strip())
    out = []
    for k, v in items:
        lk = k.lower()
        if lk in HOP_BY_HOP or lk in named or lk in drop:
            continue
        out.append((k, v))
    return out


@dataclass(slots=True)
class RequestInfo:
    """The parts of a request body the recorder uses."""

    api: str
    body: dict[str, Any]
    model: str | None
    stream: bool
    injected_usage: bool
    """The proxy added ``stream_options.include_usage``; the client did not ask for it."""
    session_hint: str | None
    """``metadata.user_id`` (messages) or ``user`` (OpenAI APIs), when the body has one."""
    undecoded: str | None = None
    """Why the body could not be decoded (its Content-Encoding); ``body`` is then empty."""


UNRECORDED = {"not_utf8": "not UTF-8", "not_json": "not JSON", "not_object": "not a JSON object"}
"""Why an API request body was forwarded but not recorded: key, and the words for it."""


def unrecorded_why(raw: bytes) -> str:
    """Why ``inspect_request`` found no JSON object in ``raw`` (a key of ``UNRECORDED``)."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return "not_utf8"
        return "not_json"
    return "not_object"


def inspect_request(
    api: str, raw: bytes, rewrite: bool = True, path: str = ""
) -> tuple[RequestInfo, bytes] | None:
    """Parse a request body; returns its info and the bytes to send upstream, or None
    when the body is not a JSON object (it is then forwarded untouched, not recorded).
    Without ``rewrite`` the body goes as sent (no ``include_usage`` added). ``path``: the
    request path, for APIs that name the model or the stream there."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    d = dialect(api)
    stream = d.streams(body) or d.path_streams(path)
    hint = d.session_hint(body)
    out = raw
    injected = False
    if rewrite and stream:
        changed = d.with_usage(raw, body)
        if changed is not None:
            out, injected = changed, True
    info = RequestInfo(
        api=api,
        body=body,
        model=d.model(body) or d.path_model(path),
        stream=stream,
        injected_usage=injected,
        session_hint=str(hint) if isinstance(hint, (str, int)) and str(hint) else None,
    )
    return info, out
