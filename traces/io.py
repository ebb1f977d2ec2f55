"""Reading and writing trace Parquet files.

A trace is one ``.parquet`` file or a folder of part files (``*.parquet``, read in name
order). Writes are atomic: a temporary file in the same folder, then ``os.replace``.
Reads go one row group at a time within ``traces.limits`` (a small file can claim, or
decode to, gigabytes).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agent_replay.errors import OutputExistsError, TraceError
from agent_replay.traces.limits import Reading, TraceLimits, string_columns
from agent_replay.traces.schema import METADATA_KEY, SCHEMA_VERSION, TRACE_SCHEMA, TraceMeta

ROW_GROUP_SIZE = 64 * 1024
"""Rows per row group: small enough to stream a 1M-row trace in bounded memory."""


def trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files that make up the trace at ``path``."""
    p = Path(path)
    if p.is_dir():
        files = sorted(
            f for f in p.iterdir() if f.suffix == ".parquet" and not f.name.startswith(".")
        )
        if not files:
            raise TraceError("folder holds no .parquet part files", path=str(p))
        return files
    if not p.exists():
        raise TraceError("no such file or folder", path=str(p))
    return [p]


def conform(table: pa.Table) -> pa.Table:
    """Cast ``table`` to the trace schema: add missing nullable columns, order known columns
    first, keep unknown extra columns at the end."""
    arrays: list[pa.Array | pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for f in TRACE_SCHEMA:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TraceError(
                        f"cannot cast {col.type} to {f.type}: {exc}", field=f.name
                    ) from exc
            arrays.append(col)
        elif not f.nullable:
            raise TraceError("required column missing", field=f.name)
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
        fields.append(f)
    for name in table.column_names:
        if name not in TRACE_SCHEMA.names:
            arrays.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_trace(
    table: pa.Table | Iterable[pa.RecordBatch],
    path: str | os.PathLike[str],
    meta: TraceMeta,
    *,
    force: bool = False,
    row_group_size: int = ROW_GROUP_SIZE,
    between: Callable[[], None] | None = None,
) -> Path:
    """Write a trace atomically. Refuses to overwrite unless ``force``. ``between`` is
    called between the stages (conversion, encoding, closing and syncing): a writer in a
    background thread passes ``os.sched_yield`` there."""
    pause = between or _nothing
    dest = Path(path)
    if dest.exists() and not force:
        raise OutputExistsError(str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer: pq.ParquetWriter | None = None
        batches = [table] if isinstance(table, pa.Table) else table
        for part in batches:
            t = part if isinstance(part, pa.Table) else pa.Table.from_batches([part])
            t = conform(t)
            pause()
            if writer is None:
                schema = t.schema.with_metadata({METADATA_KEY: meta.to_bytes()})
                writer = pq.ParquetWriter(tmp, schema, compression="zstd")
            writer.write_table(
                t.replace_schema_metadata(writer.schema.metadata), row_group_size=row_group_size
            )
            pause()
        if writer is None:
            empty = TRACE_SCHEMA.with_metadata({METADATA_KEY: meta.to_bytes()})
            writer = pq.ParquetWriter(tmp, empty, compression="zstd")
        writer.close()
        pause()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a trace is an ordinary file
        _fsync(tmp)  # the data is on disk before the name points at it
        os.replace(tmp, dest)
        _fsync(dest.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _nothing() -> None:
    pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"not a readable Parquet file ({exc})", path=str(path)) from exc


def read_meta(path: str | os.PathLike[str]) -> TraceMeta:
    """The metadata of a trace (of its first part file for a folder)."""
    first = trace_files(path)[0]
    md = _open(first).schema_arrow.metadata or {}
    raw = md.get(METADATA_KEY)
    if raw is None:
        raise TraceError(
            "not an agent-replay trace (no trace metadata; import it with "
            "`agent-replay traces import`)",
            path=str(first),
        )
    try:
        meta = TraceMeta.from_bytes(raw)
    except (ValueError, TypeError) as exc:
        raise TraceError(f"trace metadata is not valid JSON ({exc})", path=str(first)) from exc
    if meta.schema_version > SCHEMA_VERSION:
        raise TraceError(
            f"written with trace schema v{meta.schema_version}; this agent-replay reads up to "
            f"v{SCHEMA_VERSION}: upgrade agent-replay",
            path=str(first),
        )
    return meta


def _open_for_reading(path: Path) -> tuple[pq.ParquetFile, list[str]]:
    """The file opened with its plain string columns read as dictionaries (see
    ``traces.limits``), and those columns' names."""
    strings = string_columns(_open(path).schema_arrow)
    if not strings:
        return _open(path), []
    try:
        return pq.ParquetFile(path, read_dictionary=strings), strings
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"not a readable Parquet file ({exc})", path=str(path)) from exc


def _row_groups(
    path: Path,
    pf: pq.ParquetFile,
    strings: list[str],
    columns: list[str] | None,
    reading: Reading,
    pick: Picker | None = None,
) -> Iterator[tuple[int, pa.Table, np.ndarray | None]]:
    """Each row group of ``pf``: its first row's number in the trace, the table, and with
    ``pick`` the rows of it to keep (a group with none is not read), each checked against
    ``reading``'s limits before and after it is read."""
    for i in range(pf.num_row_groups):
        first_row = reading.rows
        chosen = None
        if pick is not None:
            chosen = pick(pf, i)
            if chosen.size == 0:
                reading.skip(pf.metadata.row_group(i).num_rows)
                continue
        reading.check_row_group(pf, str(path), i, columns, first_row)
        try:
            t = pf.read_row_group(i, columns=columns, use_threads=False)
        except (MemoryError, pa.ArrowMemoryError) as exc:
            raise TraceError(
                f"ran out of memory reading row group {i} ({exc}); its pages "
                "claim more than the file's metadata",
                path=str(path),
            ) from exc
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            raise TraceError(f"corrupt Parquet data ({exc})", path=str(path)) from exc
        yield first_row, reading.check_table(t, str(path), first_row, strings), chosen


Picker = Callable[[pq.ParquetFile, int], np.ndarray]
"""(file, row group) -> the rows of the group to keep."""


def _session_picker(path: Path, keep: pa.Array, limits: TraceLimits) -> Picker:
    """Rows of a row group whose session is in ``keep``, from its ``session_id`` column
    alone (read as a dictionary: the test runs on the dictionary's values)."""

    def pick(pf: pq.ParquetFile, i: int) -> np.ndarray:
        Reading(limits).check_row_group(pf, str(path), i, ["session_id"], 0)
        try:
            col = pf.read_row_group(i, columns=["session_id"], use_threads=False).column(
                "session_id"
            )
        except (MemoryError, pa.ArrowMemoryError, pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"cannot read row group {i} ({exc})", path=str(path)) from exc
        parts = []
        for chunk in col.chunks:
            if pa.types.is_dictionary(chunk.type):
                in_dict = np.asarray(
                    pc.is_in(chunk.dictionary, value_set=keep).to_numpy(zero_copy_only=False),
                    dtype=bool,
                )
                idx = np.asarray(pc.fill_null(chunk.indices, 0).to_numpy(zero_copy_only=False))
                m = in_dict[idx] if in_dict.size else np.zeros(len(chunk), bool)
                if chunk.null_count:
                    m &= np.asarray(chunk.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            else:
                m = np.asarray(
                    pc.fill_null(pc.is_in(chunk, value_set=keep), False).to_numpy(
                        zero_copy_only=False
                    ),
                    dtype=bool,
                )
            parts.append(m)
        mask = np.concatenate(parts) if parts else np.zeros(0, bool)
        return np.flatnonzero(mask)

    return pick


def _given_picker(path: Path, picked: Mapping[tuple[Path, int], np.ndarray]) -> Picker:
    nothing = np.zeros(0, np.int64)
    return lambda pf, i: picked.get((path, i), nothing)


def iter_batches(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    batch_size: int = ROW_GROUP_SIZE,
    *,
    limits: TraceLimits | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream the trace in record batches, optionally only some columns, one row group
    in memory at a time, within ``limits``."""
    reading = Reading(limits or TraceLimits())
    for f in trace_files(path):
        pf, strings = _open_for_reading(f)
        cols = None
        if columns is not None:
            missing = [c for c in columns if c not in pf.schema_arrow.names]
            if missing:
                raise TraceError("column not in file", path=str(f), field=missing[0])
            cols = list(columns)
        for _, t, _ in _row_groups(f, pf, strings, cols, reading):
            yield from t.to_batches(max_chunksize=batch_size)


def iter_row_groups(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    *,
    limits: TraceLimits | None = None,
) -> Iterator[tuple[GroupRef, pa.Table]]:
    """Each row group of the trace in file order with those of ``columns`` its file has
    (a part file may lack optional ones), one in memory at a time, each checked against
    ``limits`` with the decoded-bytes budget applied per row group (a consumer that keeps
    what it needs of a group, not the group, may read a trace of any length)."""
    reading = Reading(limits or TraceLimits(), per_group=True)
    for f in trace_files(path):
        pf, strings = _open_for_reading(f)
        cols = [c for c in columns if c in pf.schema_arrow.names]
        for i, (first, t, _) in enumerate(_row_groups(f, pf, strings, cols, reading)):
            yield GroupRef(f, i, first), t


@dataclass(frozen=True)
class GroupRef:
    """Where a row group is: its file, its number there, its first row in the trace."""

    path: Path
    index: int
    first_row: int

    def read(self, columns: Sequence[str]) -> pa.Table:
        """Those of ``columns`` the group's file has, again (checked when
        ``iter_row_groups`` gave it)."""
        try:
            pf = pq.ParquetFile(self.path)
            return pf.read_row_group(
                self.index,
                use_threads=False,
                columns=[c for c in columns if c in pf.schema_arrow.names],
            )
        except (MemoryError, pa.ArrowMemoryError, pa.ArrowInvalid, OSError, KeyError) as exc:
            raise TraceError(
                f"cannot read row group {self.index} ({exc})", path=str(self.path)
            ) from exc


def read_trace(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    sessions: Collection[str] | None = None,
    limits: TraceLimits | None = None,
) -> tuple[pa.Table, TraceMeta]:
    """Read a whole trace (one file or a folder of parts) into one table, one row group at
    a time within ``limits``; with ``sessions``, only those sessions' rows are kept."""
    table, meta, _ = read_trace_rows(path, columns, sessions=sessions, limits=limits)
    return table, meta


def _picker(
    f: Path,
    keep: pa.Array | None,
    picked: Mapping[tuple[Path, int], np.ndarray] | None,
    limits: TraceLimits,
) -> Picker | None:
    """What chooses the rows of each row group of ``f``: the rows ``picked``, else those of
    the sessions ``keep``; None: every row."""
    if picked is not None:
        return _given_picker(f, picked)
    return None if keep is None else _session_picker(f, keep, limits)


def _read_part(
    f: Path,
    cols: list[str] | None,
    reading: Reading,
    keep: pa.Array | None,
    picked: Mapping[tuple[Path, int], np.ndarray] | None,
) -> tuple[pq.ParquetFile, list[pa.Table], list[np.ndarray]]:
    """(the part file, its row groups' kept rows, their numbers in the trace)."""
    pf, strings = _open_for_reading(f)
    _require_columns(
        f, pf, (cols or []) + (["session_id"] if keep is not None and picked is None else [])
    )
    pick = _picker(f, keep, picked, reading.limits)
    tables: list[pa.Table] = []
    rows: list[np.ndarray] = []
    for first, t, chosen in _row_groups(f, pf, strings, cols, reading, pick):
        t, kept = _kept_rows(t, first, chosen)
        tables.append(t)
        rows.append(kept)
    return pf, tables, rows


def _empty(pf: pq.ParquetFile, cols: list[str] | None) -> pa.Table:
    """No rows, with the file's columns (those asked for)."""
    empty = pf.schema_arrow.empty_table()
    return empty.select(cols) if cols else empty


def _require_columns(f: Path, pf: pq.ParquetFile, needed: list[str]) -> None:
    missing = [c for c in needed if c not in pf.schema_arrow.names]
    if missing:
        raise TraceError("column not in file", path=str(f), field=missing[0])


def _kept_rows(t: pa.Table, first: int, chosen: np.ndarray | None) -> tuple[pa.Table, np.ndarray]:
    """(the rows of row group ``t`` kept, their numbers in the trace); ``first``: the
    number of its first row, ``chosen``: its rows to keep (None: all)."""
    if chosen is None:
        return t, np.arange(first, first + t.num_rows)
    return (t.take(pa.array(chosen)) if chosen.size < t.num_rows else t), chosen + first


def _concat(tables: list[pa.Table], path: str | os.PathLike[str]) -> pa.Table:
    """The parts' tables as one (columns a part lacks are null in its rows)."""
    try:
        return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TraceError(
            f"part files do not agree on their columns ({exc})", path=str(path)
        ) from exc


def read_trace_rows(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    sessions: Collection[str] | None = None,
    limits: TraceLimits | None = None,
    picked: Mapping[tuple[Path, int], np.ndarray] | None = None,
) -> tuple[pa.Table, TraceMeta, np.ndarray]:
    """``read_trace``, and the number of each row kept in the whole trace (0-based, in
    file order), for messages about rows. ``picked``: instead of ``sessions``, the rows to
    keep of each row group (file, number), as ``traces.select.SessionScan.rows`` finds
    them; a group it does not name is not read."""
    meta = read_meta(path)
    lim = limits or TraceLimits()
    reading = Reading(lim)
    keep = None if sessions is None else pa.array(sorted(sessions), pa.string())
    filtered = keep is not None or picked is not None
    tables: list[pa.Table] = []
    rows: list[np.ndarray] = []
    cols = list(columns) if columns else None
    for f in trace_files(path):
        pf, got, kept = _read_part(f, cols, reading, keep, picked)
        tables += got
        rows += kept
        if pf.num_row_groups == 0 or (filtered and not tables):
            tables.append(_empty(pf, cols))
    table = _concat(tables, path)
    rows_all = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return table.replace_schema_metadata(None), meta, rows_all
