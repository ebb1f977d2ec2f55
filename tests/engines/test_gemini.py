"""Gemini's streamGenerateContent, end to end through its one dialect module: the body and
path a replay sends, exact token counts per event (and a stream that does not say them
flagged), the recorder finding the API and the model in a path pattern, the simulated
engine serving it, and a recorded two-turn session replayed with the same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.apis import DIALECTS, dialect, dialect_for_path
from agent_replay.engines.apis.gemini import call_id
from agent_replay.engines.sim import SimProcess, SimServer
from agent_replay.engines.sse import SSEParser
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.wire import api_for, inspect_request
from agent_replay.traces.io import read_trace

GEMINI = dialect("gemini")


def _event(text: str, count: int | None, finish: str | None = None) -> bytes:
    cand: dict = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    meta = {"promptTokenCount": 12}
    if count is not None:
        meta["candidatesTokenCount"] = count
    if finish:
        meta["cachedContentTokenCount"] = 8
    return b"data: " + orjson.dumps({"candidates": [cand], "usageMetadata": meta}) + b"\r\n\r\n"


# cumulative counts on every event: 1, 3 (an event of two tokens), 4, then the finish
COUNTED = _event(" a", 1) + _event(" b c", 3) + _event(" d", 4) + _event("", 4, "MAX_TOKENS")
# counts only at the end: one provisional token per text event, 3 events for 4 tokens
UNCOUNTED = _event(" a", None) + _event(" b c", None) + _event(" d", None) + _event("", 4, "STOP")


def _decode(raw: bytes, cut: int | None = None) -> tuple[list[int], Any]:
    dec, parser = GEMINI.decoder(), SSEParser()
    reads = [raw] if cut is None else [raw[:cut], raw[cut:]]
    ks = [dec.feed(ev.data, ev.event) for r in reads for ev in parser.feed(r)]
    return ks, dec


def test_tokens_per_event_from_the_cumulative_count_at_every_split():
    for cut in range(len(COUNTED) + 1):
        ks, dec = _decode(COUNTED, cut)
        assert ks == [1, 2, 1, 0], cut
        assert dec.exact and dec.done and dec.finish_reason == "MAX_TOKENS"
        assert dec.result_usage() == (12, 4, 8)


def test_a_stream_without_running_counts_is_flagged_when_an_event_held_two_tokens():
    ks, dec = _decode(UNCOUNTED)
    assert ks == [1, 1, 1, 0] and not dec.exact
    ks, dec = _decode(_event(" a", None) + _event("", 1, "STOP"))
    assert ks == [1, 0] and dec.exact


def test_the_body_and_the_path_a_replay_sends():
    body = GEMINI.build(
        model="gemini-2.5-flash",
        max_tokens=9,
        prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    )
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 9, "temperature": 0.0},
        "ignore_eos": True,
        "min_tokens": 9,
    }
    assert (
        GEMINI.url_path("gemini-2.5-flash")
        == "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )
    recorded = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "generationConfig": {"maxOutputTokens": 50, "topK": 3},
    }
    again = GEMINI.build(model="m", prompt=None, max_tokens=5, vllm_extras=False, base=recorded)
    assert again == {
        "contents": recorded["contents"],
        "generationConfig": {"maxOutputTokens": 5, "topK": 3, "temperature": 0.0},
    }


def test_the_recorder_finds_the_api_and_the_model_in_the_path():
    path = "/proxy/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert api_for("POST", path) == "gemini"
    assert api_for("POST", "/v1beta/models/gemini-2.5-pro:generateContent") == "gemini"
    assert api_for("POST", "/v1beta/models/gemini-2.5-pro") is None
    # the other APIs keep their paths, the longest matching end wins
    assert [
        api_for("POST", p)
        for p in (
            "/v1/chat/completions",
            "/openai/v1/completions",
            "/v1/messages",
            "/v1/messages/count_tokens",
        )
    ] == ["chat", "completions", "messages", None]
    assert {dialect_for_path(d.url_path("m").split("?")[0]) for d in DIALECTS.values()} == set(
        DIALECTS.values()
    )
    got = inspect_request("gemini", orjson.dumps({"contents": []}), path=path)
    assert got is not None
    info, out = got
    assert (info.model, info.stream, info.injected_usage) == ("gemini-2.5-pro", True, False)
    assert out == orjson.dumps({"contents": []})


def test_the_api_key_goes_in_each_api_s_own_header(monkeypatch: pytest.MonkeyPatch):
    from agent_replay.replay.config import RunConfig

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    given = RunConfig(trace="t", target="http://h", api_key="K")
    assert given.auth_headers("gemini") == (("Authorization", "Bearer K"), ("x-goog-api-key", "K"))
    assert given.auth_headers("messages") == (("Authorization", "Bearer K"), ("x-api-key", "K"))
    assert given.auth_headers("chat") == (("Authorization", "Bearer K"),)
    monkeypatch.setenv("GEMINI_API_KEY", "G")
    env = RunConfig(trace="t", target="http://h")
    assert env.auth_headers("gemini") == (("Authorization", "Bearer G"), ("x-goog-api-key", "G"))
    assert env.auth_headers("chat") == ()


async def test_the_simulated_engine_serves_it_with_exact_counts():
    async with SimServer("fast", seed=1) as sim, aiohttp.ClientSession() as http:
        model = sim.profile.model_name
        body = GEMINI.build(model=model, prompt="four score and seven", max_tokens=7)
        async with http.post(sim.url + GEMINI.url_path(model), json=body) as resp:
            assert resp.status == 200
            raw = await resp.read()
        async with http.post(sim.url + GEMINI.url_path("other"), json=body) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["status"] == "NOT_FOUND"
        async with http.post(sim.url + GEMINI.url_path(model), json={"contents": []}) as resp:
            assert resp.status == 400
    ks, dec = _decode(raw)
    assert sum(ks) == 7 and dec.exact and dec.done
    prompt, out, _ = dec.result_usage()
    assert out == 7 and prompt == len(
        sim.tokenizer.chat_ids([{"role": "user", "content": "four score and seven"}])
    )


async def _turn(http: aiohttp.ClientSession, url: str, contents: list) -> str:
    body = {"contents": contents, "generationConfig": {"maxOutputTokens": 6}}
    async with http.post(url, json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
    texts = [
        orjson.loads(ev.data)["candidates"][0]["content"]["parts"][0]["text"]
        for ev in SSEParser().feed(raw)
    ]
    return "".join(texts)


@pytest.mark.slow
async def test_a_recorded_session_replays_with_the_same_tokens(tmp_path: Path) -> None:
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    trace = tmp_path / "trace"
    async with (
        SimServer("fast", seed=3) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
        aiohttp.ClientSession() as http,
    ):
        url = rec.url + GEMINI.url_path(sim.profile.model_name)
        contents = [{"role": "user", "parts": [{"text": "list the files here"}]}]
        reply = await _turn(http, url, contents)
        contents += [
            {"role": "model", "parts": [{"text": reply}]},
            {"role": "user", "parts": [{"text": "now the tests"}]},
        ]
        await _turn(http, url, contents)
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["request_index"])
    assert [(r["api"], r["model"], r["output_tokens"]) for r in rows] == [
        ("gemini", "sim-fast", 6),
        ("gemini", "sim-fast", 6),
    ]
    assert [r["parent_index"] for r in rows] == [-1, 0]
    assert rows[0]["session_id"] == rows[1]["session_id"]
    assert all(
        r["error"] is None and r["exact_chunk_tokens"] and r["input_tokens"] > 0 for r in rows
    )
    with SimProcess("fast", seed=4) as target:
        summary = await arun(
            RunConfig(
                trace=str(trace),
                target=target.url,
                output=str(tmp_path / "out"),
                progress=False,
                scrape_interval_s=0,
            ),
            progress=None,
        )
    assert summary.failed == 0
    res = sorted(
        pq.read_table(tmp_path / "out" / "requests").to_pylist(), key=lambda r: r["request_index"]
    )
    for r, x in zip(rows, res, strict=True):
        assert x["api"] == "gemini" and x["status"] == "ok" and x["error"] is None, x["error"]
        assert x["completion_tokens"] == r["output_tokens"] == 6
        assert x["prompt_tokens"] == r["input_tokens"]


async def test_the_engine_answers_with_a_function_call_then_text() -> None:
    """``--tool-call``: a user's turn offering the function gets the call whole in the last
    event, its arguments' pieces counted exactly; a function's result gets text."""
    tools = [{"functionDeclarations": [{"name": "list_directory"}, {"name": "read_file"}]}]
    spec = 'list_directory={"dir_path": "."}'
    user = {"role": "user", "parts": [{"text": "list the files"}]}
    async with (
        SimServer("fast", seed=1, tool_call=["nothing={}", spec]) as sim,
        aiohttp.ClientSession() as http,
    ):
        url = sim.url + GEMINI.url_path(sim.profile.model_name)
        async with http.post(url, json={"contents": [user], "tools": tools}) as resp:
            raw = await resp.read()
        call = {"functionCall": {"name": "list_directory", "args": {"dir_path": "."}}}
        result = {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "list_directory", "response": {"output": "a.txt"}}}
            ],
        }
        body = {
            "contents": [user, {"role": "model", "parts": [call]}, result],
            "tools": tools,
            "generationConfig": {"maxOutputTokens": 5},
        }
        async with http.post(url, json=body) as resp:
            text = await resp.read()
        n = len(sim.tokenizer.pieces('{"dir_path": "."}'))
    events = [orjson.loads(ev.data) for ev in SSEParser().feed(raw)]
    assert [e.get("candidates", [{}])[0].get("content", {}).get("parts") for e in events] == [
        None
    ] * (n - 1) + [[call]]
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    ks, dec = _decode(raw)
    assert sum(ks) == n and ks[-1] == n and dec.exact and dec.result_usage()[1] == n
    assert GEMINI.reply_from_events(SSEParser().feed(raw)).tool_ids == (call_id(call),)
    ks, dec = _decode(text)
    assert sum(ks) == 5 and dec.exact
    assert GEMINI.reply_from_events(SSEParser().feed(text)).tool_ids == ()
