"""Where the engine loop delivers each request's tokens: a live SSE stream or a buffer.

The engine loop calls ``emit`` at each step's deadline for every request that got tokens.
A stream sink encodes the chunk and writes it straight to the socket (HTTP/1.1 chunked
framing, one ``transport.write`` per step and stream), then takes ``time.monotonic_ns()``
for the ground truth. Faults (faults.py) are applied here.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any, Protocol

from agent_replay.engines.sim.core import EngineCore, SimRequest
from agent_replay.engines.sim.faults import FaultSpec
from agent_replay.engines.sim.ground_truth import GroundTruthRecorder

_LINGER_RST = struct.pack("ii", 1, 0)


class Encoder(Protocol):
    def chunk(self, ids: list[int], finish: str | None) -> bytes: ...

    def final(self, cached: int | None, finish: str | None = None) -> bytes: ...


class BaseSink:
    __slots__ = (
        "api",
        "chunk_ns",
        "chunk_sched",
        "chunk_tokens",
        "core",
        "done",
        "fault",
        "first_byte_ns",
        "gt",
        "received_ns",
        "req",
        "request_id",
        "show_cached",
    )

    def __init__(
        self,
        *,
        core: EngineCore,
        api: str,
        request_id: str,
        received_ns: int,
        fault: FaultSpec,
        gt: GroundTruthRecorder | None,
        show_cached: bool,
        first_byte_ns: int | None = None,
    ) -> None:
        self.core = core
        self.api = api
        self.request_id = request_id
        self.received_ns = received_ns
        self.first_byte_ns = received_ns if first_byte_ns is None else first_byte_ns
        self.fault = fault
        self.gt = gt
        self.show_cached = show_cached
        self.req: SimRequest | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.chunk_ns: list[int] = []
        self.chunk_sched: list[int] = []
        self.chunk_tokens: list[int] = []

    def cached(self) -> int | None:
        if not self.show_cached or self.req is None:
            return None
        return max(0, self.req.cached_tokens)

    def _finish(self) -> None:
        req = self.req
        if self.gt is not None and req is not None:
            self.gt.add(
                request_id=self.request_id,
                api=self.api,
                received_ns=self.received_ns,
                first_byte_ns=self.first_byte_ns,
                prompt_tokens=req.prompt_len,
                cached_tokens=req.cached_tokens,
                finish_reason=req.finish_reason,
                chunk_ns=self.chunk_ns,
                chunk_scheduled_ns=self.chunk_sched,
                chunk_tokens=self.chunk_tokens,
            )
        if not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        if self.req is not None:
            self.core.abort(self.req)
        self._finish()


class StreamSink(BaseSink):
    """Writes SSE chunks directly to the connection's transport."""

    __slots__ = (
        "encoder",
        "killed",
        "next_data",
        "next_finish",
        "next_framed",
        "next_tokens",
        "pending",
        "ready",
        "transport",
    )

    def __init__(self, *, transport: asyncio.Transport | None, encoder: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.transport = transport
        self.encoder = encoder
        self.ready = False  # headers not yet written: buffer chunks until they are
        self.pending: list[bytes] = []
        self.killed = False
        self.next_data = b""
        self.next_framed = b""
        self.next_tokens = 0
        self.next_finish: str | None = None

    def set_ready(self) -> None:
        self.ready = True
        if self.pending and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.pending))
        self.pending.clear()

    def prepare(self, ids: list[int], finish: str | None) -> None:
        """Encode and frame the chunk of the coming step ahead of its deadline."""
        if self.fault.lies:
            self._prepare_lie(ids, finish)
            return
        data = self.encoder.chunk(ids, finish)
        if finish is not None:
            data += self.encoder.final(self.cached(), finish)
        self.next_data = data
        self.next_framed = b"%x\r\n%b\r\n" % (len(data), data)
        self.next_tokens = len(ids)
        self.next_finish = finish

    def _prepare_lie(self, ids: list[int], finish: str | None) -> None:
        """``prepare`` for a lying answer: no tokens (``empty``: nothing written before the
        end) or a final usage of ``usage_scale`` times the tokens sent."""
        f = self.fault
        shown = [] if f.empty else ids
        if f.empty and finish is None:
            self.next_data = self.next_framed = b""
        else:
            data = self.encoder.chunk(shown, finish)
            if finish is not None:
                enc = self.encoder
                enc.completion_tokens = round(enc.completion_tokens * f.usage_scale)
                data += enc.final(self.cached(), finish)
            self.next_data = data
            self.next_framed = b"%x\r\n%b\r\n" % (len(data), data)
        self.next_tokens = len(shown)
        self.next_finish = finish

    def flush(self, sched_ns: int) -> None:
        """Write the prepared chunk (at the step's deadline): one ``transport.write``."""
        tr = self.transport
        if tr is None or tr.is_closing():
            self.abort()
            return
        if self.fault.any_stream_fault and self._fault(tr, self.next_data, sched_ns):
            return
        if self.ready:
            tr.write(self.next_framed)
        else:
            self.pending.append(self.next_framed)
        self.chunk_ns.append(time.monotonic_ns())
        self.chunk_sched.append(sched_ns)
        self.chunk_tokens.append(self.next_tokens)
        if self.next_finish is not None:
            self._finish()
        elif self.fault.stall_after == len(self.chunk_ns) and self.req is not None:
            self.req.stall_until_ns = sched_ns + int(self.fault.stall_ms * 1e6)

    def emit(self, ids: list[int], finish: str | None, sched_ns: int) -> None:
        self.prepare(ids, finish)
        self.flush(sched_ns)

    def _fault(self, tr: asyncio.Transport, data: bytes, sched_ns: int) -> bool:
        """Apply stream faults before chunk number len(chunk_ns)+1; True when the stream died."""
        f = self.fault
        n = len(self.chunk_ns)
        if f.reset_after == n:
            sock = tr.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                except OSError:
                    pass
            tr.abort()
            self._kill()
            return True
        if f.truncate_after == n:
            half = data[: max(1, len(data) // 2)]
            tr.write(b"%x\r\n%b\r\n" % (len(half), half))
            tr.close()
            self._kill()
            return True
        if f.malformed_after == n:
            bad = b'data: {"id":"malformed","choices":[{"index":0,"text":\n\n'
            tr.write(b"%x\r\n%b\r\n" % (len(bad), bad))
        return False

    def _kill(self) -> None:
        self.killed = True
        self.abort()


class BufferSink(BaseSink):
    """Collects all tokens of a non-streaming request."""

    __slots__ = ("_n", "finish_reason", "ids")

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.ids: list[int] = []
        self._n = 0
        self.finish_reason: str | None = None

    def prepare(self, ids: list[int], finish: str | None) -> None:
        self.ids.extend(ids)
        self._n = len(ids)
        self.finish_reason = finish

    def flush(self, sched_ns: int) -> None:
        self.chunk_ns.append(time.monotonic_ns())
        self.chunk_sched.append(sched_ns)
        self.chunk_tokens.append(self._n)
        if self.finish_reason is not None:
            self._finish()

    def emit(self, ids: list[int], finish: str | None, sched_ns: int) -> None:
        self.prepare(ids, finish)
        self.flush(sched_ns)
