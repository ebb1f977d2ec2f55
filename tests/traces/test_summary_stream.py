"""``traces inspect`` streamed over row groups: the same numbers as the whole table, any
row-group layout and row order; what ``validate`` accepts, ``inspect`` accepts; agent
streams in linear time; memory bounded on a large trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.traces import prefix, summary
from agent_replay.traces.io import write_trace
from agent_replay.traces.prefix import PrefixCache
from agent_replay.traces.schema import METADATA_KEY, TraceMeta
from agent_replay.traces.stats import session_streams
from agent_replay.traces.summary import summarize_table, summarize_trace
from agent_replay.traces.synth import SynthConfig, SynthModel, synthesize
from tests.peak import run_peak
from tests.traces.bigtraces import subagent_session

ROOT = Path(__file__).resolve().parents[2]


def _reference(
    lists: list[list[int]], inputs: list[int], bs: int, sb: int
) -> tuple[list[int], list[int]]:
    """The rules of ``traces.stats.implied_hits`` and ``matched_blocks``, one request at a
    time with a dict: what an unbounded cache holds after each request."""
    held: dict[int, int] = {}
    matched, implied = [], []
    for ids, n in zip(lists, inputs, strict=True):
        m = 0
        while m < len(ids) and ids[m] in held:
            m += 1
        matched.append(m)
        hit = 0
        for i, h in enumerate(ids):
            need = max(0, min(bs, n - i * bs))
            have = held.get(h, 0)
            hit += min(have, need)
            if have < bs:
                break
        cap = (n - 1) // sb * sb if sb > 1 else n
        implied.append(max(0, min(hit, cap)))
        for i, h in enumerate(ids):
            need = max(0, min(bs, n - i * bs))
            held[h] = max(held.get(h, 0), need // sb * sb)
    return matched, implied


@pytest.mark.parametrize("seed", range(6))
def test_prefix_cache_in_small_steps_follows_the_rules(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    bs, sb = 32, 16
    lists, inputs = [], []
    for _ in range(200):
        k = int(rng.integers(0, 7))
        lists.append([int(x) for x in rng.integers(0, 12, k)])  # repeats within and across
        inputs.append(int(rng.integers(max(1, (k - 1) * bs), k * bs + 1)) if k else 5)
    want = _reference(lists, inputs, bs, sb)
    lengths = np.array([len(x) for x in lists])
    flat = np.array([h for x in lists for h in x], np.int64)
    monkeypatch.setattr(prefix, "STEP_ELEMENTS", 7)  # many slices inside one step
    monkeypatch.setattr(prefix, "SMALL_LEVEL", 4)  # and many merges of the map's levels
    for cut in (200, 1, 13):  # one step, one request per step, uneven steps
        cache = PrefixCache(bs, sb)
        got_m: list[int] = []
        got_i: list[int] = []
        for lo in range(0, 200, cut):
            ln = lengths[lo : lo + cut]
            first = int(lengths[:lo].sum())
            m, h = cache.step(
                ln, flat[first : first + int(ln.sum())], np.array(inputs[lo : lo + cut])
            )
            got_m += m.tolist()
            got_i += h.tolist()
        assert (got_m, got_i) == want


def _write_groups(path: Path, table: pa.Table, rows_per_group: int, meta: TraceMeta) -> Path:
    table = table.replace_schema_metadata({METADATA_KEY: meta.to_bytes()})
    pq.write_table(table, path, row_group_size=rows_per_group)
    return path


def _synth(sessions: int = 60) -> tuple[pa.Table, TraceMeta]:
    return synthesize(SynthModel(), SynthConfig(sessions=sessions, seed=3, block_size=16))


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_streamed_summary_equals_the_whole_table(
    tmp_path: Path, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row groups of 37 rows; shuffled rows take the second read, in windows of 50 ranks
    with two groups held between windows."""
    table, meta = _synth()
    table = table.append_column("cached_tokens_x", pa.nulls(table.num_rows, pa.int32()))
    if shuffle:
        table = table.take(pa.array(np.random.default_rng(0).permutation(table.num_rows)))
    monkeypatch.setattr(summary, "WINDOW_ROWS", 50)
    monkeypatch.setattr(summary, "HELD_GROUPS", 2)
    path = _write_groups(tmp_path / "t.parquet", table, 37, meta)
    assert pq.ParquetFile(path).num_row_groups > 5
    whole = summarize_table(table, meta.block_size)
    streamed = summarize_trace(path, meta.block_size)
    assert streamed == whole
    assert whole.prefix_reuse is not None and whole.prefix_reuse > 0.5
    assert sum(s.implied_cached or 0 for s in whole.sessions_cache) > 0


