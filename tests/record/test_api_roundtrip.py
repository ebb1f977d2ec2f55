"""Recordings replay with their own API: a Codex-style Responses session with a tool call
and Claude Code-shaped Messages sessions (many tools) go through the recorder to the
simulated engine and replay against a fresh one with the same tokens and sessions; the
hash ids of conversations that share tools and system share exactly that prefix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProcess, SimServer, SimTokenizer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.content import prompt_parts, render
from agent_replay.traces.io import read_trace

if TYPE_CHECKING:  # imported by the tests that use it (tests/conftest.py says why)
    import openai

MODEL = "sim-fast"
BASH = {
    "type": "function",
    "name": "Bash",
    "description": "Run a shell command",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


async def _codex_like(client: openai.AsyncOpenAI, task: str) -> None:
    """A Responses agent: the task, the model's tool call, the tool's output back."""
    items: list[Any] = [{"role": "user", "content": task}]
    for _ in range(2):
        stream = await client.responses.create(
            model=MODEL,
            instructions="You are Codex.",
            input=items,
            tools=[BASH],  # type: ignore[list-item]
            stream=True,
            max_output_tokens=40,
        )
        final = None
        async for ev in stream:
            if ev.type == "response.completed":
                final = ev.response
        assert final is not None
        out = final.output[0]
        if out.type != "function_call":
            break
        items.append(
            {
                "type": "function_call",
                "call_id": out.call_id,
                "name": out.name,
                "arguments": out.arguments,
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": out.call_id, "output": "README.md\nsrc"}
        )


async def _replay(trace: Path, out: Path) -> list[dict]:
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    with SimProcess("fast", seed=4) as target:
        summary = await arun(
            RunConfig(
                trace=str(trace),
                target=target.url,
                output=str(out),
                progress=False,
                scrape_interval_s=0,
            ),
            progress=None,
        )
    assert summary.failed == 0
    return pq.read_table(out / "requests").to_pylist()


@pytest.mark.slow
async def test_a_responses_session_with_a_tool_call_replays_with_responses(tmp_path: Path) -> None:
    import openai

    trace = tmp_path / "trace"
    async with (
        SimServer("fast", seed=3, tool_call='Bash={"command": "ls"}') as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = openai.AsyncOpenAI(base_url=rec.url + "/v1", api_key="k", max_retries=0)
        await _codex_like(client, "list the files")
        await client.close()
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["request_index"])
    assert [r["api"] for r in rows] == ["responses", "responses"]
    assert [(r["session_id"], r["parent_index"]) for r in rows] == [
        ("auto-00001", -1),
        ("auto-00001", 0),
    ]
    assert all(r["error"] is None and r["exact_chunk_tokens"] for r in rows)
    assert rows[0]["output_tokens"] == len(SimTokenizer().pieces('{"command": "ls"}'))
    res = await _replay(trace, tmp_path / "results")
    assert len(res) == 2
    by_index = {r["request_index"]: r for r in res}
    for r in rows:
        x = by_index[r["request_index"]]
        assert x["api"] == "responses" and x["status"] == "ok", x["error"]
        assert x["prompt_tokens"] == r["input_tokens"]
        assert x["completion_tokens"] == r["output_tokens"]
        assert x["parent_index"] == r["parent_index"]


CLAUDE_TOOLS = [
    {
        "name": f"Tool{i}",
        "description": f"Tool {i} reads and writes things. " * 25,
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "absolute path"},
                "limit": {"type": "integer", "description": "lines"},
            },
            "required": ["file_path"],
        },
    }
    for i in range(24)
]
SYSTEM = [{"type": "text", "text": "You are Claude Code, a coding agent. " * 30}]


def _rendered_count(tools: list[Any], system: list[Any], messages: list[Any]) -> int:
    """The simulated engine's template counted by hand (docs/sim-engine.md)."""
    tok = SimTokenizer()
    tools_text = "# Tools\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    n = 5 + tok.count(tools_text) + 5 + tok.count("".join(b["text"] for b in system))
    return n + sum(5 + tok.count(m["content"]) for m in messages) + 3


async def test_claude_code_shaped_requests_count_and_hash_the_whole_request(tmp_path: Path) -> None:
    import anthropic

    trace = tmp_path / "trace"
    firsts = [
        "Fix the failing test in tests/test_io.py please.",
        "Write a README section about installation.",
    ]
    async with (
        SimServer("fast", seed=3) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60, hash_seed=11) as rec,
    ):
        client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="k", max_retries=0)
        for text in firsts:
            msgs = [{"role": "user", "content": text}]
            async with client.messages.stream(
                model=MODEL,
                max_tokens=16,
                system=SYSTEM,  # type: ignore[arg-type]
                tools=CLAUDE_TOOLS,
                messages=msgs,
            ) as s:  # type: ignore[arg-type]
                await s.get_final_message()
        await client.close()
    table, meta = read_trace(trace)
    rows = sorted(table.to_pylist(), key=lambda r: r["arrival_ns"])
    for r, text in zip(rows, firsts, strict=True):
        want = _rendered_count(CLAUDE_TOOLS, SYSTEM, [{"content": text}])
        assert r["input_tokens"] == want  # tools + system + messages, as the engine counts
        assert len(r["hash_ids"]) == -(-want // meta.block_size)
    # the shared prefix is the blocks inside the rendered tools and system, cut where the
    # engine's token count puts them: the first prompt's blocks spread evenly over its bytes
    body = {"tools": CLAUDE_TOOLS, "system": SYSTEM, "messages": []}
    shared = len("".join(render(p) for p in prompt_parts("messages", body)).encode())
    first = {**body, "messages": [{"role": "user", "content": firsts[0]}]}
    size = len("".join(render(p) for p in prompt_parts("messages", first)).encode())
    per_block = size / rows[0]["input_tokens"] * meta.block_size
    a, b = rows[0]["hash_ids"], rows[1]["hash_ids"]
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert int(shared // per_block) - 1 <= common <= int(shared // per_block) and common > 20
    # as many blocks as the engine counts tokens in the shared part, give or take one
    assert abs(common - _rendered_count(CLAUDE_TOOLS, SYSTEM, []) // meta.block_size) <= 1
    assert not set(a[common:]) & set(b[common:])
