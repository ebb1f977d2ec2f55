"""The trace schema: one row per LLM request. See docs/trace-format.md.

Version policy: ``SCHEMA_VERSION`` is an integer. A reader accepts files whose version is
<= its own; a file from a newer major version is refused with a message that says so.
Columns this version does not know are kept and passed through untouched.

v2 adds ``agent_id`` and ``depends_on`` (agent trees). Both are nullable in the Arrow
schema so that v1 files, and v2 rows without them, read; ``traces.tree.tree_columns``
derives the v1 meaning (agent ``main``, depends on the prefix parent).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 2
METADATA_KEY = b"agent_replay.trace"

TRACE_SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("request_index", pa.int32(), nullable=False),
        pa.field("parent_index", pa.int32(), nullable=False),
        pa.field("arrival_ns", pa.int64(), nullable=False),
        pa.field("think_ns", pa.int64()),
        pa.field("input_tokens", pa.int32(), nullable=False),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("cached_tokens", pa.int32()),
        pa.field("hash_ids", pa.list_(pa.int64())),
        pa.field("api", pa.dictionary(pa.int32(), pa.string())),
        pa.field("model", pa.dictionary(pa.int32(), pa.string())),
        pa.field("ttft_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("chunk_gaps_ns", pa.list_(pa.int64())),
        pa.field("chunk_tokens", pa.list_(pa.int32())),
        pa.field("content", pa.string()),
        # v2 (agent trees), last so that v1 column positions hold
        pa.field("agent_id", pa.dictionary(pa.int32(), pa.string())),
        pa.field("depends_on", pa.list_(pa.int32())),
        # the output size was estimated from content (no final count in the source)
        pa.field("output_estimated", pa.bool_()),
    ]
)

REQUIRED_COLUMNS = tuple(f.name for f in TRACE_SCHEMA if not f.nullable)
KNOWN_COLUMNS = tuple(TRACE_SCHEMA.names)

SOURCES = ("recorded", "synthetic")  # or "imported:FORMAT"
CONTENT_MODES = ("none", "hashed", "full")
APIS = ("chat", "completions", "messages", "responses")


@dataclass
class TraceMeta:
    """File-level metadata, stored as one JSON blob under ``METADATA_KEY``."""

    schema_version: int = SCHEMA_VERSION
    block_size: int = 512
    source: str = "synthetic"
    content_mode: str = "none"
    tokenizer: str | None = None
    start_wall_ns: int | None = None
    tool_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> TraceMeta:
        data = json.loads(raw)
        known = {k: data.pop(k) for k in list(data) if k in cls.__dataclass_fields__}
        meta = cls(**known)
        meta.extra.update(data)  # unknown keys from newer writers are kept
        return meta


def empty_table() -> pa.Table:
    return TRACE_SCHEMA.empty_table()
