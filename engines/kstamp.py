"""Kernel receive timestamps (Linux): for the replay's fast client (``--timestamps kernel``)
and for the simulated engine's ground truth (when a request's bytes reached the host).

A chunk's time is normally ``time.monotonic_ns()`` when the event loop hands us the read.
When the loop is busy (starting requests, a GC pass), the bytes wait in the socket and the
chunk is stamped late. With ``SO_TIMESTAMPNS`` the kernel stamps every packet as it is
received, and ``recvmsg`` returns that time with the data: the loop's own lag no longer
moves the chunk's time. For TCP the stamp a read returns is that of the last packet it
consumed, so when several chunks of one stream wait in the socket (a stall longer than the
gap between them) the earlier ones still take the later packet's time; the common case, one
chunk per read, is exact.

asyncio's and uvloop's transports read with ``recv``, which drops the timestamp, so this is
a small transport of its own: a non-blocking socket read with ``recvmsg`` from a
``loop.add_reader`` callback (works on both loops), written with ``send`` and, when the
socket is full, ``add_writer``. It offers what ``fastclient.H1Connection`` and aiohttp's
server protocol use of a transport (``write``, ``writelines``, ``close``, ``abort``,
``is_closing``, ``get_extra_info``, ``pause_reading``/``resume_reading``), tells the
protocol to pause and resume writing around a high-water mark, and calls its
``connection_made``, ``received(data, t)``, ``eof_received`` and ``connection_lost``.

The kernel stamps with CLOCK_REALTIME; each stamp is moved to CLOCK_MONOTONIC by the offset
between the two clocks measured when the connection opens (both clocks are slewed alike by
NTP; a step of the wall clock during a run would shift the stamps of connections opened
before it, and a stamp is never allowed to be later than the read itself).

On uvloop a reader added with ``add_reader`` (libuv's ``uv_poll``) can silently lose its
epoll registration when descriptor numbers are reused quickly (libuv batches
``EPOLL_CTL_ADD``/``MOD`` through io_uring but deletes at once): the socket stays readable,
with data or a reset, and the reader is never called again. A ``Watchdog`` per loop
therefore polls, every ``WATCHDOG_S``, the descriptors of its transports that were not read
since its check before; one that was ready at two polls in a row without being read is
re-registered and read at once, so a reset or a stalled read is noticed within
``3 * WATCHDOG_S``.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import sys
import time
import weakref
from typing import Any, Protocol

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
"""Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS); Python names it only on some builds."""
READ_SIZE = 262144
HIGH_WATER = 65536
"""Buffered output above which the protocol is asked to pause writing (``LOW_WATER``: resume)."""
LOW_WATER = 16384
_ANC = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
_TS = struct.Struct("qq")
_unpack_ts = _TS.unpack_from
_monotonic_ns = time.monotonic_ns
_SOL_SOCKET = socket.SOL_SOCKET
WATCHDOG_S = 0.01
_READY = select.POLLIN | select.POLLERR | select.POLLHUP


class StampedProtocol(Protocol):
    def connection_made(self, transport: Any) -> None: ...
    def received(self, data: bytes, t: int) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


def supported() -> bool:
    return sys.platform.startswith("linux")


def realtime_offset_ns(samples: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed readings."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        m0 = time.monotonic_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, r - (m0 + m1) // 2)
    assert best is not None
    return best[1]


class StampedTransport:
    """One connected TCP socket, read with ``recvmsg`` for the kernel's receive time."""

    __slots__ = (
        "__weakref__",
        "_closing",
        "_fd",
        "_loop",
        "_lost",
        "_offset",
        "_out",
        "_protocol",
        "_reading",
        "_received",
        "_recvmsg",
        "_sock",
        "_watchdog",
        "_write_paused",
        "reads",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._offset = realtime_offset_ns()
        self._out = bytearray()
        self._closing = False
        self._lost = False
        self._reading = True
        self._write_paused = False
        self.reads = 0
        """Reads so far (the watchdog's sign that the loop serves this descriptor)."""
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._recvmsg = sock.recvmsg
        self._received = protocol.received
        protocol.connection_made(self)
        self._watchdog = Watchdog.of(loop)
        if not self._closing:
            loop.add_reader(self._fd, self._on_readable)
            self._watchdog.add(self)

    def rearm(self) -> None:
        """Register the reader anew (its registration was lost) and read now."""
        if self._reading and not self._closing:
            self._loop.remove_reader(self._fd)
            self._loop.add_reader(self._fd, self._on_readable)
            self._on_readable()

    def _on_readable(self) -> None:
        self.reads += 1
        try:
            data, anc, _flags, _addr = self._recvmsg(READ_SIZE, _ANC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._connection_lost(exc)
            return
        now = _monotonic_ns()
        if not data:
            self._loop.remove_reader(self._fd)
            self._protocol.eof_received()
            self._connection_lost(None)
            return
        t = now
        if anc:  # one entry: only SO_TIMESTAMPNS is asked for
            level, kind, payload = anc[0]
            if level == _SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = _unpack_ts(payload)
                ts = sec * 1_000_000_000 + nsec - self._offset
                if ts < now:
                    t = ts
        self._received(data, t)

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._out:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._connection_lost(exc)
                return
            if n == len(data):
                return
            data = data[n:]
            self._loop.add_writer(self._fd, self._on_writable)
        self._out += data
        if not self._write_paused and len(self._out) > HIGH_WATER:
            self._write_paused = True
            pause = getattr(self._protocol, "pause_writing", None)
            if pause is not None:
                pause()

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def _on_writable(self) -> None:
        try:
            n = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._connection_lost(exc)
            return
        del self._out[:n]
        if self._write_paused and len(self._out) <= LOW_WATER:
            self._write_paused = False
            resume = getattr(self._protocol, "resume_writing", None)
            if resume is not None:
                resume()
        if not self._out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._connection_lost(None)

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        try:
            if name == "socket":
                return self._sock
            if name == "peername":
                return self._sock.getpeername()
            if name == "sockname":
                return self._sock.getsockname()
        except OSError:
            return default
        return default

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def close(self) -> None:
        """Close after what is buffered has been written."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._out:
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._closing = True
        self._loop.call_soon(self._connection_lost, None)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._watchdog.discard(self)
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._out.clear()
        try:
            self._sock.close()
        finally:
            self._protocol.connection_lost(exc)


class Watchdog:
    """Re-registers the readers of a loop's transports whose descriptors stay ready
    without being read (see the module text). Runs only on uvloop, and only while it has
    transports: every ``WATCHDOG_S`` one ``poll(2)`` of the descriptors not read since the
    check before (a stream being read cannot have lost its reader; under load that is
    nearly all of them, and polling every descriptor cost ~2% of the client's CPU at 256
    streams)."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watchdog] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.active = type(loop).__module__.startswith("uvloop")
        self.transports: dict[int, StampedTransport] = {}
        self._reads: dict[int, int] = {}  # fd -> reads at the last check
        self._poll = select.poll()
        """Every transport's descriptor, registered once: polled when most are stale."""
        self._suspect: dict[int, int] = {}  # fd -> reads when first seen ready
        self._timer: asyncio.TimerHandle | None = None
        self.rearmed = 0
        """Registrations restored so far."""

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Watchdog:
        wd = cls._by_loop.get(loop)
        if wd is None:
            wd = cls._by_loop[loop] = cls(loop)
        return wd

    def add(self, t: StampedTransport) -> None:
        if not self.active:
            return
        self.transports[t._fd] = t
        self._reads[t._fd] = -1
        self._poll.register(t._fd, _READY)
        if self._timer is None:
            self._timer = self.loop.call_later(WATCHDOG_S, self._check)

    def discard(self, t: StampedTransport) -> None:
        if self.transports.get(t._fd) is t:
            del self.transports[t._fd]
            self._reads.pop(t._fd, None)
            self._suspect.pop(t._fd, None)
            self._poll.unregister(t._fd)

    def stale(self) -> list[int]:
        """The descriptors of reading transports not read since the last call."""
        last = self._reads
        out = []
        for fd, t in self.transports.items():
            n = t.reads
            if last[fd] != n:
                last[fd] = n
            elif t._reading and not t._closing:
                out.append(fd)
        return out

    def _ready(self, stale: list[int]) -> list[int]:
        """Those of the ``stale`` descriptors with data waiting: polled in the standing set
        when most transports are idle, else in a poll set of their own."""
        if 2 * len(stale) > len(self.transports):
            wanted = set(stale)
            return [fd for fd, _ev in self._poll.poll(0) if fd in wanted]
        p = select.poll()
        for fd in stale:
            p.register(fd, _READY)
        return [fd for fd, _ev in p.poll(0)]

    def _check(self) -> None:
        self._timer = None
        if not self.transports or self.loop.is_closed():
            return
        suspect = self._suspect
        seen: dict[int, int] = {}
        stale = self.stale()
        for fd in self._ready(stale) if stale else ():
            t = self.transports[fd]
            if suspect.get(fd) == t.reads:  # ready a whole period, and not read meanwhile
                self.rearmed += 1
                t.rearm()
            else:
                seen[fd] = t.reads
        self._suspect = seen
        if self.transports:
            self._timer = self.loop.call_later(WATCHDOG_S, self._check)


AddrInfo = tuple[int, int, int, str, Any]


async def resolve(host: str, port: int) -> list[AddrInfo]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {host}")
    return list(infos)


async def open_stamped(infos: list[AddrInfo], protocol: StampedProtocol) -> StampedTransport:
    """Connect to the first address of ``infos`` (``resolve``) that answers and return the
    transport (the protocol gets connection_made)."""
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    for family, kind, proto, _name, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(loop, sock, protocol)
    assert last is not None
    raise last
