"""The simulated engine as an aiohttp server speaking vLLM's OpenAI-compatible dialect.

One engine loop task runs the core's steps on their own schedule: each step has an absolute
deadline (start + modelled duration); the loop sleeps to ``deadline - spin_ns``, then yields
to the event loop until ``time.monotonic_ns()`` reaches the deadline, then writes every
stream's chunk. The next step starts at this deadline (not at "now"), so write costs do not
accumulate into drift; if the loop falls more than ``rebase_ns`` behind, it restarts the
schedule from now and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web, web_protocol, web_server
from prometheus_client import generate_latest

from agent_replay.engines import kstamp
from agent_replay.engines.sim import wire
from agent_replay.engines.sim.apis import SIM_APIS, SimApi, openai_error
from agent_replay.engines.sim.core import EngineCore, QueueFullError, SimRequest, request_seed
from agent_replay.engines.sim.faults import FaultSpec, parse_faults
from agent_replay.engines.sim.ground_truth import GroundTruthRecorder
from agent_replay.engines.sim.metrics import make_registry
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.engines.sim.requests import (
    BadRequest,
    ParsedRequest,
    ToolCallSpec,
    plan_tool_call,
)
from agent_replay.engines.sim.sinks import BaseSink, BufferSink, StreamSink
from agent_replay.engines.sim.stats import LATE_WRITE_NS
from agent_replay.engines.sim.tokenizer import SimTokenizer
from agent_replay.errors import InputError

log = logging.getLogger("agent_replay.engines.sim")
_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"


class SimServer:
    """The simulated engine, in this process's event loop. Use ``async with`` or start/stop."""

    def __init__(
        self,
        profile: SimProfile | str = "fast",
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        ground_truth: str | Path | None = None,
        *,
        force: bool = False,
        reuse_port: bool = False,
        engine_index: int = 0,
        kernel_arrival: bool = False,
        api_key: str | None = None,
        tool_call: ToolCallSpec | str | Sequence[ToolCallSpec | str] | None = None,
    ) -> None:
        self.profile = SimProfile.load(profile) if isinstance(profile, str) else profile
        self.api_key = api_key
        """When set, every request but /health must carry it (``Authorization: Bearer KEY``
        or ``x-api-key: KEY``), else 401: a protected endpoint, for tests."""
        calls = (
            []
            if tool_call is None
            else [tool_call]
            if isinstance(tool_call, (str, ToolCallSpec))
            else list(tool_call)
        )
        self.tool_calls = tuple(ToolCallSpec.parse(c) if isinstance(c, str) else c for c in calls)
        """Answer requests that offer one of these tools, on a user's turn, with a call of
        the first one offered."""
        self.kernel_arrival = kernel_arrival
        """With ground truth: each request's ``first_byte_ns`` from the kernel's receive stamp
        (``_StampedListener``; the engine then reads and writes through ``engines.kstamp``'s
        Python transport instead of uvloop's), instead of when the loop first read it."""
        self.host = host
        self.port = port
        self.seed = seed
        self.reuse_port = reuse_port
        self.engine_index = engine_index
        self.tokenizer = SimTokenizer(self.profile.vocab_size)
        self.table = wire.TokenTable(self.tokenizer.texts())
        self.core = EngineCore(self.profile)
        self.gt = GroundTruthRecorder(ground_truth, force=force) if ground_truth else None
        self.base_faults = parse_faults(
            self.profile.faults, source=f"profile {self.profile.name} faults"
        )
        self._counter = itertools.count()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._listener: _StampedListener | None = None
        self._sinks: set[BaseSink] = set()
        self.created = int(time.time())
        self.registry = make_registry(self.core, self.profile.model_name, str(engine_index))

    # lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def make_app(self) -> web.Application:
        middlewares = [_key_check(self.api_key)] if self.api_key else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        for api in SIM_APIS.values():
            # a model named in the path may hold a slash (org/name)
            r.add_post(
                api.dialect.route.replace("{model}", "{model:[^{}]+}"), self._generate_handler(api)
            )
        r.add_post("/v1/messages/count_tokens", self.handle_count_tokens)
        r.add_get("/v1/models", self.handle_models)
        r.add_get("/health", self.handle_health)
        r.add_get("/metrics", self.handle_metrics)
        r.add_get("/version", self.handle_version)
        r.add_post("/tokenize", self.handle_tokenize)
        r.add_post("/detokenize", self.handle_detokenize)
        r.add_post("/reset_prefix_cache", self.handle_reset_prefix_cache)
        return app

    async def start(self) -> SimServer:
        self._wake = asyncio.Event()
        self._runner = web.AppRunner(
            self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        factory = self._runner.server
        if type(factory) is web_server.Server:
            factory.__class__ = _StampingServer
        if (
            self.kernel_arrival
            and self.gt is not None
            and factory is not None
            and kstamp.supported()
        ):
            self._listener = _StampedListener(factory, self.host, self.port, self.reuse_port)
            self.port = self._listener.port
        else:
            site = web.TCPSite(
                self._runner, self.host, self.port, reuse_port=self.reuse_port or None, backlog=1024
            )
            try:
                await site.start()
            except OSError as exc:
                await self._runner.cleanup()
                raise InputError(
                    f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"
                ) from None
            server = site._server
            if self.port == 0 and server is not None:
                sockets = getattr(server, "sockets", None) or []
                if sockets:
                    self.port = sockets[0].getsockname()[1]
        self._loop_task = asyncio.get_running_loop().create_task(self._engine_loop())
        return self

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for sink in list(self._sinks):
            sink.abort()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.gt is not None:
            self.gt.write()

    async def __aenter__(self) -> SimServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # the engine loop ----------------------------------------------------------------------

    async def _engine_loop(self) -> None:
        core = self.core
        wake = self._wake
        assert wake is not None
        rebase = self.profile.rebase_ns
        next_start: int | None = None
        last_end = 0
        while True:
            if not core.has_work():
                wake.clear()
                await wake.wait()
                next_start = None
                continue
            now = time.monotonic_ns()
            if next_start is None:
                # an idle engine starts the step when the request arrived, not when this
                # loop got around to it (parsing and the wake-up are not the model's time)
                start = min(now, core.earliest_arrival_ns(now))
                start = max(start, last_end)
            elif now - next_start > rebase:
                core.stats.schedule_rebases += 1
                start = now
            else:
                start = next_start
            res = core.step(start)
            if res is None:
                wake.clear()
                wakeup = core.next_wakeup_ns()
                timeout = None if wakeup is None else max(0, wakeup - now) / 1e9
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
                next_start = None
                continue
            # encode every chunk before the deadline, so that only the writes remain after it
            sinks = []
            for em in res.emissions:
                sink = em.request.sink
                try:
                    sink.prepare(em.token_ids, em.finish_reason)
                    sinks.append(sink)
                except Exception:  # one broken stream must not stop the engine
                    log.exception("sim: encoding request %s failed", em.request.request_id)
                    sink.abort()
            end = res.end_ns
            await self._sleep_until(end)
            for sink in sinks:
                if sink.req.aborted:
                    continue
                try:
                    sink.flush(end)
                except Exception:
                    log.exception("sim: writing request %s failed", sink.request_id)
                    sink.abort()
            if sinks:
                self._count_lag(time.monotonic_ns() - end)
            next_start = last_end = end

    def _count_lag(self, lag_ns: int) -> None:
        """The self-check of ``stats.schedule_warning``: how late a step's last write was."""
        st = self.core.stats
        st.written_steps += 1
        if lag_ns > LATE_WRITE_NS:
            st.late_steps += 1
        if lag_ns > st.max_write_lag_ns:
            st.max_write_lag_ns = lag_ns

    async def _sleep_until(self, deadline: int) -> None:
        spin = self.profile.spin_ns
        while True:
            rem = deadline - time.monotonic_ns()
            if rem <= 0:
                return
            if rem > spin:
                await asyncio.sleep((rem - spin) / 1e9)
            else:
                await asyncio.sleep(0)

    # generation endpoints -----------------------------------------------------------------

    def _generate_handler(
        self, api: SimApi
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._generate(request, api)

        return handle

    def _error(self, api: SimApi | None, exc: BadRequest) -> web.Response:
        """The error answer in ``api``'s shape (OpenAI's for the other endpoints)."""
        body = api.error(exc) if api is not None else openai_error(exc)
        return web.Response(body=body, status=exc.status, content_type=_JSON)

    async def _generate(self, request: web.Request, sim_api: SimApi) -> web.StreamResponse:
        received_ns = time.monotonic_ns()
        first_byte_ns = getattr(request.protocol, "first_byte_ns", 0) or received_ns
        p = self.profile
        api = sim_api.name
        try:
            body = await request.read()
            parsed = sim_api.parse(
                body, self.tokenizer, p.model_name, p.max_model_len, request.match_info.get("model")
            )
            if self.tool_calls and sim_api.tool_calls:
                data = orjson.loads(body)
                parsed = plan_tool_call(
                    parsed,
                    self.tool_calls,
                    data,
                    sim_api.conversation(data),
                    self.tokenizer,
                    p.max_model_len,
                )
            fault = self._faults(request)
        except BadRequest as exc:
            return self._error(sim_api, exc)
        header_id = request.headers.get("X-Request-Id")
        seq = next(self._counter)
        key = header_id if header_id else f"#{seq}"
        seed = request_seed(self.seed if parsed.seed is None else parsed.seed, key)
        if fault.error > 0 and _draw(seed) < fault.error:
            return self._error(
                sim_api, BadRequest("simulated fault", fault.status, "InternalServerError")
            )
        if 0 < fault.empty < 1:  # this request's draw: all empty or not at all
            fault = dataclasses.replace(fault, empty=float(_draw(seed ^ _EMPTY_SALT) < fault.empty))
        suffix = header_id if header_id else secrets.token_hex(8)
        rid = sim_api.dialect.id_prefix + suffix
        gt_id = header_id or rid
        req = SimRequest(
            request_id=gt_id,
            prompt_ids=parsed.prompt_ids,
            max_tokens=parsed.max_tokens,
            min_tokens=parsed.min_tokens,
            ignore_eos=parsed.ignore_eos,
            seed=seed,
            arrival_ns=received_ns,
        )
        headers = {"x-request-id": header_id} if header_id else {}
        common: dict[str, Any] = {
            "core": self.core,
            "api": api,
            "request_id": gt_id,
            "received_ns": received_ns,
            "first_byte_ns": first_byte_ns,
            "fault": fault,
            "gt": self.gt,
            "show_cached": p.enable_prompt_tokens_details,
        }
        if not parsed.stream:
            return await self._run_buffered(request, sim_api, parsed, req, rid, headers, common)
        encoder = sim_api.encoder(
            rid=rid,
            created=int(time.time()),
            model=p.model_name,
            table=self.table,
            tok=self.tokenizer,
            parsed=parsed,
        )
        sink = StreamSink(transport=request.transport, encoder=encoder, **common)
        sink.req = req
        req.sink = sink
        try:
            self._admit(req)
        except BadRequest as exc:
            return self._error(sim_api, exc)
        self._sinks.add(sink)
        try:
            resp = web.StreamResponse(status=200, headers={"Content-Type": _SSE, **headers})
            await resp.prepare(request)
            await resp.write(b"")  # send the headers now, as vLLM does before the first token
            sink.set_ready()
            await sink.done
            if not sink.killed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await resp.write_eof()
            return resp
        except (ConnectionError, asyncio.CancelledError):
            sink.abort()
            raise
        finally:
            self._sinks.discard(sink)

    def _admit(self, req: SimRequest) -> None:
        try:
            self.core.add(req)
        except QueueFullError:
            raise BadRequest(
                f"The server is overloaded: {len(self.core.waiting)} requests are waiting "
                f"(max_num_queued_reqs={self.profile.max_num_queued_reqs}). Retry later.",
                503,
                "ServiceUnavailableError",
            ) from None
        assert self._wake is not None
        self._wake.set()

    async def _run_buffered(
        self,
        request: web.Request,
        api: SimApi,
        parsed: ParsedRequest,
        req: SimRequest,
        rid: str,
        headers: dict[str, str],
        common: dict[str, Any],
    ) -> web.StreamResponse:
        sink = BufferSink(**common)
        sink.req = req
        req.sink = sink
        try:
            self._admit(req)
        except BadRequest as exc:
            return self._error(api, exc)
        self._sinks.add(sink)
        try:
            await sink.done
        finally:
            self._sinks.discard(sink)
        if sink.fault.reset_after >= 0 and request.transport is not None:
            request.transport.abort()
            raise ConnectionResetError("simulated connection reset")
        text = self.tokenizer.decode(sink.ids)
        n = len(sink.ids)
        cached = sink.cached()
        body = api.body(
            rid=rid,
            created=int(time.time()),
            model=self.profile.model_name,
            text=text,
            ids=sink.ids,
            parsed=parsed,
            finish=sink.finish_reason,
            prompt=req.prompt_len,
            completion=n,
            cached=cached,
        )
        return web.Response(body=body, content_type=_JSON, headers=headers)

    def _faults(self, request: web.Request) -> FaultSpec:
        header = request.headers.get("X-Sim-Fault")
        if not header:
            return self.base_faults
        try:
            return parse_faults(header)
        except InputError as exc:
            raise BadRequest(str(exc), param="X-Sim-Fault") from None

    # other endpoints ----------------------------------------------------------------------

    async def handle_models(self, request: web.Request) -> web.Response:
        p = self.profile
        card = {
            "id": p.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": p.model_name,
            "parent": None,
            "max_model_len": p.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{p.name}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.Response(
            body=orjson.dumps({"object": "list", "data": [card]}), content_type=_JSON
        )

    async def handle_health(self, request: web.Request) -> web.Response:
        ok = self._loop_task is not None and not self._loop_task.done()
        return web.Response(status=200 if ok else 503)

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps({"version": wire.SYSTEM_FINGERPRINT}), content_type=_JSON
        )

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(
            body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    async def handle_tokenize(self, request: web.Request) -> web.Response:
        try:
            data = orjson.loads(await request.read())
            if not isinstance(data, dict):
                raise BadRequest("The request body must be a JSON object")
            if isinstance(data.get("messages"), list):
                tools = data.get("tools") if isinstance(data.get("tools"), list) else None
                ids = self.tokenizer.chat_ids(
                    data["messages"], bool(data.get("add_generation_prompt", True)), tools=tools
                )
            elif isinstance(data.get("prompt"), str):
                ids = self.tokenizer.encode(data["prompt"])
            else:
                raise BadRequest("prompt or messages: Field required")
        except orjson.JSONDecodeError as exc:
            return self._error(None, BadRequest(f"JSON decode error: {exc}"))
        except BadRequest as exc:
            return self._error(None, exc)
        strs = None
        if data.get("return_token_strs"):
            strs = self.tokenizer.pieces(data["prompt"]) if "prompt" in data else None
        body = {
            "count": len(ids),
            "max_model_len": self.profile.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }
        return web.Response(body=orjson.dumps(body), content_type=_JSON)

    async def handle_detokenize(self, request: web.Request) -> web.Response:
        try:
            data = orjson.loads(await request.read())
            tokens = data.get("tokens") if isinstance(data, dict) else None
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and 0 <= t < self.profile.vocab_size for t in tokens
            ):
                raise BadRequest("tokens: a list of token ids within the vocabulary is required")
        except orjson.JSONDecodeError as exc:
            return self._error(None, BadRequest(f"JSON decode error: {exc}"))
        except BadRequest as exc:
            return self._error(None, exc)
        return web.Response(
            body=orjson.dumps({"prompt": self.tokenizer.decode(tokens)}), content_type=_JSON
        )

    async def handle_count_tokens(self, request: web.Request) -> web.Response:
        from agent_replay.engines.sim.requests import anthropic_messages

        try:
            data = orjson.loads(await request.read())
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                raise BadRequest("messages: Field required")
        except (orjson.JSONDecodeError, BadRequest) as exc:
            return self._error(
                SIM_APIS["messages"], exc if isinstance(exc, BadRequest) else BadRequest(str(exc))
            )
        tools = data.get("tools") if isinstance(data.get("tools"), list) else None
        n = len(self.tokenizer.chat_ids(anthropic_messages(data), tools=tools))
        return web.Response(body=orjson.dumps({"input_tokens": n}), content_type=_JSON)

    async def handle_reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.core.cache.clear()
        return web.Response(status=200)


_EMPTY_SALT = 0x5EED_E3F7
"""Mixed into a request's seed for the ``empty`` draw: independent of the ``error`` draw."""


def _draw(seed: int) -> float:
    """A uniform [0, 1) draw from a request seed (fault decisions)."""
    return ((seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)) / float(1 << 64)


class _StampingHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, plus when a request's bytes arrived (``first_byte_ns``):
    the kernel's receive time of its first packet on a ``_StampedListener`` connection
    (ground truth on), else when the event loop first read them. The handler of a request
    runs later: after the engine's loop got round to the socket and after the requests that
    arrived before it were parsed and handled, which is the engine's own ingress queue. A
    read that starts with ``P`` starts a POST (a JSON body or a chunk-size line never does);
    clients send a connection's next request only after its response, so the stamp the
    handler reads is its own request's."""

    first_byte_ns = 0

    def data_received(self, data: bytes) -> None:
        self.received(data, time.monotonic_ns())

    def received(self, data: bytes, t: int) -> None:
        if data[:1] == b"P":
            self.first_byte_ns = t
        super().data_received(data)


class _StampedListener:
    """Accepts connections itself and gives each a kernel-stamped transport
    (``engines.kstamp``) around aiohttp's handler, instead of ``web.TCPSite``."""

    def __init__(self, factory: web_server.Server, host: str, port: int, reuse_port: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._factory = factory
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors and the like: try again when readable
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kstamp.StampedTransport(self._loop, conn, self._factory())  # type: ignore[arg-type]

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


class _StampingServer(web_server.Server):
    """Makes ``_StampingHandler`` connections (set on the runner's server instance)."""

    def __call__(self) -> web_protocol.RequestHandler:
        return _StampingHandler(self, loop=self._loop, **self._kwargs)


def _key_check(key: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/health":
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {key}" and request.headers.get("x-api-key") != key:
                return web.json_response(
                    {
                        "error": {
                            "message": "missing or wrong API key",
                            "type": "authentication_error",
                        }
                    },
                    status=401,
                )
        return await handler(request)

    return check
