"""HTTP/1.1 wire pieces of the fast client (replay.http1), without sockets: the request head,
the response head, and the chunked decoder with its input split at every byte."""

from __future__ import annotations

import pytest

from agent_replay.replay.http1 import (
    MAX_HEAD,
    ChunkedDecoder,
    HeadReader,
    ProtocolError,
    parse_head,
    request_head,
    request_head_prefix,
)

PAYLOADS = [b'data: {"a":1}\n\n', b"x", b"data: " + b"y" * 300 + b"\n\n", b"\r\n\r\n"]


def chunked(payloads: list[bytes], ext: bool = False, trailer: bytes = b"") -> bytes:
    out = b""
    for i, p in enumerate(payloads):
        size = b"%x" % len(p)
        if ext and i % 2 == 0:
            size += b";name=value;flag"
        out += size + b"\r\n" + p + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def decode_split(raw: bytes, cuts: list[int]) -> tuple[bytes, ChunkedDecoder, list[int]]:
    dec = ChunkedDecoder()
    got = b""
    done_at = []
    prev = 0
    for c in [*cuts, len(raw)]:
        got += b"".join(dec.feed(raw[prev:c]))
        done_at.append(dec.done)
        prev = c
    return got, dec, [i for i, d in enumerate(done_at) if d]


def test_request_head_exact() -> None:
    prefix = request_head_prefix("POST", "/v1/completions", "127.0.0.1:8000")
    head = request_head(prefix, {"Content-Type": "application/json", "X-Request-Id": "r-1"}, 42)
    assert head == (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: r-1\r\n"
        b"Content-Length: 42\r\n\r\n"
    )


@pytest.mark.parametrize(
    "headers",
    [{"X-Session-ID": "s\r\nX-Evil: 1"}, {"X-A\nB": "v"}, {"X-Session-ID": "caf\u00e9 \u2603"}],
)
def test_request_head_refuses_what_would_change_the_request(headers: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        request_head(b"POST / HTTP/1.1\r\n", headers, 0)


def test_request_head_without_headers() -> None:
    assert request_head(b"P\r\n", {}, 0) == b"P\r\nContent-Length: 0\r\n\r\n"
    assert (
        request_head(b"P\r\n", {"A": "caf\u00e9"}, 1)
        == b"P\r\nA: caf\xe9\r\nContent-Length: 1\r\n\r\n"
    )


@pytest.mark.parametrize("ext,trailer", [(False, b""), (True, b""), (True, b"X-T: 1\r\nY: 2\r\n")])
def test_chunked_every_single_split(ext: bool, trailer: bytes) -> None:
    raw = chunked(PAYLOADS, ext, trailer)
    for cut in range(len(raw) + 1):
        got, dec, done = decode_split(raw, [cut])
        assert got == b"".join(PAYLOADS), cut
        assert dec.done and dec.extra == b""
        assert done == ([1] if cut < len(raw) else [0, 1]), cut


def test_chunked_every_pair_of_splits() -> None:
    payloads = [b"data: 1\n\n", b"ab\r\n"]
    raw = chunked(payloads, ext=True, trailer=b"T: v\r\n")
    for a in range(len(raw) + 1):
        for b in range(a, len(raw) + 1):
            got, dec, _ = decode_split(raw, [a, b])
            assert got == b"data: 1\n\nab\r\n", (a, b)
            assert dec.done


def test_chunked_one_byte_at_a_time_gives_data_as_it_comes() -> None:
    raw = chunked([b"hello"])
    dec = ChunkedDecoder()
    pieces = [dec.feed(raw[i : i + 1]) for i in range(len(raw))]
    # "5\r\n" then one piece per data byte, nothing for the CRLF and the last chunk
    assert pieces[3:8] == [[b"h"], [b"e"], [b"l"], [b"l"], [b"o"]]
    assert all(p == [] for p in pieces[:3] + pieces[8:])
    assert dec.done


def test_chunked_boundary_and_extra_bytes() -> None:
    dec = ChunkedDecoder()
    assert dec.at_boundary
    assert dec.feed(b"3\r\nabc\r\n") == [b"abc"]
    assert dec.at_boundary
    assert dec.feed(b"2\r\nd") == [b"d"]
    assert not dec.at_boundary
    assert dec.feed(b"e\r") == [b"e"]
    assert not dec.at_boundary
    assert dec.feed(b"\n0\r\n\r\nHTTP/1.1") == []
    assert dec.done and dec.extra == b"HTTP/1.1"
    assert dec.feed(b" 200") == [] and dec.extra == b"HTTP/1.1 200"


@pytest.mark.parametrize(
    "raw",
    [
        b"zz\r\nab\r\n",  # not hex
        b"-1\r\n",  # a sign
        b"0x2\r\nab\r\n",  # a prefix
        b"1_0\r\n",  # an underscore
        b" 2\r\nab\r\n",  # leading space
        b"\r\n",  # empty size
        b"2\r\nabX\r\n",  # data longer than its size
        b"2\r\nab\rX",  # CR not followed by LF
        b"1" * 5000,  # endless size line
    ],
)
def test_chunked_garbage_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(raw)


def test_chunked_size_with_whitespace_before_extension() -> None:
    assert ChunkedDecoder().feed(b"2 ;x=y\r\nab\r\n") == [b"ab"]


def test_parse_head_framing_and_keep_alive() -> None:
    h = parse_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
    )
    assert (h.status, h.reason, h.chunked, h.content_length, h.keep_alive) == (
        200,
        "OK",
        True,
        None,
        True,
    )
    assert h.headers == [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
    h = parse_head(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 12\r\nConnection: close")
    assert (h.status, h.chunked, h.content_length, h.keep_alive, h.until_close) == (
        500,
        False,
        12,
        False,
        False,
    )
    h = parse_head(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain")
    assert (h.keep_alive, h.until_close) == (False, True)
    h = parse_head(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0")
    assert (h.keep_alive, h.until_close, h.content_length) == (True, False, 0)
    # Transfer-Encoding wins over Content-Length
    h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked")
    assert (h.chunked, h.content_length) == (True, None)
    h = parse_head(b"HTTP/1.1 204 No Content")
    assert (h.has_body, h.until_close) == (False, False)
    assert parse_head(b"HTTP/1.1 200").reason == ""


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK",
        b"garbage",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 abc OK",
        b"",
        b"HTTP/1.1 200 OK\r\nno colon here",
        b"HTTP/1.1 200 OK\r\nBad Name: x",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
    ],
)
def test_parse_head_rejects(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(raw)


def test_head_reader_every_split_skips_interim_and_returns_the_rest() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n"
    )
    for cut in range(len(raw) + 1):
        r = HeadReader()
        got = r.feed(raw[:cut])
        if got is None:
            got = r.feed(raw[cut:])
            assert got is not None, cut
            head, rest = got
        else:
            head, rest = got[0], got[1] + raw[cut:]
        assert (head.status, head.chunked, rest) == (200, True, b"3\r\nabc\r\n"), cut


def test_head_reader_gives_up_on_endless_heads() -> None:
    r = HeadReader()
    assert r.feed(b"HTTP/1.1 200 OK\r\n") is None and r.pending == 17
    with pytest.raises(ProtocolError):
        r.feed(b"X: " + b"y" * MAX_HEAD)
