"""Reading a results folder: many small part files joined, read-ahead threads, streaming of
big files, errors naming the file, and the report unchanged by the layout on disk."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.fixtures import synthetic_batches, synthetic_results, write_results
from agent_replay.analysis.report import build_report
from agent_replay.analysis.results import iter_request_batches, parquet_write_options
from agent_replay.analysis.runstats import COLUMNS
from agent_replay.errors import InputError


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return synthetic_results(3_000, seed=9, failed_fraction=0.05, warmup_fraction=0.01)


def _read(root: Path, **kw: int) -> pa.Table:
    return pa.Table.from_batches(list(iter_request_batches(root, COLUMNS, **kw)))


@pytest.mark.parametrize("readers", [0, 1, 3])
def test_small_parts_are_joined_in_order(table: pa.Table, tmp_path: Path, readers: int) -> None:
    root = write_results(tmp_path / "r", table, part_rows=70, compression="zstd")
    assert len(list((root / "requests").glob("part-*.parquet"))) == 43
    batches = list(iter_request_batches(root, COLUMNS, batch_rows=1_000, readers=readers))
    # 70-row parts joined until at least 500 rows: 8 parts (560 rows) per batch
    assert [b.num_rows for b in batches] == [560] * 5 + [200]
    assert pa.Table.from_batches(batches).equals(table.select(list(COLUMNS)))


def test_big_file_is_streamed_and_small_ones_read_whole(table: pa.Table, tmp_path: Path) -> None:
    root = write_results(
        tmp_path / "r",
        iter([table.slice(0, 2_500).to_batches()[0], table.slice(2_500).to_batches()[0]]),
    )
    batches = list(iter_request_batches(root, COLUMNS, batch_rows=1_000, readers=2))
    # part 0 (2,500 rows > 2 x 1,000) streamed in 1,000-row batches; part 1 (500) read whole
    assert [b.num_rows for b in batches] == [1_000, 1_000, 500, 500]
    assert pa.Table.from_batches(batches).equals(table.select(list(COLUMNS)))


@pytest.mark.parametrize("readers,batch_rows", [(2, 10_000), (0, 500)])  # read whole, streamed
def test_schema_1_files_read_with_connect_ns_null(
    table: pa.Table, tmp_path: Path, readers: int, batch_rows: int
) -> None:
    """Results written before connect_ns existed still read; the column comes back null and
    the report is the one of the same rows with connect_ns null; a required column missing
    is still an error naming the file."""
    old = table.drop_columns(["connect_ns"])
    root = write_results(tmp_path / "r", old)
    got = pa.Table.from_batches(
        list(iter_request_batches(root, COLUMNS, batch_rows=batch_rows, readers=readers))
    )
    assert got.column("connect_ns").null_count == table.num_rows
    assert got.equals(table.select(list(COLUMNS)))
    assert (
        build_report(root).stats.latency
        == build_report(write_results(tmp_path / "n", table)).stats.latency
    )
    broken = write_results(tmp_path / "b", old.drop_columns(["sent_ns"]))
    with pytest.raises(InputError, match=r"part-00000.parquet: missing column 'sent_ns'"):
        list(iter_request_batches(broken, COLUMNS, readers=readers))


def test_writer_options_roundtrip_and_are_smaller(table: pa.Table, tmp_path: Path) -> None:
    plain = write_results(tmp_path / "plain", table, compression="zstd")
    delta = write_results(tmp_path / "delta", table, **parquet_write_options())
    f = pq.ParquetFile(delta / "requests" / "part-00000.parquet")
    enc = {
        f.metadata.row_group(0).column(i).path_in_schema: f.metadata.row_group(0)
        .column(i)
        .encodings
        for i in range(f.metadata.num_columns)
    }
    assert "DELTA_BINARY_PACKED" in enc["chunk_ns.list.element"]
    assert "RLE_DICTIONARY" in enc["session_id"]
    assert pq.read_table(delta / "requests").equals(table)
    size = {p: (p / "requests" / "part-00000.parquet").stat().st_size for p in (plain, delta)}
    assert size[delta] < 0.9 * size[plain]


def test_report_does_not_depend_on_layout(tmp_path: Path) -> None:
    one = write_results(tmp_path / "one", synthetic_batches(4_000, seed=4, batch_rows=4_000))
    many = write_results(
        tmp_path / "many",
        synthetic_batches(4_000, seed=4, batch_rows=4_000),
        part_rows=130,
        **parquet_write_options(),
    )
    a, b = build_report(one), build_report(many)
    assert a.stats.latency == b.stats.latency and a.stats.tps == b.stats.tps
    assert a.stats.tokens_per_chunk == b.stats.tokens_per_chunk
    assert a.stats.sessions.equals(b.stats.sessions)


def test_corrupt_part_in_the_middle_is_named(table: pa.Table, tmp_path: Path) -> None:
    root = write_results(tmp_path / "r", table, part_rows=500)
    (root / "requests" / "part-00003.parquet").write_bytes(b"PAR1 garbage")
    seen = 0
    with pytest.raises(InputError, match="part-00003.parquet"):
        for batch in iter_request_batches(root, COLUMNS, batch_rows=500, readers=2):
            seen += batch.num_rows
    assert seen == 1_500  # the three good parts before it were delivered


def test_closing_early_stops_the_readers(table: pa.Table, tmp_path: Path) -> None:
    root = write_results(tmp_path / "r", table, part_rows=100)
    before = threading.active_count()
    it = iter_request_batches(root, COLUMNS, batch_rows=100, readers=2)
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("results-reader")]
