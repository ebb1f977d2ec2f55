"""Reading a results folder (see agent_replay.results_schema): run.json, request part files in
record batches (bounded memory), and the optional server metrics samples."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.errors import InputError
from agent_replay.redact import redact
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA, OPTIONAL_COLUMNS, REQUEST_SCHEMA
from agent_replay.runmeta import RunMeta

BATCH_ROWS = 65_536
READERS = 2


def parquet_write_options() -> dict[str, Any]:
    """``pq.write_table`` options for request part files: zstd, and chunk times
    DELTA_BINARY_PACKED (successive chunk times of a request differ by a few ms, so their
    deltas need ~30 bits instead of 64: files ~17% smaller and ~30% less CPU to read than
    dictionary/plain). Every Parquet reader decodes it (a standard encoding since format 2.0).
    The other columns keep dictionary encoding."""
    dictionary = [
        f"{n}.list.element" if pa.types.is_list(REQUEST_SCHEMA.field(n).type) else n
        for n in REQUEST_SCHEMA.names
        if n != "chunk_ns"
    ]
    return {
        "compression": "zstd",
        "use_dictionary": dictionary,
        "column_encoding": {"chunk_ns.list.element": "DELTA_BINARY_PACKED"},
    }


def _root(results_dir: str | os.PathLike[str]) -> Path:
    root = Path(results_dir)
    if not root.is_dir():
        raise InputError(f"{root}: not a results folder (no such directory)")
    return root


def read_run_meta(results_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """run.json as a dict ({} when the folder has none)."""
    path = _root(results_dir) / "run.json"
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable run metadata: {exc}") from exc
    if not isinstance(meta, dict):
        raise InputError(f"{path}: run metadata must be a JSON object")
    return redact(meta)  # a folder written before redaction existed shows no secret either


def read_run_record(results_dir: str | os.PathLike[str]) -> RunMeta:
    """run.json as a typed record (``agent_replay.runmeta``; empty when the folder has none)."""
    return RunMeta.from_json(read_run_meta(results_dir))


def request_files(results_dir: str | os.PathLike[str]) -> list[Path]:
    root = _root(results_dir)
    folder = root / "requests"
    files = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not files:
        raise InputError(f"{root}: no request part files (expected {folder}/part-*.parquet)")
    return files


def iter_request_batches(
    results_dir: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    batch_rows: int = BATCH_ROWS,
    *,
    readers: int = READERS,
) -> Iterator[pa.RecordBatch]:
    """Request rows in record batches of about ``batch_rows`` rows (small part files are
    joined, so a run written in many small parts costs little more per row than one big
    file). Every needed column must be present with a type castable to REQUEST_SCHEMA; the
    error names the file and the column.

    Part files of up to ``2 * batch_rows`` rows are decoded by ``readers`` threads (pyarrow
    releases the GIL), at most ``readers`` files ahead of the consumer, so reading
    overlaps the consumer's numpy work and memory stays bounded; bigger files are streamed
    batch by batch. ``readers=0`` reads everything on the calling thread."""
    wanted = list(columns) if columns is not None else REQUEST_SCHEMA.names
    target = pa.schema([REQUEST_SCHEMA.field(c) for c in wanted])
    files = request_files(results_dir)
    whole = 2 * batch_rows if readers > 0 else 0
    loaded: Iterator[tuple[Path, pa.Table | pq.ParquetFile]]
    if readers > 0:
        loaded = _read_ahead(files, wanted, whole, readers)
    else:
        loaded = ((path, _load(path, wanted, whole)) for path in files)
    yield from _joined(_conformed(loaded, wanted, target, batch_rows), batch_rows)


def _load(path: Path, wanted: list[str], whole: int) -> pa.Table | pq.ParquetFile:
    """The file's wanted columns as a table when it has at most ``whole`` rows, else the
    opened file (to be streamed)."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc
    names = pf.schema_arrow.names
    missing = [c for c in wanted if c not in names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise InputError(f"{path}: missing column {missing[0]!r} of the results schema")
    if pf.metadata.num_rows > whole:
        return pf
    try:
        return pf.read(columns=[c for c in wanted if c in names], use_threads=False)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: corrupt Parquet data: {exc}") from exc


def _read_ahead(
    files: Sequence[Path], wanted: list[str], whole: int, readers: int
) -> Iterator[tuple[Path, pa.Table | pq.ParquetFile]]:
    """``_load`` of each file, in order, on a pool of ``readers`` threads, at most
    ``readers`` files ahead. A reader's error is raised here; closing early cancels the
    files not started and waits for the ones being read."""
    pool = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="results-reader")
    window: deque[tuple[Path, Future[pa.Table | pq.ParquetFile]]] = deque()
    todo = iter(files)

    def submit() -> None:
        path = next(todo, None)
        if path is not None:
            window.append((path, pool.submit(_load, path, wanted, whole)))

    try:
        for _ in range(readers):
            submit()
        while window:
            path, fut = window.popleft()
            got = fut.result()
            submit()
            yield path, got
    finally:
        for _, fut in window:
            fut.cancel()
        pool.shutdown(wait=True)


def _conformed(
    loaded: Iterable[tuple[Path, pa.Table | pq.ParquetFile]],
    wanted: list[str],
    target: pa.Schema,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Batches with exactly the ``target`` schema (castable columns cast)."""
    for path, got in loaded:
        try:
            batches = (
                got.to_batches()
                if isinstance(got, pa.Table)
                else got.iter_batches(
                    batch_size=batch_rows,
                    columns=[c for c in wanted if c in got.schema_arrow.names],
                )
            )
            for batch in batches:
                yield (
                    batch if batch.schema.equals(target) else _conform(path, batch, wanted, target)
                )
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"{path}: corrupt Parquet data: {exc}") from exc


def _conform(
    path: Path, batch: pa.RecordBatch, wanted: list[str], target: pa.Schema
) -> pa.RecordBatch:
    """``batch`` with the ``target`` schema: a missing (optional) column all null, the
    others cast."""
    arrays = []
    for name in wanted:
        typ = target.field(name).type
        if batch.schema.get_field_index(name) < 0:  # an optional column, older file
            arrays.append(pa.nulls(batch.num_rows, typ))
            continue
        col = batch.column(name)
        try:
            arrays.append(col if col.type == typ else col.cast(typ))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputError(f"{path}: column {name!r}: cannot read {col.type} as {typ}") from exc
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _joined(batches: Iterator[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Batches of at least ``batch_rows // 2`` rows (but the last): small ones are joined."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if not held and batch.num_rows >= batch_rows // 2:
            yield batch
            continue
        held.append(batch)
        rows += batch.num_rows
        if rows >= batch_rows // 2:
            yield _concat(held)
            held, rows = [], 0
    if held:
        yield _concat(held)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches).combine_chunks()
    out = table.to_batches()
    return out[0] if len(out) == 1 else batches[0]  # no rows at all


def read_server_metrics(results_dir: str | os.PathLike[str]) -> pa.Table | None:
    path = _root(results_dir) / "server_metrics.parquet"
    if not path.exists():
        return None
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc


def read_gpu_telemetry(results_dir: str | os.PathLike[str]) -> pa.Table | None:
    """gpu_telemetry.parquet (GPU_TELEMETRY_SCHEMA), or None when the run has none."""
    path = _root(results_dir) / "gpu_telemetry.parquet"
    if not path.exists():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc
    missing = [n for n in GPU_TELEMETRY_SCHEMA.names if n not in table.column_names]
    if missing:
        raise InputError(f"{path}: missing column {missing[0]!r} of the GPU telemetry schema")
    return table
