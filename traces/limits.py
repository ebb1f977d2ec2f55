"""Bounds on what reading a trace may cost, checked before the bytes are decoded.

A Parquet file can be tiny on disk and enormous in memory: one long string in a dictionary
page repeated on every row, a run-length encoded list of millions of values, row-group
metadata that claims billions of rows. A trace is read one row group at a time, and each is
checked first from the file's metadata (rows, and the decoded size of every column
chunk: values times width for numbers and lists of numbers, the uncompressed size for
plain strings), then, with string columns read as dictionaries (their decoded size is the
dictionary's value lengths taken by the indices, a vectorized sum without decoding), per
value (string bytes, list lengths). A number of one of the schema's numeric columns that
is not finite is rejected by row and field. A column of a row group that decodes to more
than ``max_expansion`` times its size on disk (past a floor) is refused before it is
decoded. Every breach is a ``TraceError`` naming the file, the limit and, where known, the
row and field.

The decoded-bytes budget defaults to 8 GiB, or half the process's address-space limit
(``RLIMIT_AS``) when that is lower, so that a capped process gets the error, not a
``MemoryError``.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agent_replay.errors import TraceError
from agent_replay.traces.schema import TRACE_SCHEMA

GIB = 1 << 30
NAME_COLUMNS = frozenset({"session_id", "api", "model", "agent_id"})
"""Schema columns that hold names (``TraceLimits.max_name_bytes``)."""
NUMERIC_COLUMNS = frozenset(
    f.name for f in TRACE_SCHEMA if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
)
"""Schema columns that hold numbers: one stored as floats must hold finite ones (a column
the schema does not know is kept as it is, NaN included)."""


def memory_budget() -> int:
    """Bytes a trace may decode to: 8 GiB, or half of ``RLIMIT_AS`` when lower."""
    budget = 8 * GIB
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):  # pragma: no cover - platforms without RLIMIT_AS
        soft = resource.RLIM_INFINITY
    if soft != resource.RLIM_INFINITY and soft > 0:
        budget = min(budget, soft // 2)
    return budget


@dataclass(frozen=True)
class TraceLimits:
    max_rows: int = 100_000_000
    """Rows in a trace (all its files)."""
    max_value_bytes: int = 64 << 20
    """Bytes of one string value (a ``content`` body of a million-token context is ~4 MB)."""
    max_name_bytes: int = 4096
    """Bytes of one value of a dictionary-encoded name column of the schema (session_id,
    api, model, agent_id): each row becomes its own string when the plan is built."""
    max_list_length: int = 10_000_000
    """Entries of one list value: ``hash_ids`` and the chunk lists are bounded by a
    request's tokens (``validate.MAX_TOKENS``)."""
    max_bytes: int | None = None
    """Decoded bytes of the whole trace; None: ``memory_budget()``."""
    max_expansion: int = 1000
    """Decoded bytes of one column of a row group per byte it takes on disk, once it
    decodes to more than ``expansion_floor``: text compresses tens of times, a bomb (one
    long value on every row, runs of one character) tens of thousands of times."""
    expansion_floor: int = 64 << 20

    def budget(self) -> int:
        return self.max_bytes if self.max_bytes is not None else memory_budget()


