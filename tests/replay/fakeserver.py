"""A tiny vLLM-dialect server on loopback for the replay tests: completions with token-id
prompts, chat and messages with text prompts (one token per whitespace word plus 3 for the
template), return_token_ids, continuous usage, a 16-token-block prefix cache reported as
cached_tokens, /v1/models, /tokenize. It records what it received."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

BLOCK = 16


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    received_ns: int
    prompt_tokens: int
    cached_tokens: int


@dataclass
class FakeVllm:
    tokens_per_chunk: int = 1
    step_s: float = 0.0
    ttft_s: float = 0.0
    token_ids: bool = True  # honour return_token_ids
    fail_status: int | None = None
    truncate: bool = False
    split_writes: bool = False  # write each event in two parts (reads end inside events)
    seen: list[Seen] = field(default_factory=list)
    cache: set[tuple[int, ...]] = field(default_factory=set)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/messages", self.complete)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "fake-model", "max_model_len": 65536}]}
        )

    @staticmethod
    def _text_tokens(messages: list[dict[str, Any]]) -> int:
        return 3 + sum(len(str(m.get("content", "")).split()) for m in messages)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "messages" in body:
            n = self._text_tokens(body["messages"])
        else:
            n = len(str(body.get("prompt", "")).split())
        return web.json_response({"count": n, "max_model_len": 65536, "tokens": []})

    def _cached(self, ids: list[int]) -> int:
        hit = 0
        full = (len(ids) - 1) // BLOCK
        for b in range(full):
            if tuple(ids[: (b + 1) * BLOCK]) in self.cache:
                hit = (b + 1) * BLOCK
            else:
                break
        for b in range(len(ids) // BLOCK):
            self.cache.add(tuple(ids[: (b + 1) * BLOCK]))
        return hit

    async def complete(self, request: web.Request) -> web.StreamResponse:
        t = time.monotonic_ns()
        body = await request.json()
        path = request.path
        if path == "/v1/completions":
            prompt = body["prompt"]
            ids = (
                prompt
                if isinstance(prompt, list)
                else [hash(w) & 0xFFFF for w in str(prompt).split()]
            )
            n_prompt = len(ids)
            cached = self._cached(ids)
            n_out = body["max_tokens"]
        else:
            n_prompt = self._text_tokens(body["messages"])
            cached = 0
            n_out = body.get("max_completion_tokens") or body["max_tokens"]
        self.seen.append(
            Seen(
                path, body, {k.lower(): v for k, v in request.headers.items()}, t, n_prompt, cached
            )
        )
        if self.fail_status:
            return web.json_response({"error": {"message": "nope"}}, status=self.fail_status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        anthropic = path == "/v1/messages"
        rti = bool(body.get("return_token_ids")) and self.token_ids
        cont = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        if anthropic:
            await resp.write(
                b"event: message_start\ndata: "
                + orjson.dumps(
                    {
                        "type": "message_start",
                        "message": {"usage": {"input_tokens": n_prompt, "output_tokens": 0}},
                    }
                )
                + b"\n\n"
            )
        done = 0
        while done < n_out:
            k = min(self.tokens_per_chunk, n_out - done)
            done += k
            if anthropic:
                ev = {
                    "type": "content_block_delta",
                    "delta": {"type": "text_delta", "text": " w" * k},
                    "usage": {"output_tokens": done},
                }
                await resp.write(b"event: content_block_delta\ndata: " + orjson.dumps(ev) + b"\n\n")
            else:
                choice: dict[str, Any] = {"index": 0, "text": " w" * k, "finish_reason": None}
                if rti:
                    choice["token_ids"] = list(range(1000, 1000 + k))
                ev = {"id": "x", "choices": [choice]}
                if cont:
                    ev["usage"] = {
                        "prompt_tokens": n_prompt,
                        "completion_tokens": done,
                        "total_tokens": n_prompt + done,
                    }
                raw = b"data: " + orjson.dumps(ev) + b"\n\n"
                if self.split_writes:
                    cut = 7 + done % (len(raw) - 8)
                    await resp.write(raw[:cut])
                    await asyncio.sleep(0.002)
                    raw = raw[cut:]
                await resp.write(raw)
            if self.truncate and done >= n_out // 2:
                await resp.write(b'data: {"id": "x", "choi')
                return resp
            if self.step_s:
                await asyncio.sleep(self.step_s)
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": done,
            "total_tokens": n_prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if anthropic:
            await resp.write(
                b"event: message_delta\ndata: "
                + orjson.dumps(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "max_tokens"},
                        "usage": {"output_tokens": done},
                    }
                )
                + b"\n\n"
            )
            await resp.write(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
        else:
            await resp.write(
                b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\n"
            )
            await resp.write(b"data: [DONE]\n\n")
        return resp


async def start(fake: FakeVllm) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
