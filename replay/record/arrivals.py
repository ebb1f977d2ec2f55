"""A request's arrival at the recorder: the moment the event loop read its request line and
headers off the connection, stamped in aiohttp's protocol (``data_received``) as the
parser completes them. aiohttp then wakes the connection's task, which makes the request
and starts its handler in a task of its own: two more turns of the event loop, each
behind whatever else is ready (other streams' chunks), before the handler could read a
clock.

``StampingRunner`` is an ``AppRunner`` whose connections stamp every request they parse
and whose requests carry their stamp (``arrival_of``). The stamp of a request whose headers
came in two reads is the second read's. Where aiohttp's server is not the one this was
written against, the runner is a plain ``AppRunner`` and ``arrival_of`` gives None (the
handler stamps the request itself)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

Clock = Callable[[], int]

ARRIVAL: Any = (
    web.RequestKey("arrival_ns", int) if hasattr(web, "RequestKey") else "agent_replay.arrival_ns"
)
"""The request's stamp (``Clock`` ns) in its state."""


class _StampingHandler(RequestHandler):
    """aiohttp's HTTP/1 protocol, stamping each request it parses: one stamp per parsed
    message, taken in the order the connection's task makes the requests."""

    __slots__ = ("_arrival_clock", "arrivals")

    def __init__(self, manager: Any, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.arrivals: deque[int] = deque()
        self._arrival_clock: Clock = manager.arrival_clock

    def data_received(self, data: bytes) -> None:
        t = self._arrival_clock()
        before = self._request_count
        super().data_received(data)
        for _ in range(self._request_count - before):
            self.arrivals.append(t)


class _StampingServer(web.Server):
    arrival_clock: Clock

    def __call__(self) -> RequestHandler:
        return _StampingHandler(self, loop=self._loop, **self._kwargs)


def _stamped(make: Callable[..., web.BaseRequest]) -> Callable[..., web.BaseRequest]:
    def factory(
        message: Any, payload: Any, protocol: Any, writer: Any, task: Any
    ) -> web.BaseRequest:
        request = make(message, payload, protocol, writer, task)
        arrivals = getattr(protocol, "arrivals", None)
        if arrivals:
            request[ARRIVAL] = arrivals.popleft()
        return request

    return factory


def _compatible(server: web.Server) -> bool:
    return (
        type(server) is web.Server
        and hasattr(server, "_kwargs")
        and hasattr(server, "_loop")
        and "_request_count" in getattr(RequestHandler, "__slots__", ())
    )


class StampingRunner(web.AppRunner):
    """``AppRunner`` whose requests carry their arrival (``arrival_of``), read with
    ``clock``."""

    def __init__(self, app: web.Application, *, clock: Clock = time.monotonic_ns, **kw: Any):
        super().__init__(app, **kw)
        self._arrival_clock = clock

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if not _compatible(server):
            return server
        server.__class__ = _StampingServer
        assert isinstance(server, _StampingServer)
        server.arrival_clock = self._arrival_clock
        server.request_factory = _stamped(server.request_factory)
        return server


def arrival_of(request: web.BaseRequest) -> int | None:
    """When ``request``'s headers were read (``StampingRunner``), None where not stamped."""
    t = request.get(ARRIVAL)
    return t if isinstance(t, int) else None
