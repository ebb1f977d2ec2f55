"""The recorder: the proxy, session inference and the part-file sink, with a lifecycle.

    rec = Recorder("http://127.0.0.1:8000", "127.0.0.1:0", "trace-dir")
    await rec.start()          # rec.url is where clients point their base URL
    ...
    await rec.stop()           # waits for open requests, flushes, closes

Times: every interval is a difference of ``time.monotonic_ns()`` readings. The trace's
zero is the arrival of the first recorded request; ``start_wall_ns`` in the metadata is
the wall clock at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hashlib
import io
import ipaddress
import itertools
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pyarrow.parquet as pq
from aiohttp import web

from agent_replay import __version__
from agent_replay.engines.dialects import dialect
from agent_replay.engines.replies import Reply
from agent_replay.errors import InputError
from agent_replay.redact import (
    header_secrets,
    scrub,
    secret_forms,
    secret_values,
    split_userinfo,
    strip_secrets,
)
from agent_replay.replay.record import gemini
from agent_replay.replay.record.agents import MAIN, AgentTracker, Handoffs
from agent_replay.replay.record.arrivals import StampingRunner
from agent_replay.replay.record.bigbody import BigBodies, BodyDigest, DigestSpec
from agent_replay.replay.record.content import PromptHasher, conversation, load_tokenizer
from agent_replay.replay.record.encodings import MAX_DECODED, MAX_RATIO, DecodeLimits
from agent_replay.replay.record.guard import MalformedRequests
from agent_replay.replay.record.observe import ResponseObserver
from agent_replay.replay.record.proxy import Exchange, ProxyHandler, client_gone_middleware
from agent_replay.replay.record.sessions import Assignment, SessionTracker, Turn, chain_digests
from agent_replay.replay.record.sink import ROW_YIELD_GAP_NS, PartWriter, rows_to_table, yield_cpu
from agent_replay.replay.record.spawns import Spawns, argument_text
from agent_replay.replay.record.wire import UNRECORDED
from agent_replay.replay.selfmon import reserve_fds
from agent_replay.traces.io import conform
from agent_replay.traces.schema import CONTENT_MODES, TraceMeta

SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True, slots=True)
class RecordConfig:
    upstream: str
    out_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    content: str = "hashed"
    session_header: str = "X-Session-ID"
    block_size: int = 64
    tokenizer: str | None = None
    hash_seed: int | None = None
    flush_interval_s: float = 2.0
    allow_remote: bool = False
    force: bool = False
    connect_timeout_s: float = 30.0
    read_timeout_s: float | None = 600.0
    drain_timeout_s: float = 10.0
    max_body: int = 32 << 20
    """Largest API request body taken (bytes; larger ones get 413, as LLM APIs answer)."""
    max_decoded: int = MAX_DECODED
    """Largest size an encoded request body may decode to (bytes; else 413)."""
    max_ratio: float = MAX_RATIO
    """Most times its encoded size a request body may decode to (past 1 MiB; else 413)."""
    write_retry_s: float = 10.0
    """At stop, how long a failing final write is retried before the rows are given up."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (loopback)."""
    s = listen.strip()
    if s.isdigit():
        return "127.0.0.1", int(s)
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check(cfg: RecordConfig) -> None:
    if cfg.content not in CONTENT_MODES:
        raise InputError(f"--content {cfg.content!r}: choose one of {', '.join(CONTENT_MODES)}")
    if cfg.block_size < 1:
        raise InputError("--block-size must be >= 1")
    if cfg.flush_interval_s <= 0:
        raise InputError("--flush-interval must be > 0")
    if cfg.max_body < 1:
        raise InputError("--max-body must be >= 1")
    if cfg.max_decoded < 1:
        raise InputError("--max-decoded must be >= 1")
    if not cfg.max_ratio >= 1:
        raise InputError("--max-ratio must be >= 1")
    if cfg.drain_timeout_s < 0:
        raise InputError("--drain-timeout must be >= 0")
    if cfg.write_retry_s < 0:
        raise InputError("--write-retry must be >= 0")
    if not cfg.upstream.startswith(("http://", "https://")):
        raise InputError(f"--upstream {cfg.upstream!r}: expected an http:// or https:// URL")
    if not is_loopback(cfg.host) and not cfg.allow_remote:
        raise InputError(
            f"--listen {cfg.host}: not a loopback address; the recorder would "
            "accept traffic from other machines (pass --allow-remote to mean it)"
        )