def _width(t: pa.DataType) -> int | None:
    """Bytes per decoded value of a fixed-width type (lists: of their values)."""
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_dictionary(t):
        return 4
    try:
        return max(1, t.bit_width // 8)
    except ValueError:
        return None


def _is_string(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def string_columns(schema: pa.Schema) -> list[str]:
    """Top-level plain string columns: read as dictionaries so their decoded size can be
    checked before they are decoded."""
    return [f.name for f in schema if _is_string(f.type)]


class Reading:
    """The running totals of one trace being read, against ``limits``."""

    def __init__(self, limits: TraceLimits, *, per_group: bool = False) -> None:
        self.limits = limits
        self.budget = limits.budget()
        self.rows = 0
        self.bytes = 0
        self.per_group = per_group
        """The budget holds for each row group alone (a reader that keeps none of them)."""
        self.on_disk: dict[str, int] = {}
        """Compressed bytes of each column of the row group being read."""

    def skip(self, rows: int) -> None:
        """A row group left unread: its rows still count for the row numbers."""
        self.rows += rows

    def _fail(self, path: str, what: str, row: int | None = None, field: str | None = None) -> None:
        raise TraceError(f"{what}; refusing to read it", path=path, row=row, field=field)

    def check_row_group(
        self, pf: pq.ParquetFile, path: str, i: int, columns: list[str] | None, first_row: int
    ) -> None:
        """From the metadata, before row group ``i`` is read: rows, the lists' values and
        the decoded bytes of every column chunk that is not a dictionary of strings."""
        lim = self.limits
        rg = pf.metadata.row_group(i)
        n = rg.num_rows
        if self.per_group:
            self.bytes = 0
        if n < 0 or self.rows + n > lim.max_rows:
            self._fail(
                path,
                f"more than {lim.max_rows:,} rows (row group {i} claims {n:,}); "
                "the limit on rows per trace",
            )
        arrow = pf.schema_arrow
        names = set(columns) if columns is not None else set(arrow.names)
        total = 0
        self.on_disk = {}
        for j in range(rg.num_columns):
            col = rg.column(j)
            top = col.path_in_schema.split(".")[0]
            if top in names and top in arrow.names:
                total += self._chunk_bytes(path, i, n, col, top, arrow.field(top).type)
        if self.bytes + total > self.budget:
            self._fail(
                path,
                f"decodes to more than {self.budget / GIB:.2f} GiB (row group {i}, "
                "from its metadata), the memory budget for a trace",
            )
        self.rows += n
        self.bytes += total

    def _chunk_bytes(
        self, path: str, i: int, n: int, col: pq.ColumnChunkMetaData, top: str, t: pa.DataType
    ) -> int:
        """The decoded bytes of column chunk ``col`` (of column ``top``, type ``t``) of
        row group ``i`` (``n`` rows), from its metadata, checked against the limits on
        list lengths and expansion."""
        lim = self.limits
        self.on_disk[top] = self.on_disk.get(top, 0) + max(col.total_compressed_size, 0)
        values = col.num_values
        if _is_list(t) and values > lim.max_list_length * max(n, 1):
            self._fail(
                path,
                f"{values:,} list values in {n:,} rows (row group {i}), more than "
                f"{lim.max_list_length:,} per row, the limit on list lengths",
                field=top,
            )
        size = max(values * (_width(t) or 0), col.total_uncompressed_size)
        if values < 0 or col.total_uncompressed_size < 0:
            self._fail(path, f"row group {i} claims a negative size", field=top)
        self._check_expansion(path, i, top, col.total_uncompressed_size, self.on_disk[top])
        return size + 8 * n

    def check_table(
        self, table: pa.Table, path: str, first_row: int, decode: list[str]
    ) -> pa.Table:
        """Row group ``table`` as read: string sizes (then ``decode`` columns are decoded
        from the dictionaries they were read as), list lengths, finite numbers."""
        lim = self.limits
        for name in table.column_names:
            col = table.column(name)
            t = col.type
            if pa.types.is_dictionary(t) and _is_string(t.value_type):
                self._check_dictionary(col, path, first_row, name)
                if name in decode:
                    table = table.set_column(
                        table.schema.get_field_index(name), name, col.cast(t.value_type)
                    )
            elif _is_string(t):
                self._check_strings(
                    _np(pc.fill_null(pc.binary_length(col), 0)),
                    path,
                    first_row,
                    name,
                    lim.max_value_bytes,
                )
            elif _is_list(t):
                self._check_list_lengths(col, path, first_row, name)
            elif pa.types.is_floating(t) and name in NUMERIC_COLUMNS:
                self._check_finite(col, path, first_row, name)
        return table

    def _check_dictionary(self, col: pa.ChunkedArray, path: str, first_row: int, name: str) -> None:
        """A string column read as a dictionary: its strings' sizes, and what decoding it
        (here or per row later) costs, counted against the budget."""
        lim = self.limits
        lengths = _dict_lengths(col)
        self._check_strings(
            lengths,
            path,
            first_row,
            name,
            lim.max_name_bytes if name in NAME_COLUMNS else lim.max_value_bytes,
        )
        extra = int(lengths.sum())
        if self.bytes + extra > self.budget:
            self._fail(
                path,
                f"decodes to more than {self.budget / GIB:.2f} GiB "
                "(its strings), the memory budget for a trace",
                field=name,
            )
        self._check_expansion(path, None, name, extra, self.on_disk.get(name))
        self.bytes += extra

    def _check_list_lengths(
        self, col: pa.ChunkedArray, path: str, first_row: int, name: str
    ) -> None:
        most = self.limits.max_list_length
        lens = _np(pc.fill_null(pc.list_value_length(col), 0))
        if lens.size and lens.max() > most:
            row = int(np.argmax(lens > most))
            self._fail(
                path,
                f"a list of {int(lens[row]):,} values, more than "
                f"{most:,}, the limit on list lengths",
                row=first_row + row,
                field=name,
            )

    def _check_finite(self, col: pa.ChunkedArray, path: str, first_row: int, name: str) -> None:
        bad = _np(pc.fill_null(pc.invert(pc.is_finite(col)), False))
        if bad.any():
            row = int(np.argmax(bad))
            v = col[row].as_py()
            self._fail(path, f"{v} is not a finite number", row=first_row + row, field=name)

    def _check_expansion(
        self, path: str, group: int | None, name: str, decoded: int, disk: int | None
    ) -> None:
        """A column that decodes to far more than it takes on disk is refused before it
        is decoded (``TraceLimits.max_expansion``)."""
        lim = self.limits
        if disk is None or decoded <= lim.expansion_floor or decoded <= lim.max_expansion * disk:
            return
        where = "" if group is None else f" (row group {group}, from its metadata)"
        self._fail(
            path,
            f"decodes to {decoded / (1 << 20):,.0f} MiB from {disk:,} bytes on "
            f"disk{where}, more than {lim.max_expansion:,} times its size, the limit on "
            "expansion",
            field=name,
        )

    def _check_strings(
        self, lengths: np.ndarray, path: str, first_row: int, name: str, most: int
    ) -> None:
        if lengths.size and lengths.max() > most:
            row = int(np.argmax(lengths > most))
            self._fail(
                path,
                f"a value of {int(lengths[row]):,} bytes, more than {most:,}, "
                "the limit on one value of this column",
                row=first_row + row,
                field=name,
            )


def _np(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _dict_lengths(col: pa.ChunkedArray) -> np.ndarray:
    """Bytes of each row's string in a dictionary column, without decoding it (0 for null)."""
    parts = []
    for chunk in col.chunks:
        lens = _np(pc.fill_null(pc.binary_length(chunk.dictionary), 0)).astype(np.int64)
        idx = _np(pc.fill_null(chunk.indices, 0)).astype(np.int64)
        valid = _np(chunk.is_valid()) if chunk.null_count else None
        got = lens[idx] if lens.size else np.zeros(len(idx), np.int64)
        parts.append(got if valid is None else np.where(valid, got, 0))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
