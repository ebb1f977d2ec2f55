"""No secret in any byte that record, run or report write or print.

Secrets are planted everywhere a user could put one: request headers (Authorization,
x-api-key, cookie), the upstream URL's user-info, body fields (api_key, token, bearer,
private_key, aws_secret_access_key, password...), run's ``--header`` and target URL, and
an upstream that echoes the key it refuses in its error text. Then every file written is
read whole and searched, with the commands' output."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

HDR = "sk-HDR-SECRET-1111"
XKEY = "XKEY-SECRET-2222"
URLPASS = "URLPASS-SECRET-3333"
BODY = {
    "api_key": "BODYKEY-SECRET-4444",
    "token": "TOKEN-SECRET-5555",
    "auth_token": "AUTHTOK-SECRET-6666",
    "bearer": "BEARER-SECRET-7777",
    "private_key": "PRIVKEY-SECRET-8888",
    "aws_secret_access_key": "AWS-SECRET-9999",
    "password": "PASSWD-SECRET-0000",
    "clientSecret": "CLIENT-SECRET-1212",
}
RUNKEY = "sk-RUN-SECRET-3434"
RUNPASS = "RUNPASS-SECRET-5656"
SECRETS = [
    HDR,
    XKEY,
    URLPASS,
    RUNKEY,
    RUNPASS,
    *BODY.values(),
    base64.b64encode(f"user:{URLPASS}".encode()).decode()[:-2],
    base64.b64encode(f"u:{RUNPASS}".encode()).decode()[:-2],
]


class EchoUpstream:
    """A chat endpoint that streams a short answer, and refuses (401) every request whose
    last message says ``fail``, echoing the credentials it got (as some servers do)."""

    def __init__(self) -> None:
        self.auth_seen: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "echo-model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        self.auth_seen.append(auth)
        last = str(body.get("messages", [{}])[-1].get("content", ""))
        if "fail" in last or (len(self.auth_seen) % 2 == 0 and "RUN" in auth):
            return web.json_response(
                {
                    "error": f"invalid credentials {auth} {request.headers.get('x-api-key')}"
                    f" {body.get('api_key')}"
                },
                status=401,
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            ev = {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "echo-model",
                "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}],
            }
            await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
        usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        await resp.write(
            b"data: "
            + orjson.dumps({"id": "c", "choices": [], "usage": usage})
            + b"\n\ndata: [DONE]\n\n"
        )
        await resp.write_eof()
        return resp


@pytest.fixture
async def echo() -> AsyncIterator[EchoUpstream]:
    up = EchoUpstream()
    await up.start()
    yield up
    assert up.runner is not None
    await up.runner.cleanup()


async def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """An agent-replay command, without blocking this loop (the upstream runs on it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


def _grep(folder: Path, extra: list[str]) -> list[str]:
    found = []
    blobs = [(str(p), p.read_bytes()) for p in folder.rglob("*") if p.is_file()]
    blobs += [(f"output {i}", s.encode()) for i, s in enumerate(extra)]
    assert len(blobs) > 3
    for name, data in blobs:
        for s in SECRETS:
            if s.encode() in data:
                found.append(f"{s} in {name}")
    return found


@pytest.mark.slow
async def test_no_secret_in_anything_written(tmp_path: Path, echo: EchoUpstream) -> None:
    host = echo.url.removeprefix("http://")
    trace = tmp_path / "trace"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_replay",
        "record",
        "--upstream",
        f"http://user:{URLPASS}@{host}",
        "--listen",
        "127.0.0.1:0",
        "-o",
        str(trace),
        "--content",
        "full",
        "--flush-interval",
        "0.2",
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    first = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    url = first.split()[2]
    statuses = []
    async with aiohttp.ClientSession() as s:
        for i, (text, headers) in enumerate(
            [
                ("hello", {}),  # no Authorization: the URL's user-info goes as Basic auth
                (
                    "again",
                    {"Authorization": f"Bearer {HDR}", "x-api-key": XKEY, "Cookie": f"sid={HDR}"},
                ),
                ("please fail", {"Authorization": f"Bearer {HDR}", "x-api-key": XKEY}),
            ]
        ):
            body = {
                "model": "echo-model",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": text}],
                **BODY,
                "metadata": {"nested": {"token": BODY["token"]}},
            }
            async with s.post(
                url + "/v1/chat/completions",
                data=orjson.dumps(body),
                headers={"X-Session-ID": f"s{i}", **headers},
            ) as r:
                await r.read()
                statuses.append(r.status)
    assert statuses == [200, 200, 401]  # never a 500
    assert echo.auth_seen[0] == "Basic " + base64.b64encode(f"user:{URLPASS}".encode()).decode()
    assert echo.auth_seen[1] == f"Bearer {HDR}"
    proc.send_signal(signal.SIGTERM)
    rec_err = first + (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
    assert await proc.wait() == 0, rec_err
    from agent_replay.traces.io import read_trace

    table, _ = read_trace(trace)
    errors = [e for e in table.column("error").to_pylist() if e]
    assert len(errors) == 1 and "invalid credentials" in errors[0] and "<redacted>" in errors[0]

    # run: a key in --header and user-info in the target, against the same upstream, which
    # refuses every other request echoing the key
    results = tmp_path / "results"
    run = await _cli(
        "run",
        str(trace),
        "--target",
        f"http://u:{RUNPASS}@{host}/v1",
        "--header",
        f"Authorization=Bearer {RUNKEY}",
        "-o",
        str(results),
        "--speedup",
        "50",
        "--no-progress",
        "--http-client",
        "aiohttp",
        "--max-failure-rate",
        "1",
    )
    assert "Traceback" not in run.stderr, run.stderr
    assert (results / "run.json").exists(), run.stderr
    meta = json.loads((results / "run.json").read_text())
    assert meta["options"]["headers"] == [["Authorization", "<redacted>"]]
    assert any("RUN" in a for a in echo.auth_seen)  # the key was sent, only not written
    import pyarrow.parquet as pq

    rows = pq.read_table(results / "requests").to_pylist()
    echoed = [r["error"] for r in rows if r["error"] and "invalid credentials" in r["error"]]
    assert echoed and all("<redacted>" in e for e in echoed)  # the echo reached the rows, scrubbed
    report = await _cli("report", str(results), "--format", "json")
    assert report.returncode == 0, report.stderr
    leaks = _grep(tmp_path, [rec_err, run.stdout, run.stderr, report.stdout, report.stderr])
    assert leaks == []


def test_redaction_policy() -> None:
    from agent_replay.redact import is_secret_key, redact, redact_url, scrub

    for k in (
        "api_key",
        "x-api-key",
        "Authorization",
        "token",
        "auth_token",
        "bearer",
        "private_key",
        "aws_secret_access_key",
        "password",
        "clientSecret",
        "Cookie",
        "OPENAI_API_KEY",
        "accessToken",
        "credentials",
    ):
        assert is_secret_key(k), k
    for k in (
        "max_tokens",
        "token_ids",
        "prompt_tokens",
        "tokens",
        "keyword",
        "monkey",
        "messages",
        "content",
        "model",
    ):
        assert not is_secret_key(k), k
    assert redact_url("https://u:p%40ss@h.example:8443/v1?x=1") == "https://h.example:8443/v1?x=1"
    assert redact_url("http://[::1]:80/") == "http://[::1]:80/"
    out: Any = redact(
        {
            "a": {"api_key": "k"},
            "headers": [["X-Api-Key", "v"], ["Accept", "j"]],
            "url": "see http://me:pw@host/x",
        }
    )
    assert out == {
        "a": {"api_key": "<redacted>"},
        "headers": [["X-Api-Key", "<redacted>"], ["Accept", "j"]],
        "url": "see http://host/x",
    }
    assert (
        scrub("bad key sk-abcdef123 (Bearer sk-abcdef123)", ["Bearer sk-abcdef123", "sk-abcdef123"])
        == "bad key <redacted> (<redacted>)"
    )
