"""Encoded request bodies are decoded within limits: a body over ``--max-decoded`` or
``--max-ratio`` (or ``--max-body``) gets 413 in the API's error shape, is not forwarded,
and leaves a row that says why; a big encoded body is parsed like a big plain one. Request
bodies that are not a JSON object are forwarded, not recorded, and counted by why."""

from __future__ import annotations

import bz2
import gzip
import zlib
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_replay.replay.record import Recorder
from agent_replay.replay.record.encodings import (
    STEP,
    BodyRefused,
    DecodeLimits,
    decode,
    decoders,
    needs_input_decoder,
)
from agent_replay.traces.io import read_meta, read_trace
from tests.record.test_wire_correctness import BODY, RawUpstream, _encoders

KIB = 1 << 10
MIB = 1 << 20


def _slices(data: bytes, n: int) -> list[bytes]:
    return [data[i : i + n] for i in range(0, len(data), n)] or [b""]


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_streamed_decode_gives_the_body_in_bounded_pieces(coding: str) -> None:
    enc = _encoders()
    if coding not in enc:
        pytest.skip(f"no {coding} decoder installed")
    body = b" ".join(b"w%d" % (i * 7919 % 100_003) for i in range(400_000))  # 2.8 MB
    packed = enc[coding](body)  # type: ignore[operator]
    for size in (1, 4093, len(packed)):
        pieces, why = decode(
            _slices(packed, size)
            if size > 1
            else _slices(packed[:64], 1) + _slices(packed[64:], 65536),
            coding,
        )
        assert why is None and pieces is not None
        assert b"".join(pieces) == body
        assert max(map(len, pieces)) <= 2 * STEP
    cut, why = decode([packed[: len(packed) // 2]], coding)
    if coding != "zstd":  # zstandard's stream reader ends a cut frame quietly
        assert cut is None and why is not None and "truncated" in why, why


def test_raw_deflate_and_layers() -> None:
    body = orjson.dumps(BODY)
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw = c.compress(body) + c.flush()
    assert decode([raw], "deflate") == ([body], None)
    twice = zlib.compress(gzip.compress(body, mtime=0))
    pieces, why = decode([twice], "gzip, deflate")
    assert why is None and b"".join(pieces or []) == body
    assert decode([body], "identity") == ([body], None)
    assert (
        decode([b"x"], "x-unknown")[1]
        == "request content-encoding 'x-unknown': no decoder installed"
    )


def test_needs_input_api_decoder() -> None:
    """The loop ``compression.zstd`` (Python 3.14) decodes with, on ``bz2``'s same API."""
    body = bytes(range(256)) * 20_000
    packed = bz2.compress(body)
    dec = needs_input_decoder(bz2.BZ2Decompressor)
    out = list(dec(_slices(packed, 777)))
    assert b"".join(out) == body and max(map(len, out)) <= STEP
    with pytest.raises(ValueError, match="truncated"):
        list(dec([packed[:1000]]))


def test_limits_are_exact() -> None:
    zeros = 3 * MIB
    packed = gzip.compress(b"\0" * zeros)
    at = DecodeLimits(max_decoded=zeros, max_ratio=1e9)
    pieces, why = decode([packed], "gzip", at)
    assert why is None and sum(map(len, pieces or [])) == zeros
    with pytest.raises(
        BodyRefused, match=r"decodes to more than 3,145,727 bytes \(--max-decoded\)"
    ):
        decode([packed], "gzip", DecodeLimits(max_decoded=zeros - 1, max_ratio=1e9))
    # 3 MiB of zeros is about 3 KiB gzip: 1,000 to 1
    ratio = zeros / len(packed)
    assert 500 < ratio < 2000
    with pytest.raises(
        BodyRefused,
        match=rf"of {len(packed):,} bytes decodes to more than "
        r"500 times its size \(--max-ratio\)",
    ):
        decode([packed], "gzip", DecodeLimits(max_ratio=500))
    assert decode([packed], "gzip", DecodeLimits(max_ratio=ratio + 1))[1] is None
    # below the floor the ratio is not looked at: a small body may compress well
    small = gzip.compress(b"\0" * (MIB - 1))
    assert decode([small], "gzip", DecodeLimits(max_ratio=2))[1] is None


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip"])
def test_a_bomb_stops_at_the_limit(coding: str) -> None:
    """A 1 GiB bomb is refused after decoding about the ratio floor (brotli, zstd: their
    ratio is far over 200) or ``max_decoded`` (gzip: about 1,000 to 1)."""
    from tests.faults.bombs import BOMBS

    if coding not in decoders():
        pytest.skip(f"no {coding} decoder installed")
    bomb = BOMBS[coding](1 << 30)
    ratio = (1 << 30) / len(bomb)  # as docs/recording.md says
    assert {"br": ratio > 600_000, "zstd": ratio > 30_000, "gzip": 1000 < ratio < 1100}[coding]
    with pytest.raises(BodyRefused) as got:
        decode([bomb], coding)
    assert ("--max-ratio" if coding != "gzip" else "--max-decoded") in str(got.value)


async def _post(
    url: str, path: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    from tests.faults.bombs import slices

    headers = {**(headers or {}), "Content-Length": str(len(data))}
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(url + path, data=slices(data), headers=headers) as r,
    ):
        return r.status, await r.read()


async def test_refused_bodies_get_413_in_the_apis_shape_and_a_row(tmp_path: Path) -> None:
    bomb = gzip.compress(b"\0" * (8 * MIB))
    async with RawUpstream() as up:
        async with Recorder(
            up.url,
            "127.0.0.1:0",
            tmp_path / "t",
            flush_interval_s=60,
            max_decoded=4 * MIB,
            max_ratio=2000,
            max_body=64 * KIB,
        ) as rec:
            chat = await _post(
                rec.url,
                "/v1/chat/completions",
                bomb,
                {"Content-Encoding": "gzip", "X-Session-ID": "s1"},
            )
            msgs = await _post(rec.url, "/v1/messages", bomb, {"Content-Encoding": "gzip"})
            big = await _post(rec.url, "/v1/chat/completions", b"{" + b" " * (65 * KIB) + b"}")
            ok = await _post(
                rec.url, "/v1/chat/completions", orjson.dumps(BODY), {"X-Session-ID": "s1"}
            )
            line = rec.status_line()
        assert len(up.seen) == 1  # only the good one went upstream
    assert chat[0] == 413 and msgs[0] == 413 and big[0] == 413 and ok[0] == 200
    why = "the gzip body decodes to more than 4 MiB (--max-decoded)"
    assert orjson.loads(chat[1]) == {
        "error": {
            "message": f"agent-replay record: {why}",
            "type": "invalid_request_error",
            "code": 413,
        }
    }
    assert orjson.loads(msgs[1]) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": f"agent-replay record: {why}"},
    }
    assert orjson.loads(big[1])["error"]["message"] == (
        "agent-replay record: the body is larger than 64 KiB (--max-body)"
    )
    assert "3 refused (413)" in line and "4 requests (3 failed" in line
    rows = read_trace(tmp_path / "t")[0].to_pylist()
    refused = [r for r in rows if r["http_status"] == 413]
    assert len(rows) == 4 and len(refused) == 3
    assert [r["api"] for r in refused] == ["chat", "messages", "chat"]
    for r in refused:
        assert r["error"].startswith("refused by the recorder (413): the ")
        assert r["error"].endswith(r["undecoded_body"])
        assert r["hash_ids"] is None and r["input_tokens"] == 0 and r["output_tokens"] == 0
    # the refusal sits in the session its client named
    assert refused[0]["session_id"] == rows[-1]["session_id"] == "s1"


async def test_a_big_encoded_body_is_parsed_like_a_big_plain_one(tmp_path: Path) -> None:
    """Over 1 MB decoded, an encoded body is parsed in the helper process, as a plain one
    is; the upstream gets it as sent; both rows have the same hash ids."""
    from tests.faults.bombs import ordinary_body

    plain = ordinary_body(2_500_000)
    packed = gzip.compress(plain, mtime=0)
    assert len(plain) > 2 * MIB and len(plain) / len(packed) < 200
    async with RawUpstream() as up:
        async with Recorder(
            up.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60, hash_seed=3
        ) as rec:
            assert (await _post(rec.url, "/v1/chat/completions", plain))[0] == 200
            assert (
                await _post(rec.url, "/v1/chat/completions", packed, {"Content-Encoding": "gzip"})
            )[0] == 200
        _, (h1, b1) = up.seen
    assert b1 == packed and h1["Content-Encoding"] == "gzip"
    rows = read_trace(tmp_path / "t")[0].to_pylist()
    assert rows[0]["hash_ids"] and rows[1]["hash_ids"] == rows[0]["hash_ids"]
    assert rows[1]["undecoded_body"] is None and rows[1]["error"] is None
    # the decoded body is not a JSON object: forwarded, counted
    async with RawUpstream() as up:
        async with Recorder(up.url, "127.0.0.1:0", tmp_path / "u", flush_interval_s=60) as rec:
            listed = gzip.compress(orjson.dumps([plain.decode()]))
            assert (
                await _post(rec.url, "/v1/chat/completions", listed, {"Content-Encoding": "gzip"})
            )[0] == 200
        assert up.seen[0][1] == listed
    assert rec.stats.unrecorded == {"not_object": 1}


async def test_bodies_not_recorded_are_counted(tmp_path: Path) -> None:
    async with RawUpstream() as up:
        rec = Recorder(up.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60)
        async with rec:
            sends = [
                orjson.dumps(BODY),
                b"not json",
                b'{"model": "caf\xe9"}',
                b"[1, 2]",
                gzip.compress(b"hello"),
                b"also not json",
            ]
            for data in sends[:4]:
                assert (await _post(rec.url, "/v1/chat/completions", data))[0] == 200
            await rec.flush()  # the part so far says what was not recorded so far
            assert (
                await _post(rec.url, "/v1/chat/completions", sends[4], {"Content-Encoding": "gzip"})
            )[0] == 200
            assert (await _post(rec.url, "/v1/chat/completions", sends[5]))[0] == 200
        assert [b for _, b in up.seen] == sends  # every one forwarded as sent
    want = {"not_utf8": 1, "not_json": 3, "not_object": 1}
    assert rec.stats.unrecorded == want
    assert rec.status_line().endswith(
        "5 forwarded but not recorded (not UTF-8: 1, not JSON: 3, not a JSON object: 1)"
    )
    parts = sorted((tmp_path / "t").glob("part-*.parquet"))
    assert len(parts) == 2  # the second without rows: it holds the final count
    assert read_meta(parts[0]).extra["recorder"]["unrecorded"] == {
        "not_utf8": 1,
        "not_json": 1,
        "not_object": 1,
    }
    assert read_meta(parts[1]).extra["recorder"]["unrecorded"] == want
    table, _ = read_trace(tmp_path / "t")
    assert table.num_rows == 1


def test_a_brotli_that_cannot_stop_leaves_the_body_undecoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """brotli before 1.2 has no output limit: its bodies are forwarded, not decoded."""
    import sys
    import types

    from agent_replay.replay.record import encodings

    class Old:
        def process(self, data: bytes) -> bytes:
            raise AssertionError("never called")

    fake = types.ModuleType("brotli")
    fake.Decompressor = Old  # type: ignore[attr-defined]
    fake.__version__ = "1.1.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "brotli", fake)
    dec = encodings._brotli()
    assert dec is not None
    with pytest.raises(ValueError, match=r"brotli 1.1.0 cannot stop decoding at a size"):
        list(dec([b"\x1b"]))


def test_a_zstd_frame_asking_for_a_huge_window_is_not_decoded() -> None:
    """A frame may make the decoder allocate its window whatever it decodes to: over
    32 MiB it is left undecoded (forwarded as sent)."""
    zstandard = pytest.importorskip("zstandard")
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    c = zstandard.ZstdCompressor(compression_params=params).compressobj()
    packed = c.compress(orjson.dumps(BODY)) + c.flush()
    out, why = decode([packed], "zstd")
    assert out is None and why is not None and why.startswith("request content-encoding 'zstd'")
    c = zstandard.ZstdCompressor(
        compression_params=zstandard.ZstdCompressionParameters.from_level(3, window_log=25)
    ).compressobj()
    packed = c.compress(orjson.dumps(BODY)) + c.flush()
    assert decode([packed], "zstd") == ([orjson.dumps(BODY)], None)
