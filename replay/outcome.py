"""One request's timing data as a value: what the results dataset stores per row.

Times are absolute ``time.monotonic_ns()`` values while the run is going; the result
writer turns them into offsets from the run's t0. Chunk times and token counts are typed
arrays (``array('q')``/``array('i')``): appending to them is the only per-chunk work.

``status`` is ``ok`` or ``error`` (``fail``: the first failure wins, with its
``error_kind``). A served request stays ``ok`` with error_kind ``mismatch`` (its token
counts differ from the trace) or ``inexact`` (the server did not say how many tokens each
chunk carried: ``chunk_tokens`` then counts one per content event and only the request's
times and its final usage are exact).
"""

from __future__ import annotations

from array import array

from agent_replay.results_schema import ErrorKindName

ERROR_CHARS = 2000
"""Characters of an error text written to the results."""
ERROR_KEEP = 16384
"""Characters of an error text kept until it is scrubbed and cut to ``ERROR_CHARS``."""


class RequestRecord:
    __slots__ = (
        "agent_id",
        "api",
        "cached_tokens",
        "chunk_ns",
        "chunk_tokens",
        "clone",
        "completion_tokens",
        "connect_ns",
        "depends_on",
        "end_ns",
        "error",
        "error_kind",
        "expected_input_tokens",
        "expected_output_tokens",
        "first_token_ns",
        "headers_ns",
        "http_status",
        "implied_cached_tokens",
        "intended_ns",
        "parent_end_ns",
        "parent_index",
        "prompt_tokens",
        "request_id",
        "request_index",
        "sent_ns",
        "session_id",
        "status",
        "think_ns",
        "warmup",
        "worker",
    )

    def __init__(
        self,
        *,
        session_id: str,
        request_index: int,
        parent_index: int,
        clone: int,
        worker: int,
        request_id: str,
        api: str,
        expected_input_tokens: int,
        expected_output_tokens: int,
        implied_cached_tokens: int | None,
    ) -> None:
        self.session_id = session_id
        self.request_index = request_index
        self.parent_index = parent_index
        self.clone = clone
        self.worker = worker
        self.request_id = request_id
        self.api = api
        self.warmup = False
        self.intended_ns = 0
        self.sent_ns: int | None = None
        self.connect_ns: int | None = None
        """Time from ``sent_ns`` until a new connection was open for the request and it could
        write there (None when a kept-alive one was reused); its bytes went out at
        ``sent_ns + connect_ns``."""
        self.headers_ns: int | None = None
        self.first_token_ns: int | None = None
        self.end_ns: int | None = None
        self.chunk_ns = array("q")
        self.chunk_tokens = array("i")
        self.parent_end_ns: int | None = None
        """When the latest dependency completed in this run (v1 traces: the parent)."""
        self.agent_id = "main"
        self.depends_on: list[int] = []
        self.think_ns: int | None = None
        self.expected_input_tokens = expected_input_tokens
        self.expected_output_tokens = expected_output_tokens
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.implied_cached_tokens = implied_cached_tokens
        self.status = "ok"
        self.error_kind: ErrorKindName | None = None
        self.http_status: int | None = None
        self.error: str | None = None

    def fail(self, kind: ErrorKindName, message: str) -> None:
        """Mark the request failed (the first failure wins). The message is kept whole up
        to ``ERROR_KEEP`` characters: the client scrubs secrets out of it before cutting it
        to ``ERROR_CHARS`` (a cut first could leave part of a secret behind)."""
        if self.status != "error":
            self.status = "error"
            self.error_kind = kind
            self.error = message[:ERROR_KEEP]

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)
