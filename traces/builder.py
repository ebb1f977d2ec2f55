"""Assemble importer output into a trace table.

Importers produce ``Request`` values with absolute times in nanoseconds (any epoch); the
builder shifts arrivals to the trace start and numbers requests per session in arrival
order, translating parent references to ``request_index`` values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from agent_replay.errors import TraceError
from agent_replay.traces.hashing import chain_hashes
from agent_replay.traces.io import conform


@dataclass
class Request:
    """One request as an importer sees it. ``key`` identifies it inside its session (for
    parent references); times are absolute nanoseconds."""

    session: str
    key: object
    arrival_abs_ns: int
    input_tokens: int
    output_tokens: int
    parent_key: object | None = None
    think_ns: int | None = None
    cached_tokens: int | None = None
    hash_ids: list[int] | None = None
    api: str | None = None
    model: str | None = None
    ttft_ns: int | None = None
    end_ns: int | None = None
    agent_id: str | None = None
    """Stream inside the session (schema v2); None: null (read as ``main``)."""
    output_estimated: bool | None = None
    """The output size was estimated from content (the source logged no final count)."""
    depends_on_keys: list[object] | None = None
    """Keys of the requests this one waits for (schema v2); None: null (read as its
    parent)."""
    extra: dict[str, object] = field(default_factory=dict)


def link_to_parent(r: Request, parent: Request | None, block_size: int, tag: str) -> None:
    """For agent logs without prompt text: the think time since the parent's last byte, and
    prefix hashes that extend the parent's (``chain_hashes``; ``tag`` keeps new blocks
    unique to this request)."""
    if parent is not None and parent.end_ns is not None:
        r.think_ns = max(0, r.arrival_abs_ns - (parent.arrival_abs_ns + parent.end_ns))
    r.hash_ids = chain_hashes(
        parent.hash_ids if parent else None,
        parent.input_tokens if parent else None,
        r.input_tokens,
        r.cached_tokens,
        block_size,
        tag,
    )


def build_table(
    requests: Sequence[Request], *, start_ns: int | None = None
) -> tuple[pa.Table, int]:
    """The trace table (rows ordered by arrival, ties in input order) and the absolute
    start time used as arrival 0."""
    reqs = sorted(enumerate(requests), key=lambda p: (p[1].arrival_abs_ns, p[0]))
    start = start_ns if start_ns is not None else (reqs[0][1].arrival_abs_ns if reqs else 0)
    counters: dict[str, int] = {}
    index_of: dict[tuple[str, object], int] = {}
    cols: dict[str, list[object]] = {
        name: []
        for name in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "cached_tokens",
            "hash_ids",
            "api",
            "model",
            "ttft_ns",
            "end_ns",
            "agent_id",
            "depends_on",
            "output_estimated",
        )
    }
    for _, r in reqs:
        idx = counters.get(r.session, 0)
        counters[r.session] = idx + 1
        index_of[(r.session, r.key)] = idx
        parent = -1
        if r.parent_key is not None:
            parent = index_of.get((r.session, r.parent_key), -1)
        deps: list[int] | None = None
        if r.depends_on_keys is not None:
            deps = []
            for k in r.depends_on_keys:
                d = index_of.get((r.session, k))
                if d is None or d == idx:
                    raise TraceError(
                        f"session {r.session!r}, request {r.key!r}: depends on "
                        f"{k!r}, which does not arrive before it in the session"
                    )
                deps.append(d)
            deps.sort()
        cols["agent_id"].append(r.agent_id)
        cols["output_estimated"].append(r.output_estimated)
        cols["depends_on"].append(deps)
        cols["session_id"].append(r.session)
        cols["request_index"].append(idx)
        cols["parent_index"].append(parent)
        cols["arrival_ns"].append(r.arrival_abs_ns - start)
        cols["think_ns"].append(r.think_ns)
        cols["input_tokens"].append(r.input_tokens)
        cols["output_tokens"].append(r.output_tokens)
        cols["cached_tokens"].append(r.cached_tokens)
        cols["hash_ids"].append(r.hash_ids)
        cols["api"].append(r.api)
        cols["model"].append(r.model)
        cols["ttft_ns"].append(r.ttft_ns)
        cols["end_ns"].append(r.end_ns)
    table = pa.table(
        {
            "session_id": pa.array(cols["session_id"], pa.string()).dictionary_encode(),
            "request_index": pa.array(cols["request_index"], pa.int32()),
            "parent_index": pa.array(cols["parent_index"], pa.int32()),
            "arrival_ns": pa.array(cols["arrival_ns"], pa.int64()),
            "think_ns": pa.array(cols["think_ns"], pa.int64()),
            "input_tokens": pa.array(cols["input_tokens"], pa.int32()),
            "output_tokens": pa.array(cols["output_tokens"], pa.int32()),
            "cached_tokens": pa.array(cols["cached_tokens"], pa.int32()),
            "hash_ids": pa.array(cols["hash_ids"], pa.list_(pa.int64())),
            "api": pa.array(cols["api"], pa.string()).dictionary_encode(),
            "model": pa.array(cols["model"], pa.string()).dictionary_encode(),
            "ttft_ns": pa.array(cols["ttft_ns"], pa.int64()),
            "end_ns": pa.array(cols["end_ns"], pa.int64()),
            "agent_id": pa.array(cols["agent_id"], pa.string()).dictionary_encode(),
            "depends_on": pa.array(cols["depends_on"], pa.list_(pa.int32())),
            "output_estimated": pa.array(cols["output_estimated"], pa.bool_()),
        }
    )
    return conform(table), start


def concat(tables: Iterable[pa.Table]) -> pa.Table:
    ts = [conform(t) for t in tables]
    return pa.concat_tables(ts).combine_chunks() if len(ts) > 1 else ts[0]
