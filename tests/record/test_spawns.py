"""Subagents that name no session (qwen-code's): found by the task a tool call handed them
(``replay.record.spawns``), on hand-made responses and through the recorder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson

from agent_replay.engines.sim import SimServer
from agent_replay.engines.sse import SSEEvent
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.spawns import Spawns, argument_text, task_text
from agent_replay.traces.io import read_trace


def _ev(obj: Any, event: str | None = None) -> SSEEvent:
    return SSEEvent(event, orjson.dumps(obj))


def test_argument_text_of_each_api() -> None:
    chat = [
        _ev(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "c1",
                                    "function": {"name": "agent", "arguments": '{"pro'},
                                }
                            ]
                        },
                    }
                ]
            }
        ),
        _ev(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": 0, "function": {"arguments": 'mpt": "go"}'}}]
                        },
                    }
                ]
            }
        ),
        _ev({"choices": [{"index": 0, "delta": {"content": "not an argument"}}]}),
    ]
    assert argument_text(chat) == '{"prompt": "go"}'
    messages = [
        _ev(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"prompt": "go"}'},
            },
            "content_block_delta",
        )
    ]
    assert argument_text(messages) == '{"prompt": "go"}'
    responses = [
        _ev({"type": "response.function_call_arguments.delta", "delta": '{"a": 1}'}),
        _ev({"type": "response.output_text.delta", "delta": "text"}),
    ]
    assert argument_text(responses) == '{"a": 1}'
    body = {
        "choices": [
            {
                "message": {
                    "tool_calls": [
                        {"id": "c", "function": {"name": "agent", "arguments": '{"prompt": "go"}'}}
                    ]
                }
            }
        ]
    }
    assert argument_text([], body) == '{"prompt": "go"}'
    assert (
        argument_text(
            [
                _ev(
                    {
                        "candidates": [
                            {
                                "content": {
                                    "parts": [
                                        {
                                            "functionCall": {
                                                "name": "agent",
                                                "args": {"prompt": "go"},
                                            }
                                        }
                                    ]
                                }
                            }
                        ]
                    }
                )
            ]
        )
        == '{"prompt":"go"}'
    )


def test_task_text_is_the_first_user_messages_last_text() -> None:
    sys_ = {"role": "system", "content": "You are a subagent."}
    parts = [
        {"type": "text", "text": "<system-reminder>context</system-reminder>"},
        {"type": "text", "text": " List the files here. "},
    ]
    assert task_text([sys_, {"role": "user", "content": parts}]) == "List the files here."
    assert task_text([sys_, {"role": "user", "content": "short"}]) is None  # < MIN_TASK
    assert task_text([sys_]) is None


def test_the_spawner_is_the_latest_finished_request_whose_call_held_the_task() -> None:
    sp = Spawns()
    task = 'Say "hi"\nthen stop.'
    args = orjson.dumps({"prompt": task}).decode()
    calls: list[str] = []

    def told(text: str) -> Any:
        def fn() -> str:
            calls.append(text)
            return text

        return fn

    sp.finished("a", 100, told(args))
    sp.finished("b", 200, told('{"prompt": "something else entirely"}'))
    sp.finished("c", 900, told(args))  # finished after the subagent arrived
    items = [{"role": "system", "content": "sub"}, {"role": "user", "content": task}]
    assert sp.spawner(items, 500) == "a"
    assert sp.spawner(items, 1000) == "c"
    assert sp.spawner([{"role": "user", "content": "nothing handed this over"}], 1000) is None
    assert sorted(calls) == sorted([args, args, '{"prompt": "something else entirely"}'])
    assert (sp.name("a"), sp.name("a"), sp.name("c")) == ("spawned-1", "spawned-2", "spawned-1")


TOOL: Any = [
    {
        "type": "function",
        "function": {
            "name": "agent",
            "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}}},
        },
    }
]
TASK = "Count the files in this folder."


async def test_a_subagent_naming_nothing_is_a_stream_of_its_session(tmp_path: Path) -> None:
    """A main agent whose reply calls ``agent`` with a task; a subagent whose conversation
    (another system prompt) ends with that task, two turns; then the main agent's next turn
    after the subagent ended. One session: the subagent's stream is spawned by the main
    turn that called the tool, and the main agent's next turn joins it."""
    trace = tmp_path / "trace"
    spec = "agent=" + orjson.dumps({"prompt": TASK}).decode()
    async with (
        SimServer("fast", seed=3, tool_call=[spec]) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = openai.AsyncOpenAI(base_url=rec.url + "/v1", api_key="k", max_retries=0)
        model = sim.profile.model_name

        async def ask(msgs: list[Any]) -> Any:
            r = await client.chat.completions.create(
                model=model, max_tokens=8, tools=TOOL, messages=msgs
            )
            return r.choices[0].message

        main = [
            {"role": "system", "content": "You are the main agent."},
            {"role": "user", "content": "Please count the files."},
        ]
        call = await ask(main)
        assert call.tool_calls and TASK in call.tool_calls[0].function.arguments
        main += [
            call.model_dump(exclude_none=True),
            {
                "role": "tool",
                "tool_call_id": call.tool_calls[0].id,
                "content": "Background agent launched.",
            },
        ]
        sub = [
            {"role": "system", "content": "You are a subagent."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "<context/>"}, {"type": "text", "text": TASK}],
            },
        ]
        sub_call = await ask(sub)  # offers the tool on a user's turn: calls it again
        sub += [
            sub_call.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": sub_call.tool_calls[0].id, "content": "3"},
        ]
        await ask(sub)
        await ask(main)
        await client.close()
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    got = [(r["session_id"], r["request_index"], r["agent_id"], r["depends_on"]) for r in rows]
    sid = rows[0]["session_id"]
    assert got == [
        (sid, 0, "main", []),
        (sid, 1, "spawned-1", [0]),
        (sid, 2, "spawned-1", [1]),
        (sid, 3, "main", [0, 2]),
    ]
