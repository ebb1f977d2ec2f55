from __future__ import annotations

import pytest

from agent_replay.engines.sse import SSEEvent, SSEParser, encode_event

STREAM = (
    b": keep-alive\n\n"
    b'event: message_start\ndata: {"type":"message_start"}\n\n'
    b'data: {"a":1}\n\n'
    b"data: line1\ndata: line2\n\n"
    b"id: 7\nretry: 10\ndata:nospace\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent("message_start", b'{"type":"message_start"}'),
    SSEEvent(None, b'{"a":1}'),
    SSEEvent(None, b"line1\nline2"),
    SSEEvent(None, b"nospace"),
    SSEEvent(None, b"[DONE]"),
]


def parse_in_pieces(stream: bytes, cuts: list[int]) -> tuple[list[SSEEvent], SSEParser]:
    p = SSEParser()
    out: list[SSEEvent] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        out += p.feed(stream[prev:c])
        prev = c
    return out, p


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_split_offset_gives_the_same_events(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    for i in range(len(stream) + 1):
        events, p = parse_in_pieces(stream, [i])
        tail, rest = p.end()
        assert events + tail == EXPECTED, (newline, i)
        assert p.comments == 1
        assert rest == b""


def test_every_pair_of_split_offsets() -> None:
    stream = STREAM.replace(b"\n", b"\r\n")
    n = len(stream)
    for i in range(0, n, 3):
        for j in range(i, n, 5):
            events, _ = parse_in_pieces(stream, [i, j])
            assert events == EXPECTED


def test_byte_at_a_time() -> None:
    events, _ = parse_in_pieces(STREAM, list(range(1, len(STREAM))))
    assert events == EXPECTED


def test_truncated_stream_is_reported_by_close() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a":1}\n\ndata: {"b"') == [SSEEvent(None, b'{"a":1}')]
    assert p.end() == ([], b'data: {"b"')


def test_encode_roundtrip() -> None:
    wire = encode_event(b'{"x":2}') + encode_event(b"{}", event="ping")
    assert SSEParser().feed(wire) == [SSEEvent(None, b'{"x":2}'), SSEEvent("ping", b"{}")]
