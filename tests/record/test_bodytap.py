"""BodyTap on a real aiohttp StreamReader: pieces go to ``take`` in order, whatever was
buffered before first; a slow client sends them through the buffer until ``resume``; the
end and errors still reach ``readany``; the reader is a plain StreamReader again after."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol

from agent_replay.replay.record.bodytap import BodyTap


class Taken:
    def __init__(self, slow_after: set[bytes] | None = None) -> None:
        self.got: list[bytes] = []
        self.slow_after = slow_after or set()

    def __call__(self, data: bytes) -> bool:
        self.got.append(data)
        return data in self.slow_after


@pytest.fixture
async def protocol() -> AsyncIterator[BaseProtocol]:
    """aiohttp's base protocol on a real (socketpair) connection."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    proto = BaseProtocol(loop)
    transport, _ = await loop.create_connection(lambda: proto, sock=a)
    yield proto
    transport.close()
    b.close()


def _reader(protocol: BaseProtocol) -> StreamReader:
    return StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())


async def test_pieces_in_order_buffered_ones_first(protocol: BaseProtocol) -> None:
    r = _reader(protocol)
    r.feed_data(b"a")  # arrived with the head, before the tap
    take = Taken()
    tap = BodyTap.attach(r, take)
    assert tap is not None and tap.slow  # starts by taking what is buffered
    r.feed_data(b"b")  # still to the buffer: after "a"
    assert tap.resume() is False and not tap.slow
    r.feed_data(b"c")
    r.feed_data(b"d")
    assert take.got == [b"ab", b"c", b"d"] and tap.direct == 2  # the buffer as readany gives it
    reading = asyncio.ensure_future(r.readany())
    await asyncio.sleep(0)
    assert not reading.done()  # nothing for readany until the end
    r.feed_eof()
    assert await reading == b""
    tap.detach()
    assert type(r) is StreamReader


async def test_slow_client_reads_wait_in_the_buffer(protocol: BaseProtocol) -> None:
    r = _reader(protocol)
    take = Taken(slow_after={b"x"})
    tap = BodyTap.attach(r, take)
    assert tap is not None and tap.resume() is False
    r.feed_data(b"x")  # the client falls behind on this one
    r.feed_data(b"y")
    r.feed_data(b"z")
    assert take.got == [b"x"] and tap.slow
    assert await r.readany() == b"yz"  # the reader's task sees them, as without a tap
    assert tap.resume() is False and not tap.slow
    r.feed_data(b"w")
    assert take.got == [b"x", b"w"]
    tap.detach()


async def test_error_in_take_ends_the_body(protocol: BaseProtocol) -> None:
    r = _reader(protocol)

    def take(data: bytes) -> bool:
        raise ConnectionResetError("client gone")

    tap = BodyTap.attach(r, take)
    assert tap is not None and tap.resume() is False
    reading = asyncio.ensure_future(r.readany())
    await asyncio.sleep(0)
    r.feed_data(b"a")
    with pytest.raises(ConnectionResetError, match="client gone"):
        await reading
    tap.detach()


async def test_not_taken_over(protocol: BaseProtocol) -> None:
    r = _reader(protocol)
    r.feed_eof()
    assert BodyTap.attach(r, Taken()) is None  # a body already over
    other = _reader(protocol)
    tap = BodyTap.attach(other, Taken())
    assert tap is not None
    assert BodyTap.attach(other, Taken()) is None  # one tap per reader
    tap.detach()
