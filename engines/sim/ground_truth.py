"""What the simulated engine really did, per request, for checking clients' measurements.

One row per request: its X-Request-Id (or the response id), when the server's handler got
it (``received_ns``) and when its event loop first read the request's bytes
(``first_byte_ns``: the difference is the engine's own ingress queue, the requests parsed
and handled before it), and for every chunk written the ``time.monotonic_ns()`` right after the write, the engine's
scheduled time for it and its token count. CLOCK_MONOTONIC is shared by all processes of one
Linux host, so a client on the same host can compare its own timestamps directly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.errors import OutputExistsError

GROUND_TRUTH_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("api", pa.string(), nullable=False),
        pa.field("received_ns", pa.int64(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("cached_tokens", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("chunk_ns", pa.list_(pa.int64()), nullable=False),
        pa.field("chunk_scheduled_ns", pa.list_(pa.int64()), nullable=False),
        pa.field("chunk_tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("first_byte_ns", pa.int64()),
    ]
)


class GroundTruthRecorder:
    """Collects rows in memory; ``write`` saves them as one Parquet file."""

    def __init__(self, path: str | Path, *, force: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not force:
            raise OutputExistsError(str(self.path))
        self.rows: dict[str, list[Any]] = {f.name: [] for f in GROUND_TRUTH_SCHEMA}

    def add(
        self,
        *,
        request_id: str,
        api: str,
        received_ns: int,
        prompt_tokens: int,
        cached_tokens: int,
        finish_reason: str | None,
        chunk_ns: list[int],
        chunk_scheduled_ns: list[int],
        chunk_tokens: list[int],
        first_byte_ns: int | None = None,
    ) -> None:
        r = self.rows
        r["request_id"].append(request_id)
        r["api"].append(api)
        r["received_ns"].append(received_ns)
        r["prompt_tokens"].append(prompt_tokens)
        r["cached_tokens"].append(max(0, cached_tokens))
        r["finish_reason"].append(finish_reason)
        r["chunk_ns"].append(chunk_ns)
        r["chunk_scheduled_ns"].append(chunk_scheduled_ns)
        r["chunk_tokens"].append(chunk_tokens)
        r["first_byte_ns"].append(first_byte_ns)

    def __len__(self) -> int:
        return len(self.rows["request_id"])

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.rows, schema=GROUND_TRUTH_SCHEMA)

    def write(self) -> Path:
        """Write atomically (a temporary file beside it, then rename)."""
        dest = self.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        try:
            pq.write_table(self.table(), tmp_name, compression="zstd")
            os.replace(tmp_name, dest)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return dest
