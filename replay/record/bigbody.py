"""Big request bodies, handled without holding the proxy's event loop.

A JSON parser holds the GIL for the whole parse (about a second for 30 MB on a busy core),
and so do copies and hashes of a prompt that size: on the event loop, or in a thread, they
would stall every other stream the proxy forwards. A body over ``BIG_BODY_BYTES`` is
therefore kept as the pieces it arrived in (forwarded upstream as they are), written to a
temporary file, and parsed in a helper process, which sends back only what the recorder
keeps of it (``BodyDigest``): the session digests, the prompt's block hashes, the stored
content. Neither the body nor any copy of it crosses a pipe in one pickle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent_replay.engines.apis.openai import INJECT_USAGE as _INJECT
from agent_replay.replay.record.content import PromptHasher, PromptUnits
from agent_replay.replay.record.wire import RequestInfo

BIG_BODY_BYTES = 1 << 20
"""Bodies larger than this are parsed in the helper process."""

_OTHER_ITEM: dict[str, Any] = {"role": "user"}
"""Stands for a conversation item the model did not produce: session inference looks only
at the model's own items (``replay.record.sessions``), and at the chain digests."""


@dataclass(frozen=True, slots=True)
class DigestSpec:
    """How the recorder hashes and stores a prompt (its ``PromptHasher`` and content mode)."""

    block_size: int
    seed: int
    tokenizer: str | None
    content: str


@dataclass(slots=True)
class BodyDigest:
    """What the recorder keeps of a big body instead of the body."""

    items: list[Any]
    """The conversation items, those the model did not produce replaced by a stand-in."""
    chains: list[bytes]
    """``sessions.chain_digests`` of the whole conversation."""
    units: PromptUnits
    """What the prompt's block ids are computed from (``PromptHasher.units``); no grains
    with content mode ``none``. Arrays, not lists: they cross from the helper as buffers."""
    content: bytes | None
    """The stored content (content mode ``full``), as JSON."""
    secrets: list[str]
    """``agent_replay.redact.secret_values`` of the body."""

    def hash_ids(self, hasher: PromptHasher, input_tokens: int | None) -> tuple[np.ndarray, int]:
        """As ``PromptHasher.hash_ids`` of the body, as an int64 array (which the flush
        gathers into the part's column without the GIL, ``sink.rows_to_table``)."""
        ids = hasher.ids(self.units, input_tokens)
        return np.asarray(ids, dtype=np.int64), self.units.estimate


class BigBodies:
    """The helper process and the parse of one big body in it (``digest``).

    ``start`` starts the helper in a thread (spawning it and importing what it needs costs
    the calling thread tens of milliseconds of GIL, and a second of wall time), so that
    it is ready before the first big body and never started by one."""

    def __init__(self, spec: DigestSpec) -> None:
        self.spec = spec
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ready: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().run_in_executor(None, self._start)

    def _start(self) -> None:
        pool = concurrent.futures.ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_background,
            initargs=(os.getpid(),),
        )
        self._pool = pool
        pool.submit(_hasher, self.spec).result()

    async def close(self) -> None:
        """End the helper (after its start, when that is under way)."""
        ready, self._ready = self._ready, None
        if ready is not None:
            with contextlib.suppress(Exception):
                await ready
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def digest(
        self, api: str, parts: list[bytes], rewrite: bool = True
    ) -> tuple[RequestInfo, list[bytes], BodyDigest] | str:
        """The request's info (with an empty ``body``), the pieces to send upstream and
        the digest; when the body is not a JSON object, why not (a key of
        ``wire.UNRECORDED``). Without ``rewrite`` the pieces are ``parts`` as they are
        (``wire.inspect_request``)."""
        loop = asyncio.get_running_loop()
        self.start()
        assert self._ready is not None
        await asyncio.shield(self._ready)
        assert self._pool is not None
        # In memory where the host has it (/dev/shm): the body may carry secrets, which a
        # file on disk would hold until it is overwritten.
        fd, path = tempfile.mkstemp(prefix="agent-replay-body-", dir=_MEMORY_DIR)
        try:
            await loop.run_in_executor(None, _write, fd, parts)
            got = await loop.run_in_executor(self._pool, _digest, api, path, self.spec, rewrite)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if isinstance(got, str):
            return got
        info, out, digest = got
        send = parts if out is None else _spliced(parts) if out == _SPLICE else [out]
        return info, send, digest


