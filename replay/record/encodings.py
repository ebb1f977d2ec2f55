"""Request bodies with a ``Content-Encoding``: decoded for the recorder's eyes only. Pure.

The proxy forwards a request body byte for byte as the client sent it, header included;
what the recorder parses (model, conversation, hash ids) is a decoded copy. Decoders:
gzip and deflate (zlib, always), br (the ``brotli`` or ``brotlicffi`` package) and zstd
(the ``zstandard`` package, or ``compression.zstd`` from Python 3.14) when installed. A
body that cannot be decoded is still forwarded as sent and recorded without its
conversation (no hash ids, no session inference from content), with the reason in
``undecoded``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

MAX_DECODED = 256 << 20
"""A decoded body larger than this is not parsed (a compression bomb costs memory only
up to here)."""


def _gzip(data: bytes) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, MAX_DECODED)
    if d.unconsumed_tail:
        raise ValueError(f"decoded body larger than {MAX_DECODED} bytes")
    return out


def _deflate(data: bytes) -> bytes:
    # RFC 9110 deflate is zlib-wrapped; some clients send raw deflate.
    for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
        try:
            d = zlib.decompressobj(wbits)
            out = d.decompress(data, MAX_DECODED)
        except zlib.error:
            continue
        if d.unconsumed_tail:
            raise ValueError(f"decoded body larger than {MAX_DECODED} bytes")
        return out
    raise ValueError("not deflate data")


def _brotli() -> Callable[[bytes], bytes] | None:
    for name in ("brotli", "brotlicffi"):
        try:
            mod: Any = __import__(name)
        except ImportError:
            continue
        return mod.decompress  # type: ignore[no-any-return,unused-ignore]
    return None


def _zstd() -> Callable[[bytes], bytes] | None:
    try:
        import zstandard

        def dec(data: bytes) -> bytes:
            return zstandard.ZstdDecompressor().decompressobj().decompress(data)  # type: ignore[no-any-return,unused-ignore]

        return dec
    except ImportError:
        pass
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # Python >= 3.14

        return zstd.decompress  # type: ignore[no-any-return,unused-ignore]
    except ImportError:
        return None


def decoders() -> dict[str, Callable[[bytes], bytes]]:
    """The content codings this process can decode, by name."""
    out: dict[str, Callable[[bytes], bytes]] = {"gzip": _gzip, "x-gzip": _gzip,
                                                 "deflate": _deflate}
    br = _brotli()
    if br is not None:
        out["br"] = br
    zs = _zstd()
    if zs is not None:
        out["zstd"] = zs
    return out


_DECODERS = decoders()


def decode_body(data: bytes, encoding: str | None) -> tuple[bytes | None, str | None]:
    """(decoded bytes, None), or (None, why) when the body cannot be decoded here.
    ``encoding`` is the Content-Encoding field: codings applied in order, comma-separated."""
    if not encoding:
        return data, None
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):  # the last applied is undone first
        if coding == "identity":
            continue
        dec = _DECODERS.get(coding)
        if dec is None:
            return None, f"request content-encoding {coding!r}: no decoder installed"
        try:
            data = dec(data)
        except Exception as exc:  # any decoder's error: the body is forwarded as sent
            return None, f"request content-encoding {coding!r}: {type(exc).__name__}: {exc}"[:200]
        if len(data) > MAX_DECODED:
            return None, f"request content-encoding {coding!r}: decoded body too large"
    return data, None
