"""A sweep's index table: one row per run (complete, failed or unreachable, never dropped),
written as Parquet and CSV after every run (atomically), read back to resume a sweep or to
rebuild its frontier without rerunning it."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.analysis.points import POINT_FIELDS

KEY_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("phase", pa.string()),
    ("order", pa.int64()),
    ("repeat", pa.int64()),
    ("target", pa.string()),
    ("axis", pa.string()),
    ("point", pa.float64()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("path", pa.string()),
    ("salt", pa.int64()),
    ("started_utc", pa.string()),
    ("run_s", pa.float64()),
    ("replay_s", pa.float64()),
    ("warmup_s", pa.float64()),
    ("warmup_bursts", pa.int64()),
    ("warmup_steady", pa.bool_()),
    ("gpus", pa.int64()),
    ("usd_per_gpu_hour", pa.float64()),
    ("load_generator_bottleneck", pa.bool_()),
    ("machine_contention", pa.bool_()),
    ("cold_start", pa.bool_()),
)
DONE = ("complete", "unreachable")
"""Statuses a resumed sweep does not run again (a failed or interrupted run is run again)."""

_INT = {"requests_ok", "requests_failed"}


def schema() -> pa.Schema:
    fields = [pa.field(k, t) for k, t in KEY_FIELDS]
    fields += [
        pa.field(k, pa.int64() if k in _INT or unit == "samples" else pa.float64())
        for k, unit in POINT_FIELDS
    ]
    return pa.schema(fields)


def key(row: Mapping[str, Any]) -> tuple[str, str, float, int]:
    return (str(row["phase"]), str(row["target"]), float(row["point"]), int(row["repeat"]))


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    sch = schema()
    cols = {f.name: [r.get(f.name) for r in rows] for f in sch}
    return pa.table({f.name: pa.array(cols[f.name], f.type) for f in sch}, schema=sch)


def write_index(out: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    rows = sorted(rows, key=lambda r: (r["phase"] != "sweep", r["order"]))
    table = to_table(rows)
    tmp = out / ".index.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, out / "index.parquet")
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(table.column_names)
    for r in table.to_pylist():
        w.writerow(["" if v is None else v for v in r.values()])
    tmp = out / ".index.csv.tmp"
    tmp.write_text(buf.getvalue())
    os.replace(tmp, out / "index.csv")


def read_index(out: Path) -> list[dict[str, Any]]:
    p = out / "index.parquet"
    if not p.exists():
        return []
    return [dict(r) for r in pq.read_table(p).to_pylist()]
