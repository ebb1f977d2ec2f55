"""The simulated engine's tool-call answers (``--tool-call``) and the client's own notes: a
user message made only of ``<system-reminder>`` blocks (Claude Code's notice that a
background subagent finished) is answered with text, so the subagents end; one with the
user's words beside reminders is a user's turn and gets the call."""

from __future__ import annotations

from typing import Any

import anthropic

from agent_replay.engines.sim import SimServer

AGENT = 'Agent={"description": "List files", "prompt": "ls", "subagent_type": "general-purpose"}'
TOOLS: Any = [
    {"name": "Agent", "description": "Run a subagent.", "input_schema": {"type": "object"}}
]
NOTICE = (
    "<system-reminder>\n[SYSTEM NOTIFICATION - NOT USER INPUT]\n<task-notification>\n"
    "<task-id>a1</task-id>\n<status>completed</status>\n</task-notification>\n"
    "</system-reminder>"
)


async def _kinds(content: Any) -> list[str]:
    async with SimServer("fast", seed=3, tool_call=AGENT) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.url, api_key="k", max_retries=0)
        r = await client.messages.create(
            model=sim.profile.model_name,
            max_tokens=20,
            tools=TOOLS,
            messages=[
                {"role": "user", "content": "list the files"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": content},
            ],
        )
        await client.close()
    return [b.type for b in r.content]


async def test_a_completion_notice_is_answered_with_text() -> None:
    note = {"type": "text", "text": "<system-reminder>\nBash was used\n</system-reminder>\n"}
    assert await _kinds([note, {"type": "text", "text": NOTICE}]) == ["text"]
    assert await _kinds(NOTICE) == ["text"]


async def test_the_users_words_beside_reminders_get_the_tool_call() -> None:
    note = {"type": "text", "text": "<system-reminder>\nBash was used\n</system-reminder>\n"}
    assert await _kinds([note, {"type": "text", "text": "list them again"}]) == ["tool_use"]
    assert await _kinds("list them again") == ["tool_use"]


async def test_qwen_codes_completion_notice_is_answered_with_text() -> None:
    """qwen-code (chat completions) tells the main agent in a user message of its own
    that opens with ``<task-notification>``."""
    import openai

    notice = (
        "<task-notification>\n<task-id>general-purpose-call_1</task-id>\n"
        "<status>completed</status>\n</task-notification>"
    )
    tools: Any = [
        {"type": "function", "function": {"name": "Agent", "parameters": {"type": "object"}}}
    ]

    async def calls(content: Any) -> bool:
        async with SimServer("fast", seed=3, tool_call=AGENT) as sim:
            client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="k", max_retries=0)
            r = await client.chat.completions.create(
                model=sim.profile.model_name,
                max_tokens=20,
                tools=tools,
                messages=[
                    {"role": "user", "content": "list the files"},
                    {"role": "assistant", "content": "done"},
                    {"role": "user", "content": content},
                ],
            )
            await client.close()
        return bool(r.choices[0].message.tool_calls)

    assert not await calls([{"type": "text", "text": notice}])
    assert await calls([{"type": "text", "text": "list them again"}])
