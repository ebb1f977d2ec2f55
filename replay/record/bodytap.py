"""A response body taken from aiohttp's client as each read arrives, in the connection's
own ``data_received``: no future, task wake-up and ``readany`` per read.

aiohttp's HTTP parser hands each piece of a body to the response's ``StreamReader``
through ``feed_data`` (already framed: chunked coding and length undone). ``BodyTap``
gives that reader a subclass whose ``feed_data`` passes the piece to a function
(``take``) at once instead of buffering it. Everything else stays aiohttp's: the end of
the body, errors and a cut connection still reach the reader (its ``readany`` returns
``b""`` or raises), the connection goes back to the pool as before.

When ``take`` says the client is not keeping up, the tap stops taking: the following
pieces wait in the reader's buffer, under aiohttp's flow control (the upstream's socket
is paused when the buffer is full), for the reader's task, which waits on the client and
then calls ``resume``.

``BodyTap.attach`` returns None for a reader it cannot take over (another class, a body
already over): the caller then reads with ``readany``, which gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import StreamReader

_TAPS: dict[int, BodyTap] = {}
"""id(reader) -> its tap, while attached (the reader's class has ``__slots__``)."""


class _TapReader(StreamReader):
    """A ``StreamReader`` whose pieces go to its tap, if one is taking."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        tap = _TAPS.get(id(self))
        if tap is None or tap.slow or not data:
            return StreamReader.feed_data(self, data, size)
        tap.take(data)
        return False


class BodyTap:
    """Takes a response body's reads as they arrive (see the module text)."""

    __slots__ = ("_content", "_take", "direct", "slow")

    def __init__(self, content: StreamReader, take: Callable[[bytes], bool]) -> None:
        self._content = content
        self._take = take
        self.slow = False
        """The client is not keeping up: reads wait in the reader's buffer."""
        self.direct = 0
        """Reads taken in ``data_received``."""

    @classmethod
    def attach(cls, content: StreamReader, take: Callable[[bytes], bool]) -> BodyTap | None:
        """Take ``content``'s reads from now on. The tap starts slow: ``resume`` takes
        what the reader holds already. ``take(data)`` returns True when the client is not
        keeping up; an exception it raises in ``data_received`` ends the body with that
        exception (``readany`` raises it)."""
        if (
            type(content) is not StreamReader
            or content.exception() is not None
            or content.is_eof()
            or id(content) in _TAPS
        ):
            return None
        tap = cls(content, take)
        content.__class__ = _TapReader
        _TAPS[id(content)] = tap
        tap.slow = True
        return tap

    def take(self, data: bytes) -> None:
        self.direct += 1
        try:
            if self._take(data):
                self.slow = True
        except Exception as exc:
            self.slow = True
            self._content.set_exception(exc)

    def resume(self) -> bool:
        """After a wait on the client: take what waited in the reader's buffer, now.
        True when the client is behind again (the tap stays slow: wait, then resume
        again); False when the buffer is empty and the tap takes reads again. Raises
        the body's error, as ``readany`` would."""
        content = self._content
        while data := content.read_nowait():
            if self._take(data):
                return True
        self.slow = False
        return False

    def detach(self) -> None:
        if _TAPS.get(id(self._content)) is self:
            del _TAPS[id(self._content)]
            self._content.__class__ = StreamReader
