"""An upstream that cannot be reached, or that fails before answering, gets the client a
502 in its API's error shape naming the upstream and the cause, without credentials; the
official SDKs read it as an ordinary API error."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import orjson
import pytest

from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace

KEY = "sk-test-NEVER-ECHOED-7d3e"
PASSWORD = "upstream-pass-9b1c"


def _dead_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_sdks_see_a_502_naming_the_dead_upstream(tmp_path: Path) -> None:
    import anthropic
    import openai

    port = _dead_port()
    async with Recorder(
        f"http://user:{PASSWORD}@127.0.0.1:{port}",
        "127.0.0.1:0",
        tmp_path / "t",
        flush_interval_s=60,
    ) as rec:
        async with openai.AsyncOpenAI(base_url=rec.url + "/v1", api_key=KEY, max_retries=0) as oa:
            with pytest.raises(openai.APIStatusError) as oe:
                await oa.chat.completions.create(
                    model="m",
                    max_tokens=5,
                    stream=True,
                    messages=[{"role": "user", "content": "hi"}],
                )
        async with anthropic.AsyncAnthropic(base_url=rec.url, api_key=KEY, max_retries=0) as an:
            with pytest.raises(anthropic.APIStatusError) as ae:
                await an.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
                )
        await rec.flush()
        rows = read_trace(rec.config.out_dir)[0].to_pylist()
    want = f"agent-replay record: upstream http://127.0.0.1:{port} unreachable: connection refused"
    assert oe.value.status_code == 502
    assert oe.value.body == {"message": want, "type": "upstream_error", "code": 502}
    assert ae.value.status_code == 502
    assert ae.value.body == {"type": "error", "error": {"type": "api_error", "message": want}}
    for text in (oe.value.response.text, ae.value.response.text):
        assert KEY not in text and PASSWORD not in text
    assert [r["error"].startswith("upstream connect failed") for r in rows] == [True, True]
    assert [r["http_status"] for r in rows] == [0, 0]


async def test_upstream_closing_before_answering_is_a_502(tmp_path: Path) -> None:
    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request head, then no answer at all
        writer.close()

    server = await asyncio.start_server(slam, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    import openai

    try:
        async with (
            Recorder(
                f"http://127.0.0.1:{port}", "127.0.0.1:0", tmp_path / "t", flush_interval_s=60
            ) as rec,
            openai.AsyncOpenAI(base_url=rec.url + "/v1", api_key=KEY, max_retries=0) as oa,
        ):
            with pytest.raises(openai.APIStatusError) as oe:
                await oa.completions.create(model="m", prompt="hi", max_tokens=5)
    finally:
        server.close()
        await server.wait_closed()
    assert oe.value.status_code == 502
    body = orjson.loads(oe.value.response.content)
    assert body["error"]["message"] == (
        f"agent-replay record: upstream http://127.0.0.1:{port} failed before answering: "
        "connection reset: ServerDisconnectedError"
    )
    assert body["error"]["type"] == "upstream_error"


async def test_upstream_not_accepting_is_a_502_after_the_connect_timeout(tmp_path: Path) -> None:
    import openai

    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # never accepts: once its queue is full, connects get no answer
        port = full.getsockname()[1]
        fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        try:
            async with (
                Recorder(
                    f"http://127.0.0.1:{port}",
                    "127.0.0.1:0",
                    tmp_path / "t",
                    flush_interval_s=60,
                    connect_timeout_s=0.5,
                ) as rec,
                openai.AsyncOpenAI(
                    base_url=rec.url + "/v1", api_key=KEY, max_retries=0, timeout=20
                ) as oa,
            ):
                with pytest.raises(openai.APIStatusError) as oe:
                    await oa.completions.create(model="m", prompt="hi", max_tokens=5)
                await rec.flush()
                rows = read_trace(rec.config.out_dir)[0].to_pylist()
        finally:
            for s in fillers:
                s.close()
    assert oe.value.status_code == 502
    assert oe.value.body == {
        "message": f"agent-replay record: upstream http://127.0.0.1:{port} unreachable: "
        "connect timed out",
        "type": "upstream_error",
        "code": 502,
    }
    assert rows[0]["error"] == "upstream connect timeout"
