"""The Responses API end to end: the simulated engine's event sequence read by the real
``openai`` library, the dialect's decoder on it, tool calls, and tools in the prompt count."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from agent_replay.engines.dialects import DIALECTS, ResponsesStreamDecoder, dialect
from agent_replay.engines.sim import SimProfile, SimServer, SimTokenizer
from agent_replay.engines.sse import SSEParser

LS = 'Bash={"command": "ls"}'
BASH_TOOL = {
    "type": "function",
    "name": "Bash",
    "description": "Run a shell command",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimProfile.load("fast"), tool_call=LS) as s:
        yield s


def words(n: int) -> str:
    return " abcd" * n


async def test_openai_library_streams_a_responses_reply(sim: SimServer) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="none")
    stream = await client.responses.create(
        model=sim.profile.model_name,
        instructions=words(7),
        input=words(20),
        max_output_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    kinds: list[str] = []
    deltas: list[str] = []
    final = None
    async for ev in stream:
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type == "response.completed":
            final = ev.response
    await client.close()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(deltas) == 12  # one per engine step, one token each
    assert final is not None and final.usage is not None
    assert final.status == "incomplete"  # cut at max_output_tokens, as vLLM reports it
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    # instructions: 5 + 7; the user's input: 5 + 20; the generation prompt: 3
    assert final.usage.input_tokens == 12 + 25 + 3
    assert final.usage.output_tokens == 12
    assert final.output_text == "".join(deltas)
    # the engine's text tokenizes back to exactly the generated tokens
    assert SimTokenizer().count(final.output_text) == 12


async def test_decoder_counts_a_responses_stream_exactly(sim: SimServer) -> None:
    body = DIALECTS["responses"].build(model=sim.profile.model_name, prompt=words(30), max_tokens=9)
    async with (
        aiohttp.ClientSession() as http,
        http.post(sim.url + dialect("responses").path, json=body) as resp,
    ):
        raw = await resp.read()
    dec = dialect("responses").decoder()
    assert isinstance(dec, ResponsesStreamDecoder)
    counts = [dec.feed(ev.data, ev.event) for ev in SSEParser().feed(raw)]
    assert sum(counts) == 9 and counts.count(1) == 9
    assert dec.done and dec.exact and dec.error is None
    assert dec.result_usage() == (30 + 8, 9, 0)


def test_decoder_is_inexact_when_deltas_and_usage_disagree() -> None:
    dec = ResponsesStreamDecoder()
    dec.feed(b'{"type":"response.output_text.delta","delta":" ab cd"}')
    dec.feed(
        b'{"type":"response.completed","response":{"usage":{"input_tokens":5,'
        b'"input_tokens_details":{"cached_tokens":0},"output_tokens":2}}}'
    )
    assert dec.done and not dec.exact


async def test_tool_call_on_a_user_turn_then_text_after_the_result(sim: SimServer) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="none")
    model = sim.profile.model_name
    first = await client.responses.create(
        model=model, input="list the files", tools=[BASH_TOOL], stream=True
    )  # type: ignore[list-item]
    args: list[str] = []
    done = None
    async for ev in first:
        if ev.type == "response.function_call_arguments.delta":
            args.append(ev.delta)
        if ev.type == "response.completed":
            done = ev.response
    assert done is not None
    call = done.output[0]
    assert call.type == "function_call" and call.name == "Bash"
    assert json.loads(call.arguments) == {"command": "ls"} and "".join(args) == call.arguments
    assert done.usage is not None and done.usage.output_tokens == len(args)
    # the agent sends the result back: the engine answers with text, not another call
    second = await client.responses.create(
        model=model,
        tools=[BASH_TOOL],
        max_output_tokens=5,  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "list the files"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "Bash",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
        ],
        extra_body={"ignore_eos": True},
    )
    await client.close()
    assert second.output[0].type == "message" and second.usage is not None
    assert second.usage.output_tokens == 5


async def test_a_namespaced_tool_is_called_in_its_namespace() -> None:
    """Codex offers its subagent tools inside a ``namespace`` tool (``multi_agent_v1``):
    the engine finds the tool there and names the namespace in its call, streamed or not."""
    import openai

    spawn = {
        "type": "function",
        "name": "spawn_agent",
        "description": "spawn",
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}},
    }
    tools = [
        BASH_TOOL,
        {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [spawn]},
    ]
    async with SimServer(
        SimProfile.load("fast"), tool_call=['spawn_agent={"message": "ls"}', LS]
    ) as s:
        client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none")
        for stream in (False, True):
            resp = await client.responses.create(
                model=s.profile.model_name, input="go", tools=tools, stream=stream
            )  # type: ignore[arg-type]
            if stream:
                done = None
                async for ev in resp:  # type: ignore[union-attr]
                    if ev.type == "response.completed":
                        done = ev.response
                resp = done
            call = resp.output[0].model_dump()  # type: ignore[union-attr]
            assert (call["type"], call["name"], call.get("namespace")) == (
                "function_call",
                "spawn_agent",
                "multi_agent_v1",
            )
        plain = await client.responses.create(
            model=s.profile.model_name, input="go", tools=[BASH_TOOL]
        )  # type: ignore[list-item]
        await client.close()
    assert plain.output[0].model_dump().get("namespace") is None


CLAUDE_TOOLS = [
    {
        "name": f"Tool{i}",
        "description": f"does thing number {i} " * 20,
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "where"},
                "limit": {"type": "integer"},
            },
            "required": ["path"],
        },
    }
    for i in range(24)
]


def expected_prompt(tools: list[dict[str, object]], system: str, messages: list[str]) -> int:
    """The documented template counted by hand: the tools message (5 + its text), the
    system message (5 + text), each message (5 + text), the generation prompt (3)."""
    tok = SimTokenizer()
    tools_text = "# Tools\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    n = 5 + tok.count(tools_text) + 5 + tok.count(system)
    return n + sum(5 + tok.count(m) for m in messages) + 3


async def test_tools_are_counted_in_the_prompt_of_every_api(sim: SimServer) -> None:
    model = sim.profile.model_name
    system = "You are an agent." * 30
    msgs = ["read the file", " it says hello", "now fix it"]
    want = expected_prompt(CLAUDE_TOOLS, system, msgs)
    assert want > 24 * 100  # the tools dominate, as with Claude Code
    roles = ["user", "assistant", "user"]
    bodies = {
        "messages": {
            "model": model,
            "max_tokens": 1,
            "system": system,
            "tools": CLAUDE_TOOLS,
            "messages": [{"role": r, "content": m} for r, m in zip(roles, msgs, strict=False)],
        },
        "chat": {
            "model": model,
            "max_tokens": 1,
            "tools": CLAUDE_TOOLS,
            "messages": [{"role": "system", "content": system}]
            + [{"role": r, "content": m} for r, m in zip(roles, msgs, strict=False)],
        },
        "responses": {
            "model": model,
            "max_output_tokens": 1,
            "instructions": system,
            "tools": CLAUDE_TOOLS,
            "input": [{"role": r, "content": m} for r, m in zip(roles, msgs, strict=False)],
        },
    }
    async with aiohttp.ClientSession() as http:
        for api, body in bodies.items():
            async with http.post(sim.url + dialect(api).path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                got = dialect(api).usage((await resp.json())["usage"])[0]
            assert got == want, api
        async with http.post(
            sim.url + "/v1/messages/count_tokens", json=bodies["messages"]
        ) as resp:
            assert (await resp.json())["input_tokens"] == want