_MEMORY_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
"""Where a big body waits for the helper process: tmpfs on Linux, else the temp folder."""


async def pieces(parts: list[bytes]) -> AsyncIterator[bytes]:
    """``parts`` as a request body that aiohttp sends one piece at a time."""
    for p in parts:
        yield p


def _write(fd: int, parts: list[bytes]) -> None:
    with os.fdopen(fd, "wb") as f:
        for p in parts:
            f.write(p)


_SPLICE = b"<splice>"


def _spliced(parts: list[bytes]) -> list[bytes]:
    """``parts`` with the usage option after the opening brace (as ``inspect_request``)."""
    for k, p in enumerate(parts):
        i = p.find(b"{")
        if i >= 0:
            return [*parts[:k], p[: i + 1], _INJECT, p[i + 1 :], *parts[k + 1 :]]
    raise ValueError("no JSON object")


def _background(recorder: int) -> None:
    """In the helper: yield the CPU to the proxy's forwarding (a parse is not urgent; on a
    machine with few cores it would otherwise take a core from the streams), and end with
    the recorder (pid ``recorder``), also when it is killed, even before this ran (the
    helper would otherwise wait for work forever, holding the recorder's stderr open)."""
    with contextlib.suppress(OSError):
        os.nice(10)

    def watch() -> None:
        while os.getppid() == recorder:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="watch-recorder", daemon=True).start()


_hashers: dict[DigestSpec, PromptHasher] = {}


def _hasher(spec: DigestSpec) -> PromptHasher:
    """In the helper: the recorder's ``PromptHasher`` (the tokenizer loaded once)."""
    h = _hashers.get(spec)
    if h is None:
        from agent_replay.replay.record.content import load_tokenizer

        tok = load_tokenizer(spec.tokenizer) if spec.tokenizer else None
        h = _hashers[spec] = PromptHasher(spec.block_size, spec.seed, tok)
    return h


def _digest(
    api: str, path: str, spec: DigestSpec, rewrite: bool = True
) -> tuple[RequestInfo, bytes | None, BodyDigest] | str:
    """In the helper: parse the body in ``path``; the bytes to send are not sent back when
    they are the body as it came (None) or with the usage option spliced in. A body that
    is not a JSON object: why not."""
    import orjson

    from agent_replay.engines.replies import is_reply_item
    from agent_replay.redact import secret_values, strip_secrets
    from agent_replay.replay.record.content import conversation
    from agent_replay.replay.record.gemini import session_items
    from agent_replay.replay.record.sessions import chain_digests
    from agent_replay.replay.record.wire import inspect_request, unrecorded_why

    with open(path, "rb") as f:
        raw = f.read()
    got = inspect_request(api, raw, rewrite=rewrite)
    if got is None:
        return unrecorded_why(raw)
    info, out = got
    body = info.body
    items = session_items(api, conversation(api, body))
    units = dataclasses.replace(_hasher(spec).units(api, body), data=None)  # stays here
    if spec.content == "none":
        units = dataclasses.replace(units, prefix=units.prefix[:0], complete=0)
    digest = BodyDigest(
        items=[it if is_reply_item(it) else _OTHER_ITEM for it in items],
        chains=chain_digests(items),
        units=units,
        content=orjson.dumps(strip_secrets(body)) if spec.content == "full" else None,
        secrets=secret_values(body),
    )
    info = dataclasses.replace(info, body={})
    if out is raw:
        return info, None, digest
    i = raw.index(b"{")
    if info.injected_usage and out == raw[: i + 1] + _INJECT + raw[i + 1 :]:
        return info, _SPLICE, digest
    return info, out, digest
