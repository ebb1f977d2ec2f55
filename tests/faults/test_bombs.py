"""Compression bombs beside live streams: a brotli, a zstd and a gzip body of a few KB
that decode to 256 MiB each are refused with 413 in the API's error shape, each leaves a
row that says why, the recorder's resident set grows by less than its decode limits
allow, and the 20 live streams beside them keep their chunk gaps.

Before the limits, the recorder decoded brotli and zstd whole (a 2.4 KB brotli body took it
to 3.3 GB) and every encoded body on its event loop (a 1 MB gzip bomb stalled every other
stream for seconds): benchmarks/bench_bombs.py has the before/after numbers."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agent_replay.replay.record.encodings import MAX_DECODED, decoders
from tests.faults.bombs import BOMBS, Rig, ordinary_body, pct, phase

MIB = 1 << 20

pytestmark = pytest.mark.skipif(
    not {"br", "zstd"} <= set(decoders()),
    reason="brotli and zstandard not installed (extra: codecs)",
)


def _bombs() -> list[tuple[str, bytes, str | None]]:
    return [(name, make(256 * MIB), name) for name, make in BOMBS.items()]


@pytest.mark.slow
async def test_bombs_are_refused_within_the_memory_limit(tmp_path: Path) -> None:
    async with Rig(tmp_path / "trace") as rig:
        p = await phase(rig, "bombs", _bombs(), streams=20, seconds=2.0)
        code = await rig.stop()
    assert code == 0
    got = {x.name: x for x in p.posted}
    assert {n: x.status for n, x in got.items()} == {"br": 413, "zstd": 413, "gzip": 413}
    for name, x in got.items():
        err = orjson.loads(x.body)["error"]
        assert err["code"] == 413 and err["type"] == "invalid_request_error"
        assert err["message"].startswith(f"agent-replay record: the {name} body ")
    # brotli and zstd pass 200 to 1 early; gzip (about 1,000 to 1) meets the size limit
    assert "(--max-ratio)" in orjson.loads(got["br"].body)["error"]["message"]
    assert "(--max-decoded)" in orjson.loads(got["gzip"].body)["error"]["message"]
    # Each decode holds at most MAX_DECODED (two at once); without the limits the
    # recorder grew by 2.1 GB here (VmHWM).
    grown = p.rss_peak - p.rss_before
    print(f"recorder RSS {p.rss_before / 1e6:.0f} MB, peak {p.rss_peak / 1e6:.0f} MB")
    assert grown < 2 * MAX_DECODED + 64 * MIB, grown
    assert len(p.gaps) > 20 * 99  # every live stream went on
    assert "3 refused (413)" in rig.stderr.decode().strip().splitlines()[-1]
    from agent_replay.traces.io import read_trace

    rows = read_trace(tmp_path / "trace")[0].to_pylist()
    refused = [r for r in rows if r["http_status"] == 413]
    assert len(refused) == 3
    assert all(r["error"].startswith("refused by the recorder (413): the ") for r in refused)
    assert all(r["error"] is None for r in rows if r["http_status"] != 413)


@pytest.mark.slow
@pytest.mark.timing
async def test_bombs_leave_live_streams_their_gaps(tmp_path: Path) -> None:
    """The live streams' p99 chunk gap with the bombs posted is within 5 ms of the same
    with three small plain bodies posted instead (the same run, one after the other)."""
    small = ordinary_body(2000)
    async with Rig(tmp_path / "trace") as rig:
        plain = await phase(rig, "plain", [(f"plain-{i}", small, None) for i in range(3)])
        bombs = await phase(rig, "bombs", _bombs())
    assert [x.status for x in plain.posted] == [200] * 3
    assert [x.status for x in bombs.posted] == [413] * 3
    p99 = pct(plain.gaps, 99), pct(bombs.gaps, 99)
    print(
        f"p99 gap plain {p99[0] * 1e3:.1f} ms, bombs {p99[1] * 1e3:.1f} ms; max "
        f"{max(plain.gaps) * 1e3:.0f} / {max(bombs.gaps) * 1e3:.0f} ms"
    )
    assert p99[1] < p99[0] + 0.005, p99
