"""Compact results folders for committing: every ``requests/`` folder's part files become one
Parquet file (same rows in the same order, same schema and file metadata), so a run is one
file of per-request data that ``agent-replay report``, ``compare`` and ``sweep --report-only``
read as before. Also drops the pid and port files of GPU scripts.

    python benchmarks/compact_results.py TREE [TREE ...]

Prints what it merged; a folder whose parts disagree on their schema is left as it is and
named on stderr (exit 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MERGED = "part-000-00000.parquet"


def compact_requests(folder: Path) -> int:
    """Merge the part files of one ``requests/`` folder into ``MERGED``; returns the rows."""
    parts = sorted(folder.glob("part-*.parquet"))
    if len(parts) <= 1:
        return 0
    tables = [pq.read_table(p) for p in parts]
    schema = tables[0].schema
    if any(not t.schema.equals(schema, check_metadata=False) for t in tables[1:]):
        raise ValueError(f"{folder}: part files have different schemas")
    merged = pa.concat_tables(tables)
    tmp = folder / (MERGED + ".tmp")
    pq.write_table(merged, tmp, compression="zstd")
    if pq.read_metadata(tmp).num_rows != sum(t.num_rows for t in tables):
        tmp.unlink()
        raise ValueError(f"{folder}: merged row count differs")
    for p in parts:
        p.unlink()
    tmp.rename(folder / MERGED)
    return merged.num_rows


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    bad = 0
    for root in map(Path, argv):
        for junk in [*root.rglob("*.pid"), *root.rglob("*.port")]:
            junk.unlink()
        for folder in sorted(p for p in root.rglob("requests") if p.is_dir()):
            try:
                n = compact_requests(folder)
            except ValueError as exc:
                print(f"compact_results: {exc}", file=sys.stderr)
                bad += 1
                continue
            if n:
                print(f"{folder}: {n} rows in one file")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
