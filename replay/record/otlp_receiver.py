"""An OTLP/HTTP receiver that records a trace from the telemetry an agent already exports:
no proxy in the request path. Point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at it.

``POST /v1/traces`` and ``POST /v1/logs`` take export requests in JSON (and in protobuf
when the ``otlp`` extra, ``opentelemetry-proto``, is installed); ``/v1/metrics`` is
accepted and dropped. Each export that parses is appended, as one line, to
``TRACE_DIR/otlp-exports.jsonl`` (the Collector's file-exporter layout, which ``traces
import`` reads) and fed to the importer's collector (``traces.importers.otel``). Every
flush interval that saw new data, and at stop, the trace of everything received so far is
written to ``TRACE_DIR/part-00001.parquet`` (temporary file, then rename: a reader never
sees half a file). So a Ctrl-C loses nothing received, and a kill loses at most the last
interval of the Parquet file and nothing of the export lines.

A body that is not an export request gets 400 with the reason; one over the size limit
413; a protobuf body without the extra 415 naming it. Listens on loopback unless told.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from agent_replay.errors import InputError
from agent_replay.replay.record.content import PromptHasher
from agent_replay.replay.record.recorder import is_loopback, parse_listen
from agent_replay.replay.record.sink import PartWriter
from agent_replay.traces.importers.otel import BLOCK_SIZE, Collector, result
from agent_replay.traces.io import write_trace
from agent_replay.traces.otlp import log_records, spans

EXPORTS_FILE = "otlp-exports.jsonl"
PART = "part-00001.parquet"
CODINGS = ("identity", "gzip", "deflate")
"""Content codings a body may come in (those OTLP exporters send), inflated here."""
SIGNALS = {
    "/v1/traces": "resourceSpans",
    "/v1/logs": "resourceLogs",
    "/v1/metrics": "resourceMetrics",
}


@dataclass
class ReceiverStats:
    exports: int = 0
    rejected: int = 0
    rows: int = 0
    writes: int = 0
    last_error: str | None = None
    write_error: str | None = None
    problems: int = 0


@dataclass
class OtlpReceiver:
    """The receiver; ``start``/``stop`` in a running event loop."""

    listen: str | tuple[str, int]
    out_dir: Path
    block_size: int = BLOCK_SIZE
    flush_interval_s: float = 2.0
    max_body: int = 32 << 20
    allow_remote: bool = False
    force: bool = False
    stats: ReceiverStats = field(default_factory=ReceiverStats)

    def __post_init__(self) -> None:
        self.host, self.port = (
            parse_listen(self.listen) if isinstance(self.listen, str) else self.listen
        )
        if not is_loopback(self.host) and not self.allow_remote:
            raise InputError(
                f"--listen {self.host}: not a loopback address; the receiver "
                "would accept telemetry from other machines (pass "
                "--allow-remote to mean it)"
            )
        if self.block_size < 1 or self.flush_interval_s <= 0 or self.max_body < 1:
            raise InputError("--block-size, --flush-interval and --max-body must be > 0")
        self.out_dir = Path(self.out_dir)
        exports = self.out_dir / EXPORTS_FILE
        if exports.exists() and not self.force:
            raise InputError(
                f"{exports}: exists (a previous recording); pass --force to "
                "replace it, or choose another folder"
            )
        self.writer = PartWriter(self.out_dir, force=self.force)  # refuses a used folder
        self._spool = exports.open("wb")
        self.collector = Collector()
        self._seed = secrets.randbits(63)
        self._dirty = False
        self._runner: web.AppRunner | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body)
        for path in SIGNALS:
            app.router.add_post(path, self._handle)
        # bodies inflated here (``inflate``), bounded, with OTLP's error replies
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        self._flusher = asyncio.create_task(self._flush_loop())

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # no new exports; those in flight finish
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        await self.flush()
        self._spool.close()

    async def _handle(self, request: web.Request) -> web.Response:
        key = SIGNALS[request.path]
        body, code, why = await self._body(request)
        export = None
        if body is not None:
            export, why = _decode(key, request.content_type, body)
            code = 415 if why.startswith(("unsupported", "protobuf")) else 400
        if export is None:
            self.stats.rejected += 1
            self.stats.last_error = why
            return _status(code, why, request.content_type == "application/x-protobuf")
        if key != "resourceMetrics":
            line = orjson.dumps(export) + b"\n"
            async with self._lock:
                self._spool.write(line)
                self._spool.flush()
                before = self.collector.n_problems
                self.collector.add(export, f"export {self.stats.exports + 1}")
                self.stats.problems += self.collector.n_problems - before
                self._dirty = True
        self.stats.exports += 1
        if request.content_type == "application/x-protobuf":
            return web.Response(body=b"", content_type="application/x-protobuf")
        return web.Response(body=b"{}", content_type="application/json")

    async def _body(self, request: web.Request) -> tuple[bytes | None, int, str]:
        """The decoded body, or None with the status and reason: over the size limit
        (declared, sent, or once inflated: a small compressed body that inflates past it),
        a content coding other than gzip and deflate, a compressed body that does not
        inflate."""
        coding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if coding not in CODINGS:
            return None, 415, f"unsupported Content-Encoding {coding!r}: send gzip or none"
        if (request.content_length or 0) > self.max_body:
            return None, 413, self._limit_line()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None, 413, self._limit_line()
        if coding == "identity":
            return body, 200, ""
        return inflate(body, coding, self.max_body, self._limit_line())

    def _limit_line(self) -> str:
        return f"export over the {self.max_body:,}-byte limit (--max-body)"

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Write the trace of everything received, when something new came."""
        async with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            try:
                os.fsync(self._spool.fileno())
            except OSError:
                pass
            try:  # in a thread: the loop goes on accepting (exports wait for the lock)
                res = await asyncio.to_thread(
                    result,
                    self.collector,
                    self.block_size,
                    [EXPORTS_FILE],
                    str(self.out_dir / EXPORTS_FILE),
                    lambda bs: PromptHasher(bs, self._seed),
                )
            except InputError:
                return  # nothing that makes a request yet
            res.meta.extra["receiver"] = {"listen": self.url}
            try:
                await asyncio.to_thread(
                    write_trace, res.table, self.out_dir / PART, res.meta, force=True
                )
            except OSError as exc:
                self.stats.write_error = str(exc)
                self._dirty = True
                return
            self.stats.rows = res.table.num_rows
            self.stats.writes += 1

    def status_line(self) -> str:
        s = self.stats
        line = (
            f"{s.exports:,} exports, {s.rows:,} requests written, {s.rejected:,} "
            f"rejected, {s.problems:,} spans skipped"
        )
        if s.write_error:
            line += f"; WRITE FAILING: {s.write_error}"
        return line