@dataclass(slots=True)
class RecorderStats:
    requests: int = 0
    errors: int = 0
    passed_through: int = 0
    sessions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    rows_written: int = 0
    parts: int = 0
    last_flush_ns: int | None = None
    last_part: str | None = None
    unwritten: int = 0
    """Rows of finished requests that a failed flush could not write yet (kept, retried)."""
    write_error: str | None = None
    """Why the last flush failed (None once a flush succeeds again)."""
    malformed: int = 0
    """Requests aiohttp could not parse (answered 400, not recorded)."""
    refused: int = 0
    """API requests the recorder answered 413 itself (over ``--max-body``, or decoding to
    more than ``--max-decoded`` or ``--max-ratio``); each has a row with its error."""
    unrecorded: dict[str, int] = field(default_factory=dict)
    """API requests forwarded but not recorded, by why (``wire.UNRECORDED``: their body
    is not UTF-8, not JSON, or not a JSON object)."""
    last_error: str | None = None
    """Why the last failed request failed (the status line names it)."""


class Recorder:
    """A recording proxy in this process's event loop (see the module text)."""

    def __init__(
        self,
        upstream: str,
        listen: str | tuple[str, int] = "127.0.0.1:0",
        out_dir: str | os.PathLike[str] = "trace",
        **options: Any,
    ) -> None:
        host, port = parse_listen(listen) if isinstance(listen, str) else listen
        # Credentials in the upstream URL go upstream as Basic auth and nowhere else: the
        # config (printed, stored in every part's metadata) keeps the URL without them.
        upstream, self._authorization = split_userinfo(upstream)
        self.config = RecordConfig(
            upstream=upstream, out_dir=Path(out_dir), host=host, port=port, **options
        )
        _check(self.config)
        cfg = self.config
        self.writer = PartWriter(cfg.out_dir, force=cfg.force)
        tok = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        seed = cfg.hash_seed if cfg.hash_seed is not None else secrets.randbits(63)
        self.hasher = PromptHasher(cfg.block_size, seed, tok)
        self._big = BigBodies(
            DigestSpec(cfg.block_size, self.hasher.seed, cfg.tokenizer, cfg.content)
        )
        self._pseudo_key = secrets.token_bytes(16)
        self.tracker = SessionTracker()
        self.agents = AgentTracker()
        self.handoffs = Handoffs()
        self.gemini = gemini.GeminiSubagents()
        self.spawns = Spawns()
        self._root_session: dict[str, str] = {}
        """Child session -> the root session it belongs to (``parent_session`` header)."""
        self.stats = RecorderStats()
        self._pending: list[Exchange] = []
        self._to_assign: list[Exchange] = []
        """Exchanges whose upstream answered, waiting for their session (``_on_headers``)."""
        self._unwritten: list[dict[str, Any]] = []
        """Built rows a failed write left behind; the next flush writes them first."""
        self._told_unrecorded: dict[str, int] = {}
        """``stats.unrecorded`` as the last part file's metadata has it."""
        self._t0: int | None = None
        self._wall0: int | None = None
        self._runner: web.AppRunner | None = None
        self._malformed = MalformedRequests()
        self._client: aiohttp.ClientSession | None = None
        self._handler: ProxyHandler | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._force = asyncio.Event()
        self._port = 0
        self.fd_limit = 0
        """Descriptors reserved at start (``replay.selfmon.reserve_fds``)."""
        self._switch_interval: float | None = None
        self._frozen = False
        self.clock: Callable[[], int] = time.monotonic_ns

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        cfg = self.config
        logging.getLogger("aiohttp.server").addFilter(self._malformed)
        # Every client connection holds two descriptors (client side, upstream side): the
        # default soft limit (1024) would refuse new clients after ~500 open streams.
        self.fd_limit = reserve_fds()
        if not is_loopback(cfg.host):
            print(
                f"agent-replay record: WARNING: listening on {cfg.host}, reachable from "
                "other machines; anyone who can connect can use the upstream through it",
                file=sys.stderr,
            )
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._handler = ProxyHandler(
            cfg.upstream,
            self._client,
            on_headers=self._on_headers,
            on_done=self._on_done,
            read_timeout_s=cfg.read_timeout_s,
            session_header=cfg.session_header,
            clock=self.clock,
            on_arrival=self._on_arrival,
            authorization=self._authorization,
            max_body=cfg.max_body,
            big=self._big,
            limits=DecodeLimits(cfg.max_decoded, cfg.max_ratio),
        )
        app = web.Application(client_max_size=cfg.max_body, middlewares=[client_gone_middleware])
        app.router.add_route("*", "/{tail:.*}", self._handler.handle)
        # stop() waits for open requests itself (drain_timeout_s); aiohttp's own wait on
        # top of it (60 s by default) would make the stop unbounded in practice.
        # auto_decompress=False: a request body reaches the upstream as the client sent it
        # (replay.record.encodings decodes a copy for the recorder).
        self._runner = StampingRunner(
            app,
            clock=self.clock,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=0.5,
            auto_decompress=False,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.host, cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            await self._client.close()
            raise InputError(f"--listen {cfg.host}:{cfg.port}: {exc.strerror or exc}") from None
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self._port = sockets[0].getsockname()[1] if sockets else cfg.port
        # The flush thread holds the GIL while it builds rows; the event loop waits for it
        # up to the interpreter's switch interval (5 ms by default) every time it wakes up
        # meanwhile, which shows as added latency on every stream. Restored by stop().
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        # The first Parquet write pays for lazy initialisation (tens of ms with the GIL
        # held): pay it now, before any client is waiting.
        await asyncio.get_running_loop().run_in_executor(None, _warm_up_writer)
        # Everything built so far (imported modules: pyarrow, numpy, aiohttp...) is moved
        # out of the cyclic collector's reach: a full collection, which stops the loop for
        # as long as it takes to scan every tracked object, then scans only what the
        # recording made. Undone by stop() (what was garbage already is collected then).
        gc.freeze()
        self._frozen = True
        self._big.start()
        self._flusher = asyncio.create_task(self._flush_loop())

    @property
    def in_flight(self) -> int:
        return self._handler.in_flight if self._handler is not None else 0

    def force_stop(self) -> None:
        """Cut the drain of a ``stop()`` under way short (a second Ctrl-C): requests still
        open are cut now and recorded as cut; everything complete is flushed."""
        self._force.set()

    async def stop(self) -> None:
        """Stop listening and taking requests (a new request on a kept-alive connection
        gets 503 and ``Connection: close``), let open requests finish for up to
        ``drain_timeout_s`` (or until ``force_stop``; the rest are cut and recorded as
        such), flush everything, close."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        handler = self._handler
        if handler is not None:
            handler.draining = True
        for site in list(runner.sites):
            await site.stop()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while (
            handler is not None
            and handler.in_flight
            and time.monotonic() < deadline
            and not self._force.is_set()
        ):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._force.wait(), 0.02)
        await runner.cleanup()
        logging.getLogger("aiohttp.server").removeFilter(self._malformed)
        self.stats.malformed = self._malformed.count
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self._final_flush(final=True)
        if self._client is not None:
            await self._client.close()
        await self._big.close()
        if handler is not None:
            handler.decoders.close()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        if self._frozen:
            gc.unfreeze()
            self._frozen = False

    async def _final_flush(self, final: bool = False) -> None:
        """Flush, retrying a failing write for up to ``write_retry_s``; what still cannot
        be written stays counted in ``stats.unwritten`` (the caller exits non-zero)."""
        deadline = time.monotonic() + self.config.write_retry_s
        while True:
            try:
                await self.flush(final=final)
                return
            except FlushError:
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(min(1.0, self.config.flush_interval_s))

    async def __aenter__(self) -> Recorder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- per exchange (on the event loop; cheap) --------------------------------------

    def _on_arrival(self, arrival: int) -> None:
        # Time zero is the first request to arrive (not the first to be answered: answers
        # come back out of order, and an earlier arrival would get a negative time).
        if self._t0 is None:
            self._t0 = arrival
            self._wall0 = time.time_ns() - (self.clock() - arrival)

    def _on_headers(self, ex: Exchange) -> None:
        """The upstream answered: the session assignment is queued, to run once the loop
        is through with what is waiting (the answer's first bytes are forwarded first).
        Queued assignments run in the order they came, and all of them before any
        exchange's end is taken (``_on_done``), so the tracker sees the same sequence of
        assignments and completions as if each ran here."""
        if not self._to_assign:
            asyncio.get_running_loop().call_soon(self._assign_queued)
        self._to_assign.append(ex)

    def _assign_queued(self) -> None:
        queued, self._to_assign = self._to_assign, []
        for ex in queued:
            self._assign(ex)

    def _assign(self, ex: Exchange) -> None:
        self._on_arrival(ex.arrival)  # no-op unless a caller bypassed the handler's hook
        explicit, agent = self._named(ex)
        digest: BodyDigest | None = ex.state.get("digest")
        items: Sequence[Any]
        if digest is not None:
            items, chains = digest.items, digest.chains
        else:
            items, chains = conversation(ex.info.api, ex.info.body), None
        if ex.info.api == gemini.API:  # Gemini CLI's history edits and subagents
            items, chains, explicit, agent = self._gemini_route(ex, items, chains, explicit, agent)
        spawned = None
        if explicit is None and agent is None and digest is None:  # a subagent naming nothing
            spawned = functools.partial(self.spawns.spawner, items, ex.arrival)
        assignment, turn = self.tracker.assign(
            ex.arrival, items, explicit, agent, chains=chains, spawned=spawned
        )
        ex.state["assignment"] = assignment
        ex.state["turn"] = turn
        linked = assignment.how.endswith(("prefix", "reply", "retry"))
        if chains is not None and ex.info.api == gemini.API:
            self.gemini.seen(chains, turn, assignment.parent_index, linked)
        if agent is None and digest is None:
            agent = self._stream_of(ex, assignment, linked, items)
        # a side request (a title): carries no earlier reply and offers no tools
        side = not linked and digest is None and not dialect(ex.info.api).tools(ex.info.body)
        ex.state["placement"] = self.agents.place(
            assignment.session_id,
            assignment.request_index,
            agent,
            ex.arrival,
            assignment.parent_index,
            linked=linked,
            side=side,
        )
        self.stats.sessions = self.tracker.session_count

    def _stream_of(
        self, ex: Exchange, assignment: Assignment, linked: bool, items: Sequence[Any]
    ) -> str | None:
        """The agent stream of a request no header names: a subagent found by its task
        (``replay.record.spawns``), an Agents SDK handoff's agent, or the stream of the turn
        it continues (None: the main agent's)."""
        if assignment.how == "spawn":
            stream = self.spawns.name(assignment.session_id)
            self.handoffs.name(assignment.session_id, assignment.request_index, stream)
            return stream
        stream = self.handoffs.stream(
            assignment.session_id,
            assignment.request_index,
            assignment.parent_index,
            linked,
            dialect(ex.info.api).system(ex.info.body),
            items,
        )
        return None if stream == MAIN else stream

    def _named(self, ex: Exchange) -> tuple[str | None, str | None]:
        """The session and agent stream the request's headers name (None: none)."""
        explicit = self._explicit_session(ex)
        agent = ex.state.get("agent_id")
        parent_session = ex.state.get("parent_session")
        if parent_session and explicit:
            # A child session (an opencode subagent) is a stream of its root session.
            root = self._root_session.get(parent_session, parent_session)
            self._root_session[explicit] = root
            explicit, agent = root, agent or explicit
        return explicit, agent

    def _gemini_route(
        self,
        ex: Exchange,
        items: Sequence[Any],
        chains: list[bytes] | None,
        explicit: str | None,
        agent: str | None,
    ) -> tuple[Sequence[Any], list[bytes], str | None, str | None]:
        """The conversation as session inference compares it, and the session and stream
        of a Gemini CLI subagent's request (``replay.record.gemini``)."""
        if chains is None:  # a big body's digest has them already
            items = gemini.session_items(ex.info.api, items)
            chains = chain_digests(items)
            if explicit is None and agent is None:
                route = self.gemini.route(
                    ex.arrival, chains, dialect(ex.info.api).tools(ex.info.body)
                )
                if route is not None:
                    explicit, agent = route.session_id, route.agent
        return items, chains, explicit, agent

    def _explicit_session(self, ex: Exchange) -> str | None:
        header = ex.state.get("header_session")
        if header:
            return str(header)
        hint = ex.info.session_hint
        if hint is None:
            return None
        if self.config.content == "full":
            return hint
        return (
            "user-"
            + hashlib.blake2b(hint.encode(), digest_size=6, key=self._pseudo_key).hexdigest()
        )

    def _on_done(self, ex: Exchange) -> None:
        self._assign_queued()
        if "assignment" not in ex.state:  # it failed before the upstream answered
            self._assign(ex)
        obs = ex.observer
        turn = ex.state["turn"]
        end = ex.end if ex.end is not None else self.clock()
        ok = obs is not None and ex.error is None
        self.tracker.complete(
            turn, end, _reply_fn(ex.info.api, obs) if ok and obs else None, failed=not ok
        )
        self.agents.complete(
            turn.session_id,
            turn.request_index,
            end,
            (lambda: bool(turn.reply and gemini.hands_back(turn.reply.tool_ids))) if ok else False,
        )
        if ok and obs is not None:
            ex.state["spawn"] = self.spawns.finished(turn.session_id, end, _arguments_fn(obs, turn))
        self._count_done(ex)
        self._pending.append(ex)

    def _count_done(self, ex: Exchange) -> None:
        self.stats.requests += 1
        self.stats.errors += ex.error is not None
        if ex.error is not None:  # without the request's credentials, as in its row
            self.stats.last_error = (self._scrubbed_error(ex) or "")[:160]
        if ex.observer is not None:
            self.stats.bytes_in += ex.observer.bytes_in
            self.stats.bytes_out += ex.observer.bytes_out

    # -- flushing ----------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval_s)
            with contextlib.suppress(FlushError):  # kept and retried; the status line says so
                await self.flush()

    async def flush(self, final: bool = False) -> Path | None:
        """Write the rows of finished requests to a new part file (none when there are
        none). The rows are built and written in a worker thread. Each part's metadata
        holds the count of requests not recorded so far (``stats.unrecorded``); the
        ``final`` flush writes a part without rows when that count is newer than the last
        part's.

        A write that fails (a full disk, say) loses nothing: its rows stay in memory, the
        next flush writes them first, and ``FlushError`` says how many wait. The part file
        is complete or absent (``traces.io.write_trace``)."""
        async with self._flush_lock:
            self._count()
            if (
                not self._pending
                and not self._unwritten
                and not (final and self.stats.unrecorded != self._told_unrecorded)
            ):
                return None
            batch, self._pending = self._pending, []
            meta = self._meta()
            loop = asyncio.get_running_loop()
            write = loop.run_in_executor(None, self._write, batch, meta)
            try:
                path = await asyncio.shield(write)
            except asyncio.CancelledError:
                # stop() cancels the periodic flush: the rows it took from the buffer are
                # being written in the thread; finish that (holding the lock, so the final
                # flush comes after it) before giving up.
                with contextlib.suppress(Exception):
                    await write
                raise
            except Exception as exc:
                first = self.stats.write_error is None
                self.stats.unwritten = len(self._unwritten)
                self.stats.write_error = _describe(exc)
                if first:
                    print(
                        f"agent-replay record: WARNING: cannot write {self.config.out_dir}: "
                        f"{self.stats.write_error}; {self.stats.unwritten} rows kept in "
                        "memory and retried every flush; still proxying",
                        file=sys.stderr,
                        flush=True,
                    )
                raise FlushError(self.stats.unwritten, self.stats.write_error) from exc
            if self.stats.write_error is not None:
                print(
                    f"agent-replay record: writing again; {path.name} holds the rows "
                    "kept since the failure",
                    file=sys.stderr,
                    flush=True,
                )
            self._told_unrecorded = meta.extra["recorder"]["unrecorded"]
            self.stats.unwritten = 0
            self.stats.write_error = None
            self.stats.rows_written = self.writer.rows_written
            self.stats.parts = len(self.writer.parts)
            self.stats.last_flush_ns = self.clock()
            self.stats.last_part = path.name
            if self._handler is not None:
                self.stats.passed_through = self._handler.passed_through
            return path

    def _meta(self) -> TraceMeta:
        cfg = self.config
        return TraceMeta(
            block_size=cfg.block_size,
            source="recorded",
            content_mode=cfg.content,
            tokenizer=cfg.tokenizer,
            start_wall_ns=self._wall0,
            tool_version=__version__,
            extra={
                "recorder": {
                    "upstream": cfg.upstream,
                    "hash_unit": self.hasher.unit,
                    "session_header": cfg.session_header,
                    "unrecorded": dict(self.stats.unrecorded),
                }
            },
        )

    def _count(self) -> None:
        """The handler's counts into ``stats``."""
        h = self._handler
        if h is not None:
            self.stats.refused = h.refused
            self.stats.unrecorded = {k: h.unrecorded[k] for k in UNRECORDED if k in h.unrecorded}

    def _write(self, batch: list[Exchange], meta: TraceMeta) -> Path:
        """Build the batch's rows, then write them with any a failed write left (flush
        thread, under the flush lock). The rows leave memory only once written."""
        for ex in batch:
            self._unwritten.append(self._row(ex))
            Spawns.resolve(ex.state.get("spawn"))  # the events are let go with the exchange
            yield_cpu(ROW_YIELD_GAP_NS)  # the loop, if it waits for this CPU, runs in between
        path = self.writer.write(self._unwritten, meta)
        self._unwritten = []
        return path

    def _row(self, ex: Exchange) -> dict[str, Any]:
        """A trace row (runs in the flush thread)."""
        cfg = self.config
        a = ex.state["assignment"]
        obs: ResponseObserver | None = ex.observer
        turn = ex.state["turn"]
        turn.resolve_reply()
        t0 = self._t0 if self._t0 is not None else ex.arrival
        inp, out, cached = obs.usage() if obs is not None else (None, None, None)
        hash_ids = None
        digest: BodyDigest | None = ex.state.get("digest")
        if ex.info.undecoded is None and (cfg.content != "none" or inp is None):
            ids: Sequence[int] | np.ndarray  # a big body's: an array (BodyDigest.ids)
            if digest is not None:
                ids, est = digest.hash_ids(self.hasher, inp)
            else:
                ids, est = self.hasher.hash_ids(ex.info.api, ex.info.body, inp)
            if cfg.content != "none":
                hash_ids = ids
            if inp is None:
                inp = est
        if inp is None:
            inp = 0  # an undecoded body of a request that got no usage
        times = obs.token_times if obs is not None else []
        counts = obs.token_counts if obs is not None else []
        exact = obs is not None and obs.exact_counts()
        if out is None:
            out = sum(counts)
        gaps = None
        if times:
            gaps = [times[0] - ex.arrival] + [b - a_ for a_, b in itertools.pairwise(times)]
        content = None
        if cfg.content == "full" and ex.info.undecoded is None:
            if digest is not None and digest.content is not None:
                content = digest.content.decode()
            else:
                content = orjson.dumps(strip_secrets(ex.info.body)).decode()
        end = ex.end if ex.end is not None else ex.arrival
        place = ex.state["placement"]
        return {
            "session_id": a.session_id,
            "request_index": a.request_index,
            "parent_index": a.parent_index,
            "agent_id": place.agent_id,
            "depends_on": place.depends_on,
            "arrival_ns": ex.arrival - t0,
            "think_ns": place.think_ns,  # None without dependencies (a title, a first turn)
            "input_tokens": int(inp),
            "output_tokens": int(out),
            "cached_tokens": cached,
            "hash_ids": hash_ids,
            "api": ex.info.api,
            "model": ex.info.model,
            "ttft_ns": times[0] - ex.arrival if times else None,
            "end_ns": end - ex.arrival,
            "chunk_gaps_ns": gaps,
            "chunk_tokens": list(counts) if (times and exact) else None,
            "content": content,
            "error": self._scrubbed_error(ex),
            "http_status": obs.status if obs is not None else ex.state.get("status", 0),
            "stream": obs.streamed if obs is not None else ex.info.stream,
            "upstream_send_ns": ex.send - ex.arrival if ex.send else None,
            "headers_ns": ex.headers - ex.arrival if ex.headers is not None else None,
            "exact_chunk_tokens": exact if times else None,
            "undecoded_body": ex.info.undecoded,
        }

    def _scrubbed_error(self, ex: Exchange) -> str | None:
        """The error text without the request's own credentials (an upstream may echo
        the key it refused)."""
        if not ex.error:
            return ex.error
        digest: BodyDigest | None = ex.state.get("digest")
        headers = ex.state.get("headers")
        secrets = [
            *(header_secrets(headers.items()) if headers is not None else ()),
            *secret_forms(digest.secrets if digest is not None else secret_values(ex.info.body)),
        ]
        if self._authorization is not None:
            secrets.extend(header_secrets([("authorization", self._authorization)]))
        return scrub(ex.error, secrets)

    # -- status ------------------------------------------------------------------------

    def status_line(self) -> str:
        s = self.stats
        if s.last_flush_ns is None:
            flush = "no flush yet"
        else:
            flush = f"last flush {s.last_part} {(self.clock() - s.last_flush_ns) / 1e9:.1f} s ago"
        failed = f"{s.errors} failed" + (
            f", last: {s.last_error}" if s.errors and s.last_error else ""
        )
        line = (
            f"recorded {s.requests} requests ({failed}), {s.sessions} sessions, "
            f"{_mb(s.bytes_out)} to clients, {s.rows_written} rows in {s.parts} parts, "
            f"{flush}"
        )
        malformed = max(s.malformed, self._malformed.count)
        if malformed:
            line += f", {malformed} malformed requests refused (400)"
        self._count()
        if s.refused:
            line += f", {s.refused} refused (413)"
        if s.unrecorded:
            line += (
                f", {sum(s.unrecorded.values())} forwarded but not recorded ("
                + ", ".join(f"{UNRECORDED[k]}: {n}" for k, n in s.unrecorded.items())
                + ")"
            )
        if s.write_error is not None:
            line += f"; WARNING: {s.unwritten} rows NOT written ({s.write_error})"
        return line


class FlushError(Exception):
    """A flush could not write its part file; its rows are kept for the next one."""

    def __init__(self, unwritten: int, reason: str) -> None:
        super().__init__(f"{unwritten} rows not written: {reason}")
        self.unwritten = unwritten
        self.reason = reason


def _describe(exc: BaseException) -> str:
    code = exc.errno if isinstance(exc, OSError) else None
    if not code:  # pyarrow's OSError carries the errno only in its text
        m = re.search(r"\[errno (\d+)\]", str(exc))
        code = int(m.group(1)) if m else None
    if code:
        return f"{os.strerror(code)} (errno {code})"
    return f"{type(exc).__name__}: {exc}"[:200]


def _warm_up_writer() -> None:
    """Write a one-row part to memory, as ``PartWriter`` would to a file."""
    table = rows_to_table(
        [
            {
                "session_id": "warm-up",
                "request_index": 0,
                "parent_index": -1,
                "arrival_ns": 0,
                "input_tokens": 1,
                "output_tokens": 1,
                "api": "chat",
                "chunk_gaps_ns": [1],
                "chunk_tokens": [1],
                "hash_ids": [1],
            }
        ]
    )
    pq.write_table(conform(table), io.BytesIO(), compression="zstd")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _arguments_fn(obs: ResponseObserver, turn: Turn) -> Callable[[], str]:
    """The tool-call arguments of a reply that called tools (``replay.record.spawns``)."""

    def fn() -> str:
        if not (turn.reply and turn.reply.tool_ids):
            return ""
        return argument_text(obs.events, None if obs.streamed else obs.json_body())

    return fn


def _reply_fn(api: str, obs: ResponseObserver) -> Callable[[], Reply | None]:
    def fn() -> Reply | None:
        if obs.streamed:
            return dialect(api).reply_from_events(obs.events)
        return dialect(api).reply_from_json(obs.json_body())

    return fn
