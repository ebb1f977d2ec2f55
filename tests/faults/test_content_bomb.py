"""A content bomb within the memory budget (a 1 MB value on 2,000 rows: 2 GB decoded from
23 KB on disk) is refused before it is decoded: validate peaked at 2.1 GB and run at
4.2 GB before; now one line, exit 2, a few hundred MB (the child's peak resident memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from agent_replay.errors import TraceError
from agent_replay.traces.io import read_trace, write_trace
from agent_replay.traces.limits import TraceLimits
from agent_replay.traces.schema import TraceMeta
from tests.faults import hostile
from tests.peak import run_peak


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_a_content_bomb_is_refused_before_it_is_decoded(tmp_path: Path, cmd: str) -> None:
    path = hostile.string_bomb(tmp_path / "t.parquet", rows=2000)
    assert path.stat().st_size < 40_000
    args = (
        ["traces", "validate", str(path)]
        if cmd == "validate"
        else ["run", str(path), "--target", "http://127.0.0.1:9", "-o", str(tmp_path / "r")]
    )
    r, rss_mib = run_peak(tmp_path, *args)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and "field 'content': decodes to 2,000 MiB" in lines[0]
    assert "more than 1,000 times its size" in lines[0]
    assert rss_mib < 500, rss_mib
    assert not (tmp_path / "r").exists()


def test_text_that_compresses_as_text_does_is_read(tmp_path: Path) -> None:
    """2 MB of words (compressing a few times) pass a 1 MiB floor; the same size of one
    repeated value does not."""
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "tool", "result", "{", "}", "\n"])
    n = 200
    bodies = [" ".join(rng.choice(words, 2000)) for _ in range(n)]
    table = hostile._base(n)  # the columns inspect reads
    table["content"] = pa.array(bodies)
    path = write_trace(pa.table(table), tmp_path / "t.parquet", TraceMeta(block_size=16))
    limits = TraceLimits(expansion_floor=1 << 20)
    t, _ = read_trace(path, limits=limits)
    assert t.column("content").to_pylist() == bodies
    bomb = hostile.string_bomb(tmp_path / "b.parquet", rows=200, value_bytes=10_000)
    with pytest.raises(TraceError, match="more than 1,000 times its size"):
        read_trace(bomb, limits=limits)