def inflate(body: bytes, coding: str, limit: int, over: str) -> tuple[bytes | None, int, str]:
    """A gzip or deflate (zlib, or raw as some clients send it) body inflated, at most
    ``limit`` bytes of it ever held: past that, None and 413 with the line ``over``; a
    body that does not inflate or ends early, None and 400 with why."""
    wbits = 31 if coding == "gzip" else (15 if body[:1] and body[0] & 0x0F == 8 else -15)
    d = zlib.decompressobj(wbits)
    out = bytearray()
    data = body
    try:
        while data and not d.eof:
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                return None, 413, over
            data = d.unconsumed_tail
        out += d.flush()
    except zlib.error as exc:
        return None, 400, f"body not decodable as Content-Encoding {coding}: {exc}"
    if not d.eof:
        return (
            None,
            400,
            f"body not decodable as Content-Encoding {coding}: it ends early "
            f"({len(body):,} bytes sent)",
        )
    return bytes(out), 200, ""


def _status(code: int, message: str, proto: bool = False) -> web.Response:
    """An OTLP error: a ``google.rpc.Status`` in the request's encoding (protobuf for a
    protobuf export, else JSON)."""
    grpc = {400: 3, 413: 8, 415: 3}.get(code, 2)
    if proto:
        return web.Response(
            status=code, body=status_protobuf(grpc, message), content_type="application/x-protobuf"
        )
    return web.Response(
        status=code,
        body=orjson.dumps({"code": grpc, "message": message}),
        content_type="application/json",
    )


def status_protobuf(code: int, message: str) -> bytes:
    """``google.rpc.Status{code, message}`` in protobuf's wire format (field 1 a varint,
    field 2 a length-delimited string): two fields need no protobuf library."""
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _from_json(key: str, body: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc}"
    return _checked(key, obj)


def _checked(key: str, obj: Any) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(obj, dict):
        return None, f"not an export request: a JSON {type(obj).__name__}, not an object"
    other = [k for k in obj if k != key]
    if other or not isinstance(obj.get(key, []), list):
        return (
            None,
            f'not an export request for this path: expected {{"{key}": [...]}}, '
            f"got keys {sorted(obj)}",
        )
    return obj, ""


def _decode(key: str, ctype: str, body: bytes) -> tuple[dict[str, Any] | None, str]:
    """The export request of a body of Content-Type ``ctype``, or None and why not."""
    if ctype == "application/x-protobuf":
        return _from_protobuf(key, body)
    if ctype in ("application/json", "text/plain", ""):
        return _from_json(key, body)
    return (
        None,
        f"unsupported Content-Type {ctype!r}: send application/json or application/x-protobuf",
    )


def _proto_class(key: str) -> Any:
    """The protobuf message class of an export request, or None without the extra."""
    try:
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError:
        return None
    classes: dict[str, Any] = {
        "resourceSpans": trace_service_pb2.ExportTraceServiceRequest,
        "resourceLogs": logs_service_pb2.ExportLogsServiceRequest,
        "resourceMetrics": metrics_service_pb2.ExportMetricsServiceRequest,
    }
    return classes[key]


def _from_protobuf(key: str, body: bytes) -> tuple[dict[str, Any] | None, str]:
    cls = _proto_class(key)
    if cls is None:
        return (
            None,
            "protobuf exports need the otlp extra (pip install "
            "'agent-replay[otlp]'); or set OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
        )
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        return None, f"not a protobuf {cls.__name__}: {exc}"
    obj = MessageToDict(msg)
    for item, fields in _id_fields(obj):
        for f in fields:
            if isinstance(item.get(f), str):  # protobuf JSON writes bytes in base64; OTLP, hex
                item[f] = base64.b64decode(item[f]).hex()
    return _checked(key, obj)


def _id_fields(obj: dict[str, Any]) -> Iterator[tuple[dict[str, Any], tuple[str, ...]]]:
    """Each span and log record of a decoded export with its id fields."""
    for _, sp in spans(obj):
        yield sp, ("traceId", "spanId", "parentSpanId")
    for _, rec in log_records(obj):
        yield rec, ("traceId", "spanId")
