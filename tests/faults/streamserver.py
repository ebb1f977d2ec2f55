"""An upstream for the proxy's timing tests, run as its own process
(``python -m tests.faults.streamserver``; prints its URL): a chat stream of ``chunks``
events ``gap_ms`` apart (from the request's ``max_tokens`` and ``temperature``), and for a
body over 1 MB, or one it cannot parse (an encoded body: it decodes nothing, as its loop
would stall its own streams), a short answer without parsing it, so that only the proxy's
handling of such bodies is measured."""

from __future__ import annotations

import asyncio
import sys

import orjson
from aiohttp import web


async def chat(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    n, gap = (1, 0.0) if len(raw) > 1 << 20 else _shape(raw)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        ev = {"id": "c", "choices": [{"index": 0, "delta": {"content": f" t{i}"}}]}
        await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
        if gap:
            await asyncio.sleep(gap)
    prompt = len(raw) // 4  # the proxy's byte fallback counts 4 bytes a token
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    await resp.write(
        b"data: "
        + orjson.dumps({"id": "c", "choices": [], "usage": usage})
        + b"\n\ndata: [DONE]\n\n"
    )
    await resp.write_eof()
    return resp


def _shape(raw: bytes) -> tuple[int, float]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 1, 0.0
    if not isinstance(body, dict):
        return 1, 0.0
    return int(body.get("max_tokens", 10)), float(body.get("temperature", 0)) / 1000


async def main() -> None:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
