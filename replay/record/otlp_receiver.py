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

EXPORTS_FILE = "otlp-exports.jsonl"
PART = "part-00001.parquet"
SIGNALS = {"/v1/traces": "resourceSpans", "/v1/logs": "resourceLogs",
           "/v1/metrics": "resourceMetrics"}


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
        self.host, self.port = parse_listen(self.listen) if isinstance(self.listen, str) \
            else self.listen
        if not is_loopback(self.host) and not self.allow_remote:
            raise InputError(f"--listen {self.host}: not a loopback address; the receiver "
                             "would accept telemetry from other machines (pass "
                             "--allow-remote to mean it)")
        if self.block_size < 1 or self.flush_interval_s <= 0 or self.max_body < 1:
            raise InputError("--block-size, --flush-interval and --max-body must be > 0")
        self.out_dir = Path(self.out_dir)
        exports = self.out_dir / EXPORTS_FILE
        if exports.exists() and not self.force:
            raise InputError(f"{exports}: exists (a previous recording); pass --force to "
                             "replace it, or choose another folder")
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
        self._runner = web.AppRunner(app, access_log=None)
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
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.stats.rejected += 1
            return _status(413, f"export over the {self.max_body:,}-byte limit (--max-body)")
        ctype = request.content_type
        if ctype == "application/x-protobuf":
            export, why = _from_protobuf(key, body)
        elif ctype in ("application/json", "text/plain", ""):
            export, why = _from_json(key, body)
        else:
            export, why = None, f"unsupported Content-Type {ctype!r}: send application/json " \
                                "or application/x-protobuf"
        if export is None:
            self.stats.rejected += 1
            self.stats.last_error = why
            code = 415 if why.startswith(("unsupported", "protobuf")) else 400
            return _status(code, why)
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
        ok = b"{}"
        if ctype == "application/x-protobuf":
            return web.Response(body=b"", content_type="application/x-protobuf")
        return web.Response(body=ok, content_type="application/json")

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
                    result, self.collector, self.block_size, [EXPORTS_FILE],
                    str(self.out_dir / EXPORTS_FILE), lambda bs: PromptHasher(bs, self._seed))
            except InputError:
                return  # nothing that makes a request yet
            res.meta.extra["receiver"] = {"listen": self.url}
            try:
                await asyncio.to_thread(write_trace, res.table, self.out_dir / PART, res.meta,
                                        force=True)
            except OSError as exc:
                self.stats.write_error = str(exc)
                self._dirty = True
                return
            self.stats.rows = res.table.num_rows
            self.stats.writes += 1

    def status_line(self) -> str:
        s = self.stats
        line = (f"{s.exports:,} exports, {s.rows:,} requests written, {s.rejected:,} "
                f"rejected, {s.problems:,} spans skipped")
        if s.write_error:
            line += f"; WRITE FAILING: {s.write_error}"
        return line


def _status(code: int, message: str) -> web.Response:
    """An OTLP error: a ``google.rpc.Status`` in JSON."""
    grpc = {400: 3, 413: 8, 415: 3}.get(code, 2)
    return web.Response(status=code, body=orjson.dumps({"code": grpc, "message": message}),
                        content_type="application/json")


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
        return None, f"not an export request for this path: expected {{\"{key}\": [...]}}, " \
                     f"got keys {sorted(obj)}"
    return obj, ""


_PROTO: dict[str, Any] = {}


def _from_protobuf(key: str, body: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError:
        return None, "protobuf exports need the otlp extra (pip install " \
                     "'agent-replay[otlp]'); or set OTEL_EXPORTER_OTLP_PROTOCOL=http/json"
    classes: dict[str, Any] = {
        "resourceSpans": trace_service_pb2.ExportTraceServiceRequest,
        "resourceLogs": logs_service_pb2.ExportLogsServiceRequest,
        "resourceMetrics": metrics_service_pb2.ExportMetricsServiceRequest}
    cls = classes[key]
    msg = cls()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        return None, f"not a protobuf {cls.__name__}: {exc}"
    obj = MessageToDict(msg)
    for _, sp in _walk_spans(obj):
        for f in ("traceId", "spanId", "parentSpanId"):
            if isinstance(sp.get(f), str):  # protobuf JSON writes bytes in base64; OTLP, hex
                sp[f] = base64.b64decode(sp[f]).hex()
    for rl in obj.get("resourceLogs") or ():
        for sl in rl.get("scopeLogs") or ():
            for rec in sl.get("logRecords") or ():
                for f in ("traceId", "spanId"):
                    if isinstance(rec.get(f), str):
                        rec[f] = base64.b64decode(rec[f]).hex()
    return _checked(key, obj)


def _walk_spans(obj: dict[str, Any]) -> Any:
    for rs in obj.get("resourceSpans") or ():
        for ss in rs.get("scopeSpans") or ():
            for sp in ss.get("spans") or ():
                yield rs, sp
