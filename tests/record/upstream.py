"""A small deterministic upstream for recorder tests: the same request always gets the same
bytes back, so what a client sees directly can be compared byte for byte with what it sees
through the proxy. Speaks just enough of chat/completions/messages/responses.

Request headers steer it: ``X-Fail: 500 | reset | hang | hang-mid | gzip``, ``X-Words: N``
(output length), ``X-Delay-Ms`` (between chunks).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
from typing import Any

import orjson
from aiohttp import web


def _words(n: int, seed: str) -> list[str]:
    h = hashlib.sha256(seed.encode()).hexdigest()
    return [f" w{h[i % 60 : i % 60 + 3]}{i}" for i in range(n)]


def _prompt_tokens(body: dict[str, Any]) -> int:
    return max(
        1,
        len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("input") or ""))
        // 4,
    )


class Upstream:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.cancelled = 0
        self.finished = 0
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Upstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def __aenter__(self) -> Upstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append((request.path, dict(request.headers), raw))
        try:
            return await self._handle(request, raw)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        fail = request.headers.get("X-Fail", "")
        if request.method == "GET":
            return web.json_response(
                {"object": "list", "data": [{"id": "m"}]}, headers={"X-Upstream": "yes"}
            )
        if fail == "500":
            return web.json_response(
                {"error": {"type": "server_error", "message": "boom"}}, status=500
            )
        if fail == "hang":
            await asyncio.sleep(30)
        body = orjson.loads(raw)
        path = request.path
        api = (
            "chat"
            if path.endswith("/chat/completions")
            else "completions"
            if path.endswith("/completions")
            else "messages"
            if path.endswith("/messages")
            else "responses"
        )
        n = int(request.headers.get("X-Words", "5"))
        delay = float(request.headers.get("X-Delay-Ms", "0")) / 1000
        # the answer depends on the prompt only, not on stream_options the proxy may add
        key = {k: v for k, v in body.items() if k != "stream_options"}
        seed = hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]
        words = _words(n, seed)
        ptoks = _prompt_tokens(body)
        tool = "use tool" in raw.decode(errors="replace")
        if not body.get("stream"):
            obj = self._full(api, seed, words, ptoks, tool)
            data = orjson.dumps(obj)
            headers = {"Content-Type": "application/json"}
            if fail == "gzip":
                data = gzip.compress(data, mtime=0)
                headers["Content-Encoding"] = "gzip"
            return web.Response(body=data, headers=headers)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        so = body.get("stream_options") or {}
        events = self._events(
            api,
            seed,
            words,
            ptoks,
            tool,
            bool(so.get("include_usage")),
            bool(so.get("continuous_usage_stats")),
            bool(body.get("return_token_ids")),
        )
        for i, ev in enumerate(events):
            if delay:
                await asyncio.sleep(delay)
            await resp.write(ev)
            if fail == "reset" and i == 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            if fail == "hang-mid" and i == 2:
                await asyncio.sleep(30)
        await resp.write_eof()
        self.finished += 1
        return resp

    def _full(self, api: str, seed: str, words: list[str], ptoks: int, tool: bool) -> Any:
        text = "".join(words)
        n = len(words)
        if api == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if tool:
                msg["tool_calls"] = [
                    {
                        "id": f"call_{seed}",
                        "type": "function",
                        "function": {"name": "run", "arguments": "{}"},
                    }
                ]
            return {
                "id": f"chatcmpl-{seed}",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": ptoks,
                    "completion_tokens": n,
                    "total_tokens": ptoks + n,
                    "prompt_tokens_details": {"cached_tokens": 3},
                },
            }
        if api == "completions":
            return {
                "id": f"cmpl-{seed}",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": ptoks,
                    "completion_tokens": n,
                    "total_tokens": ptoks + n,
                },
            }
        if api == "messages":
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if tool:
                content.append(
                    {"type": "tool_use", "id": f"toolu_{seed}", "name": "run", "input": {}}
                )
            return {
                "id": f"msg_{seed}",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": content,
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": ptoks - 2,
                    "cache_read_input_tokens": 2,
                    "output_tokens": n,
                },
            }
        return {
            "id": f"resp_{seed}",
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
            "usage": {
                "input_tokens": ptoks,
                "output_tokens": n,
                "input_tokens_details": {"cached_tokens": 0},
            },
        }

    def _events(
        self,
        api: str,
        seed: str,
        words: list[str],
        ptoks: int,
        tool: bool,
        usage: bool,
        continuous: bool,
        token_ids: bool,
    ) -> list[bytes]:
        n = len(words)
        out: list[bytes] = []

        def sse(obj: Any, event: str | None = None) -> None:
            head = f"event: {event}\n".encode() if event else b""
            out.append(head + b"data: " + orjson.dumps(obj) + b"\n\n")

        if api in ("chat", "completions"):
            obj_name = "chat.completion.chunk" if api == "chat" else "text_completion"
            for i, w in enumerate(words):
                if api == "chat":
                    delta: dict[str, Any] = {"content": w}
                    if i == 0:
                        delta["role"] = "assistant"
                    if tool and i == n - 1:
                        delta["tool_calls"] = [
                            {
                                "index": 0,
                                "id": f"call_{seed}",
                                "type": "function",
                                "function": {"name": "run", "arguments": "{}"},
                            }
                        ]
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": w, "finish_reason": None}
                if token_ids:
                    choice["token_ids"] = [100 + i]
                chunk: dict[str, Any] = {
                    "id": f"x-{seed}",
                    "object": obj_name,
                    "created": 1,
                    "model": "m",
                    "choices": [choice],
                }
                if usage and continuous:
                    chunk["usage"] = {
                        "prompt_tokens": ptoks,
                        "completion_tokens": i + 1,
                        "total_tokens": ptoks + i + 1,
                    }
                sse(chunk)
            if usage:
                sse(
                    {
                        "id": f"x-{seed}",
                        "object": obj_name,
                        "created": 1,
                        "model": "m",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": ptoks,
                            "completion_tokens": n,
                            "total_tokens": ptoks + n,
                            "prompt_tokens_details": {"cached_tokens": 3},
                        },
                    }
                )
            out.append(b"data: [DONE]\n\n")
            return out
        if api == "messages":
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_{seed}",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "usage": {
                            "input_tokens": ptoks - 2,
                            "cache_read_input_tokens": 2,
                            "output_tokens": 0,
                        },
                    },
                },
                "message_start",
            )
            sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
            for w in words:
                sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": w},
                    },
                    "content_block_delta",
                )
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            if tool:
                sse(
                    {
                        "type": "content_block_start",
                        "index": 1,
                        "content_block": {
                            "type": "tool_use",
                            "id": f"toolu_{seed}",
                            "name": "run",
                            "input": {},
                        },
                    },
                    "content_block_start",
                )
                sse({"type": "content_block_stop", "index": 1}, "content_block_stop")
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": n},
                },
                "message_delta",
            )
            sse({"type": "message_stop"}, "message_stop")
            return out
        for w in words:
            sse({"type": "response.output_text.delta", "delta": w}, "response.output_text.delta")
        sse(
            {
                "type": "response.completed",
                "response": {
                    "id": f"resp_{seed}",
                    "status": "completed",
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "".join(words)}],
                        }
                    ],
                    "usage": {
                        "input_tokens": ptoks,
                        "output_tokens": n,
                        "input_tokens_details": {"cached_tokens": 1},
                    },
                },
            },
            "response.completed",
        )
        return out