def test_a_folder_of_parts_with_and_without_optional_columns(tmp_path: Path) -> None:
    """Part 2 lacks think_ns, cached_tokens, hash_ids and model: they count as null."""
    table, meta = _synth(20)
    folder = tmp_path / "parts"
    folder.mkdir()
    half = table.num_rows // 2
    first, second = table.slice(0, half), table.slice(half)
    _write_groups(folder / "a.parquet", first, 1000, meta)
    _write_groups(
        folder / "b.parquet",
        second.select(
            [
                "session_id",
                "request_index",
                "parent_index",
                "arrival_ns",
                "input_tokens",
                "output_tokens",
            ]
        ),
        1000,
        meta,
    )
    s = summarize_trace(folder, meta.block_size)
    assert s.requests == table.num_rows
    assert s.think_s["count"] == first.column("think_ns").drop_null().__len__()
    assert s.total_input_tokens == int(np.asarray(table.column("input_tokens")).sum())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_inspect_accepts_a_trace_validate_accepts_with_only_required_columns(
    tmp_path: Path,
) -> None:
    t = pa.table(
        {
            "session_id": ["a", "a", "b"],
            "request_index": pa.array([0, 1, 0], pa.int32()),
            "parent_index": pa.array([-1, 0, -1], pa.int32()),
            "arrival_ns": pa.array([0, 10**9, 2 * 10**9], pa.int64()),
            "input_tokens": pa.array([10, 20, 30], pa.int32()),
            "output_tokens": pa.array([1, 2, 3], pa.int32()),
        }
    )
    path = _write_groups(tmp_path / "t.parquet", t, 10, TraceMeta(block_size=16))
    v = _cli("traces", "validate", str(path))
    assert v.returncode == 0, v.stderr
    r = _cli("traces", "inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert "3 in 2 sessions" in r.stdout and "unknown (no hash ids)" in r.stdout
    missing = _write_groups(
        tmp_path / "bad.parquet", t.drop_columns(["arrival_ns"]), 10, TraceMeta(block_size=16)
    )
    r = _cli("traces", "inspect", str(missing))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "arrival_ns" in r.stderr and str(missing) in r.stderr


def test_session_streams_of_many_subagents_by_hand() -> None:
    """Main turns 0..3; subagent k (request 4+k) spawned by main turn k, joined by k+1."""
    t = subagent_session(3)
    got = session_streams(
        "tree",
        t.column("request_index").to_pylist(),
        t.column("agent_id").cast(pa.string()).to_pylist(),
        t.column("depends_on").to_pylist(),
    )
    assert [(a.agent_id, a.turns, a.first, a.last, a.spawned_by, a.joined_by) for a in got] == [
        ("main", 4, 0, 3, None, None),
        ("a0", 1, 4, 4, 0, 1),
        ("a1", 1, 5, 5, 1, 2),
        ("a2", 1, 6, 6, 2, 3),
    ]
    big = summarize_table(subagent_session(20_000), 16)  # quadratic took minutes
    assert len(big.agents) == 20_001
    assert big.agents[-1] == type(big.agents[-1])(
        "tree", "a19999", 1, 40_000, 40_000, 19_999, 20_000
    )


@pytest.mark.slow
def test_inspect_memory_is_bounded_by_a_row_group(tmp_path: Path) -> None:
    """A 100k-request synthetic trace (11M hash ids): the whole-table summary peaked at
    1.86 GB; streamed, under 700 MB (the child's peak resident memory)."""
    table, meta = synthesize(SynthModel(), SynthConfig(sessions=9_838, seed=1, block_size=64))
    path = write_trace(table, tmp_path / "t.parquet", meta)
    del table
    r, rss_mib = run_peak(tmp_path, "traces", "inspect", str(path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "in 9,838 sessions" in r.stdout
    assert rss_mib < 700, rss_mib
