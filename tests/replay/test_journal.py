"""The row journal: a row comes back field for field, a row cut by a kill is left out, a
segment goes once its part file is written, and ``recover`` turns what a killed worker left
into a part file without the rows a part already has."""

from __future__ import annotations

from array import array
from pathlib import Path

import pyarrow.parquet as pq

from agent_replay.replay.journal import FIELDS, decode, encode, recover
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.results import ResultWriter, records_to_table

T0 = 7_000_000_000


def _rec(i: int) -> RequestRecord:
    r = RequestRecord(
        session_id=f"s{i}",
        request_index=i,
        parent_index=i - 1,
        clone=1,
        worker=0,
        request_id=f"run-s{i}-{i}",
        api="chat",
        expected_input_tokens=80 + i,
        expected_output_tokens=3,
        implied_cached_tokens=None if i % 2 else 16,
    )
    r.intended_ns, r.sent_ns, r.first_token_ns, r.end_ns = T0 + 10, T0 + 12, T0 + 20, T0 + 40
    r.connect_ns = 5 if i % 2 else None
    r.chunk_ns = array("q", [T0 + 20, T0 + 30 + i, T0 + 40])
    r.chunk_tokens = array("i", [1, 2, i])
    r.depends_on = [i - 1, i - 2]
    r.agent_id = "sub[1]"
    r.prompt_tokens, r.completion_tokens = 80 + i, 3 + i
    if i == 2:
        r.fail("http", 'HTTP 500 {"error": "é"}')
        r.http_status = 500
    return r


def _same(a: RequestRecord, b: RequestRecord) -> None:
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f
    assert a.chunk_ns == b.chunk_ns and a.chunk_tokens == b.chunk_tokens


def test_a_row_comes_back_whole_and_a_cut_row_is_left_out() -> None:
    recs = [_rec(i) for i in range(4)]
    data = b"".join(encode(r) for r in recs)
    back = decode(data)
    assert len(back) == 4
    for a, b in zip(recs, back, strict=True):
        _same(a, b)
    for cut in (1, 11, len(data) - len(encode(recs[3])) + 20, len(data) - 1):
        assert len(decode(data[:cut])) == (3 if cut > len(data) - len(encode(recs[3])) else 0)


def test_segments_go_with_their_part_files_and_all_at_close(tmp_path: Path) -> None:
    w = ResultWriter(tmp_path, T0, journal=True)
    req = tmp_path / "requests"
    w.add(_rec(0))
    w.add(_rec(1))
    assert [p.name for p in req.glob(".rows-*")] == [".rows-000-00000.journal"]
    w.flush()
    w.add(_rec(2))
    w._pool.submit(lambda: None).result()  # the part is written
    w.tick(T0 + 10**10)  # harvest: segment 0 goes, segment 1 (row 2) stays
    assert sorted(p.name for p in req.glob(".rows-*")) == [".rows-000-00001.journal"]
    assert [r.request_id for r in decode((req / ".rows-000-00001.journal").read_bytes())] == [
        "run-s2-2"
    ]
    w.close()
    assert not list(req.glob(".rows-*"))
    assert w.unwritten == 0


def test_recover_writes_the_rows_no_part_has(tmp_path: Path) -> None:
    req = tmp_path / "requests"
    req.mkdir()
    recs = [_rec(i) for i in range(5)]
    # rows 0-2 reached a part file; 2-4 are in the journal (2 in both: a part written just
    # before the kill, its segment not yet removed)
    pq.write_table(records_to_table(recs[:3], T0), req / "part-000-00000.parquet")
    (req / ".rows-000-00000.journal").write_bytes(encode(recs[2]) + encode(recs[3]))
    (req / ".rows-000-00001.journal").write_bytes(encode(recs[4]) + encode(recs[0])[:9])
    (req / ".rows-001-00000.journal").write_bytes(encode(recs[1]))  # another worker's
    assert recover(tmp_path, 0, T0) == 2
    got = pq.read_table(req / "part-000-recovered.parquet")
    assert got.column("request_id").to_pylist() == ["run-s3-3", "run-s4-4"]
    assert got.column("chunk_ns").to_pylist()[1] == [20, 34, 40]  # offsets from t0
    assert got.column("depends_on").to_pylist()[0] == [2, 1]
    assert sorted(p.name for p in req.glob(".rows-*")) == [".rows-001-00000.journal"]
    assert recover(tmp_path, 0, T0) == 0  # nothing left to do
