"""Stop a run that cannot measure anything: when the first requests all fail the same way
with a client error (the same 4xx status and the same message, such as an unknown model or
a bad API key), every later request would fail too. The run stops after them (status
``aborted``) and says the server's message in one line, instead of playing the whole
schedule to report "http 57".

``FirstFailures`` is a small state machine fed with each request's outcome; it decides
nothing after the first ``FIRST`` outcomes, and ignores statuses that depend on load or
timing (408 timeout, 429 rate limit) and requests cancelled by the run itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agent_replay.results_schema import ErrorKind

FIRST = 8
"""The first requests of a worker that must all fail alike for it to stop."""
TRANSIENT = (408, 425, 429)
"""Client errors that depend on load or timing, not on the request: they stop nothing."""
MESSAGE_CHARS = 300

_PREFIX = re.compile(r"^\s*http\s+\d{3}\s*:?\s*", re.IGNORECASE)


def server_message(error: str | None) -> str:
    """The server's message in one line, from a failed request's ``error`` text (``HTTP
    404: {"error": {"message": ...}}``): OpenAI's, vLLM's and Anthropic's ``message`` (or
    FastAPI's ``detail``) when the body is JSON, else the text itself."""
    text = _PREFIX.sub("", error or "").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    found = _message_of(body)
    if found:
        text = found
    return " ".join(text.split())[:MESSAGE_CHARS]


def _message_of(body: object) -> str | None:
    if isinstance(body, dict):
        for key in ("error", "message", "detail", "msg"):
            v = body.get(key)
            if isinstance(v, str) and v.strip():
                return v
            inner = _message_of(v)
            if inner:
                return inner
    if isinstance(body, list) and body:
        return _message_of(body[0])
    return None


def request_error(http_status: int | None, error: str | None) -> tuple[int, str] | None:
    """(status, the server's message) of a failure the request itself caused (a 4xx that
    does not depend on load or timing); None for any other outcome."""
    if http_status is None or not 400 <= http_status < 500 or http_status in TRANSIENT:
        return None
    return http_status, server_message(error)


@dataclass
class FirstFailures:
    """Fed with each finished request (``observe``); ``reason`` is the one line to stop on,
    set once the first ``first`` requests have all failed with one client error."""

    first: int = FIRST
    seen: int = 0
    key: tuple[int, str] | None = None
    reason: str | None = None
    open: bool = True
    """Still deciding: False once a request succeeded or failed otherwise."""

    def observe_record(self, rec: Any) -> str | None:
        """``observe`` for a ``replay.outcome.RequestRecord``."""
        return self.observe(
            rec.status == "ok", rec.error_kind == ErrorKind.CANCELLED, rec.http_status, rec.error
        )

    def observe(
        self, ok: bool, cancelled: bool, http_status: int | None, error: str | None
    ) -> str | None:
        """The reason to stop (once, when the ``first``-th alike failure arrives), else None."""
        if not self.open or cancelled:
            return None
        key = None if ok else request_error(http_status, error)
        if key is None or (self.key is not None and key != self.key):
            self.open = False
            return None
        self.key = key
        self.seen += 1
        if self.seen < self.first:
            return None
        self.open = False
        self.reason = (
            f"the first {self.seen} requests all failed with HTTP {key[0]}: "
            f"{key[1] or '(no message)'}"
        )
        return self.reason
