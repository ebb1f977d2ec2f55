"""Small traces and a fake transport for the replay tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from agent_replay.replay.clock import FakeClock
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlannedRequest
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta

MS = 1_000_000


TYPES: dict[str, pa.DataType] = {
    "session_id": pa.string(),
    "request_index": pa.int32(),
    "parent_index": pa.int32(),
    "arrival_ns": pa.int64(),
    "think_ns": pa.int64(),
    "input_tokens": pa.int32(),
    "output_tokens": pa.int32(),
    "cached_tokens": pa.int32(),
    "hash_ids": pa.list_(pa.int64()),
    "end_ns": pa.int64(),
    "api": pa.string(),
    "agent_id": pa.string(),
    "depends_on": pa.list_(pa.int32()),
}
BASIC = (
    "session_id",
    "request_index",
    "parent_index",
    "arrival_ns",
    "think_ns",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "hash_ids",
    "end_ns",
    "api",
)


def trace_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = BASIC) -> pa.Table:
    """Rows -> a trace table of ``columns`` (typed by ``TYPES``; a key a row lacks is null)."""
    return pa.table(
        {k: [r.get(k) for r in rows] for k in columns},
        schema=pa.schema([(k, TYPES[k]) for k in columns]),
    )


def tree_rows_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows that all have the same keys -> a trace table of exactly those columns."""
    return trace_table(rows, list(rows[0]))


def columns_table(cols: dict[str, list[Any]]) -> pa.Table:
    """Columns by name -> a trace table typed by ``TYPES``."""
    return pa.table(cols, schema=pa.schema([(k, TYPES[k]) for k in cols]))


def chain_rows(
    n_sessions: int,
    per_session: int,
    *,
    gap_ns: int = 100 * MS,
    think_ns: int = 50 * MS,
    input_tokens: int = 100,
    output_tokens: int = 8,
    block: int = 16,
    shared_prefix: bool = True,
) -> list[dict[str, Any]]:
    """Sessions of chained requests; request r's prompt extends request r-1's prompt."""
    rows = []
    for s in range(n_sessions):
        for r in range(per_session):
            n_in = input_tokens + 40 * r
            n_blocks = -(-n_in // block)
            rows.append(
                {
                    "session_id": f"s{s}",
                    "request_index": r,
                    "parent_index": r - 1,
                    "arrival_ns": s * gap_ns + r * 300 * MS,
                    "think_ns": think_ns if r else None,
                    "input_tokens": n_in,
                    "output_tokens": output_tokens + r,
                    "hash_ids": [s * 1000 + i for i in range(n_blocks)] if shared_prefix else None,
                }
            )
    return rows


def write_rows(path: Path, rows: Sequence[dict[str, Any]], block_size: int = 16) -> Path:
    return write_trace(trace_table(rows), path, TraceMeta(block_size=block_size), force=True)


class FakeTransport:
    """Serves each request in ``service_ns(q)`` of fake time, in ``chunks`` equal chunks."""

    def __init__(self, clock: FakeClock, service_ns: int = 20 * MS, send_delay_ns: int = 0) -> None:
        self.clock = clock
        self.service_ns = service_ns
        self.send_delay_ns = send_delay_ns
        self.prepared: list[str] = []
        self.log: list[tuple[str, int, int, int]] = []  # (session key, request_index, sent, end)
        self.in_flight = 0
        self.max_in_flight = 0

    async def prepare(self, q: PlannedRequest, request_id: str, session_key: str) -> Any:
        self.prepared.append(request_id)
        return (q, session_key)

    async def send(self, prepared: Any, rec: RequestRecord) -> None:
        q, key = prepared
        rec.sent_ns = self.clock.now_ns() + self.send_delay_ns
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.clock.sleep_until(rec.sent_ns + self.service_ns)
            rec.end_ns = self.clock.now_ns()
            rec.chunk_ns.append(rec.end_ns)
            rec.chunk_tokens.append(q.output_tokens)
            self.log.append((key, q.request_index, rec.sent_ns, rec.end_ns))
        finally:
            self.in_flight -= 1
