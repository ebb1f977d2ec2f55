"""Request bodies with a ``Content-Encoding``: decoded for the recorder's eyes only, within
limits, off the proxy's event loop.

The proxy forwards a request body byte for byte as the client sent it, header included;
what the recorder parses (model, conversation, hash ids) is a decoded copy. Decoders:
gzip and deflate (zlib, always), br (the ``brotli`` package from 1.2, or ``brotlicffi``,
where they can stop at an output size) and zstd (the ``zstandard`` package, or
``compression.zstd`` from Python 3.14) when installed.

Decoding is streamed, at most ``STEP`` bytes of output at a time, and stops at a limit
(``DecodeLimits``): more than ``max_decoded`` bytes, or, past ``ratio_floor`` bytes, more
than ``max_ratio`` times the encoded size. A body over a limit raises ``BodyRefused``
(the proxy answers 413 and records a row of the refusal): a compression bomb costs the
recorder at most the limit in memory and the time to decode that much, not what the bomb
decodes to. The decoders run without the GIL (zlib, brotli and zstandard release it), in
the worker threads of ``Decoders``, so the proxy's loop goes on forwarding other streams
while a body is decoded.

A body that cannot be decoded (no decoder installed, corrupt or truncated data) is still
forwarded as sent and recorded without its conversation (no hash ids, no session inference
from content), with the reason in ``undecoded``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

STEP = 1 << 18
"""Most bytes of output one decoder call makes."""

IN_STEP = 1 << 16
"""Most bytes of input one decoder call takes: what a decoder keeps of its input between
calls (zlib's ``unconsumed_tail``) is a copy, made with the GIL held."""

MIB = 1 << 20
MAX_DECODED = 32 * MIB
MAX_RATIO = 200.0


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Where decoding a request body stops (``record --max-decoded``, ``--max-ratio``)."""

    max_decoded: int = MAX_DECODED
    """Most bytes a body may decode to (the largest body LLM APIs take)."""
    max_ratio: float = MAX_RATIO
    """Most times its encoded size a body may decode to, once past ``ratio_floor``; a
    bomb decodes to 1,000 (gzip) to 600,000 (brotli) times its size."""
    ratio_floor: int = MIB
    """The ratio is not checked below this many decoded bytes (a small body may compress
    well without harm)."""


class BodyRefused(Exception):
    """A request body over a decode limit; the text says which, for the client's 413 and
    the refusal's row."""


Decoder = Callable[[Iterable[bytes]], Iterator[bytes]]
"""Encoded pieces in, decoded pieces of at most about ``STEP`` bytes out; raises on data
it cannot decode (truncated included)."""


def _zlib(wbits: int) -> Decoder:
    def run(pieces: Iterable[bytes]) -> Iterator[bytes]:
        d = zlib.decompressobj(wbits)
        for p in pieces:
            buf = p
            while buf and not d.eof:
                out = d.decompress(buf, STEP)
                buf = d.unconsumed_tail
                if out:
                    yield out
            if d.eof:
                break
        while not d.eof:  # all input taken; output may still wait in the decoder
            out = d.decompress(b"", STEP)
            if not out:
                raise ValueError("truncated data")
            yield out

    return run


_gzip = _zlib(16 + zlib.MAX_WBITS)


def _deflate(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """RFC 9110 deflate is zlib-wrapped; some clients send raw deflate (told apart by the
    zlib header: compression method 8, header checksum a multiple of 31)."""
    it = iter(pieces)
    head = b""
    for p in it:
        head += p
        if len(head) >= 2:
            break
    wrapped = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
    yield from _zlib(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)(_prepend(head, it))


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _brotli() -> Decoder | None:
    mod: Any = None
    for name in ("brotli", "brotlicffi"):
        try:
            mod = __import__(name)
            break
        except ImportError:
            continue
    if mod is None:
        return None
    try:
        mod.Decompressor().process(b"", output_buffer_limit=STEP)
        bounded = True
    except TypeError:
        bounded = False
    version = getattr(mod, "__version__", "?")

    def run(pieces: Iterable[bytes]) -> Iterator[bytes]:
        if not bounded:
            raise ValueError(
                f"{mod.__name__} {version} cannot stop decoding at a size (brotli >= 1.2 can)"
            )
        d = mod.Decompressor()
        for p in pieces:
            out = d.process(p, output_buffer_limit=STEP)
            while True:
                if out:
                    yield out
                if d.can_accept_more_data():
                    break
                out = d.process(b"", output_buffer_limit=STEP)
                if not out and not d.can_accept_more_data():
                    raise ValueError("the decoder makes no progress")
        while not d.is_finished():  # all input taken; output may still wait in the decoder
            out = d.process(b"", output_buffer_limit=STEP)
            if not out:
                raise ValueError("truncated data")
            yield out

    return run


def needs_input_decoder(make: Callable[[], Any]) -> Decoder:
    """A decoder for objects with the ``bz2``/``lzma``/``compression.zstd`` API
    (``decompress(data, max_length)``, ``needs_input``, ``eof``)."""

    def run(pieces: Iterable[bytes]) -> Iterator[bytes]:
        d = make()
        for p in pieces:
            buf = p
            while not d.eof:
                out = d.decompress(buf, STEP)
                buf = b""
                if out:
                    yield out
                if d.needs_input:
                    break
            if d.eof:
                break
        if not d.eof:
            raise ValueError("truncated data")

    return run


ZSTD_WINDOW = 1 << 25
"""Largest zstd window taken (32 MiB; level 19 uses 8 MiB): a frame asking for more
would make the decoder allocate it, whatever the body decodes to."""


class _Chain:
    """Pieces as a file (``read``), for ``zstandard``'s stream reader."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._it = iter(pieces)
        self._buf = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        while not self._buf:
            nxt = next(self._it, None)
            if nxt is None:
                return b""
            self._buf = memoryview(nxt)
        if n < 0:
            n = len(self._buf)
        out, self._buf = self._buf[:n], self._buf[n:]
        return bytes(out)


def _zstd() -> Decoder | None:
    try:
        import zstandard

        def run(pieces: Iterable[bytes]) -> Iterator[bytes]:
            dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW)
            with dctx.stream_reader(
                _Chain(pieces),  # type: ignore[arg-type]  # has read()
                read_size=STEP,
                closefd=False,
            ) as r:
                while out := r.read(STEP):
                    yield out

        return run
    except ImportError:
        pass
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python >= 3.14

        return needs_input_decoder(zstd.ZstdDecompressor)
    except ImportError:
        return None


def decoders() -> dict[str, Decoder]:
    """The content codings this process can decode, by name."""
    out: dict[str, Decoder] = {"gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate}
    br = _brotli()
    if br is not None:
        out["br"] = br
    zs = _zstd()
    if zs is not None:
        out["zstd"] = zs
    return out


_DECODERS = decoders()


def decode(
    parts: Sequence[bytes], encoding: str | None, limits: DecodeLimits = DecodeLimits()
) -> tuple[list[bytes] | None, str | None]:
    """(the decoded body, in pieces; None), or (None, why) when it cannot be decoded here.
    ``encoding`` is the Content-Encoding field: codings applied in order, comma-separated.
    Raises ``BodyRefused`` as soon as the output passes a limit."""
    if not encoding:
        return list(parts), None
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    size = sum(map(len, parts))
    pieces = list(parts)
    for coding in reversed(codings):  # the last applied is undone first
        if coding == "identity":
            continue
        dec = _DECODERS.get(coding)
        if dec is None:
            return None, f"request content-encoding {coding!r}: no decoder installed"
        out: list[bytes] = []
        n = 0
        try:
            for piece in dec(_sliced(pieces)):
                n += len(piece)
                if n > limits.max_decoded:
                    raise BodyRefused(
                        f"the {coding} body decodes to more than "
                        f"{size_text(limits.max_decoded)} (--max-decoded)"
                    )
                if n > limits.ratio_floor and n > limits.max_ratio * size:
                    raise BodyRefused(
                        f"the {coding} body of {size:,} bytes decodes to more "
                        f"than {limits.max_ratio:g} times its size "
                        "(--max-ratio)"
                    )
                out.append(piece)
        except BodyRefused:
            raise
        except Exception as exc:  # any decoder's error: the body is forwarded as sent
            return None, f"request content-encoding {coding!r}: {type(exc).__name__}: {exc}"[:200]
        pieces = out
    return pieces, None


def _sliced(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` in slices of at most ``IN_STEP`` bytes (views, not copies)."""
    for p in pieces:
        if len(p) <= IN_STEP:
            yield p
            continue
        view = memoryview(p)
        for i in range(0, len(p), IN_STEP):
            yield view[i : i + IN_STEP]  # type: ignore[misc]  # a bytes-like view


def decode_body(
    data: bytes, encoding: str | None, limits: DecodeLimits = DecodeLimits()
) -> tuple[bytes | None, str | None]:
    """``decode`` of one piece, joined."""
    pieces, why = decode([data], encoding, limits)
    return (b"".join(pieces), None) if pieces is not None else (None, why)


def size_text(n: int) -> str:
    """A byte count for a message: in MiB or KiB where that is exact, else bytes."""
    if n >= MIB and n % (MIB // 16) == 0:
        return f"{n / MIB:g} MiB"
    if n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n:,} bytes"


class Decoders:
    """Worker threads that decode request bodies (``decode``), at most ``threads`` at once
    (so at most that many bodies' limits in memory). They run at a lower priority than the
    proxy's loop (Linux: a thread's nice value is its own), which on a busy machine gets the
    CPU first."""

    def __init__(self, limits: DecodeLimits, threads: int = 2) -> None:
        self.limits = limits
        self._threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def decode(
        self, parts: Sequence[bytes], encoding: str
    ) -> tuple[list[bytes] | None, str | None]:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="decode", initializer=_lower_priority
            )
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, decode, parts, encoding, self.limits
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
