"""Reading a results folder (see analysis.results_schema): run.json, request part files in
record batches (bounded memory), and the optional server metrics samples."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.results_schema import REQUEST_SCHEMA
from traces.errors import InputError

BATCH_ROWS = 65_536


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
    return meta


def request_files(results_dir: str | os.PathLike[str]) -> list[Path]:
    root = _root(results_dir)
    folder = root / "requests"
    files = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not files:
        raise InputError(f"{root}: no request part files (expected {folder}/part-*.parquet)")
    return files


def iter_request_batches(results_dir: str | os.PathLike[str],
                         columns: Sequence[str] | None = None,
                         batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Request rows in record batches. Every needed column must be present with a type
    castable to REQUEST_SCHEMA; the error names the file and the column."""
    wanted = list(columns) if columns is not None else REQUEST_SCHEMA.names
    for path in request_files(results_dir):
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc
        names = pf.schema_arrow.names
        missing = [c for c in wanted if c not in names]
        if missing:
            raise InputError(f"{path}: missing column {missing[0]!r} of the results schema")
        target = pa.schema([REQUEST_SCHEMA.field(c) for c in wanted])
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=wanted):
                if batch.schema.equals(target):
                    yield batch
                    continue
                arrays = []
                for name in wanted:
                    col = batch.column(name)
                    typ = target.field(name).type
                    try:
                        arrays.append(col if col.type == typ else col.cast(typ))
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise InputError(f"{path}: column {name!r}: cannot read {col.type} "
                                         f"as {typ}") from exc
                yield pa.RecordBatch.from_arrays(arrays, schema=target)
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"{path}: corrupt Parquet data: {exc}") from exc


def read_server_metrics(results_dir: str | os.PathLike[str]) -> pa.Table | None:
    path = _root(results_dir) / "server_metrics.parquet"
    if not path.exists():
        return None
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc
