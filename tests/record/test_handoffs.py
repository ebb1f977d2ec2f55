"""Agents SDK handoffs as agent streams (``replay.record.agents.Handoffs``), on hand-made
conversations: a ``transfer_to_NAME`` call followed by another system prompt starts stream
NAME; its next turns stay there; handing back to an agent whose system prompt the session
had returns to its stream; the tracker then places spawn and join."""

from __future__ import annotations

from typing import Any

from agent_replay.replay.record.agents import MAIN, AgentTracker, Handoffs, handoff_target


def _call(name: str, call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def test_handoff_target_reads_the_last_reply_only() -> None:
    user = {"role": "user", "content": "2+2?"}
    assert handoff_target([user]) is None
    assert (
        handoff_target([user, _call("transfer_to_math_agent", "a"), _result("a")]) == "math_agent"
    )
    responses = [
        user,
        {"type": "function_call", "name": "transfer_to_triage", "call_id": "b"},
        {"type": "function_call_output", "call_id": "b", "output": "{}"},
    ]
    assert handoff_target(responses) == "triage"
    # an earlier reply's handoff is not this one's; other tools are not handoffs
    later = [
        user,
        _call("transfer_to_math_agent", "a"),
        _result("a"),
        _call("ls", "c"),
        _result("c"),
    ]
    assert handoff_target(later) is None
    assert handoff_target([user, _call("transfer_to_", "d"), _result("d")]) is None


def test_streams_spawn_and_join_across_a_handoff_and_back() -> None:
    triage = {"role": "system", "content": "You route questions."}
    maths = {"role": "system", "content": "You answer maths questions."}
    user = {"role": "user", "content": "2+2?"}
    h, agents = Handoffs(), AgentTracker()
    convs = [
        [triage, user],  # 0 main
        [maths, user, _call("transfer_to_math_agent", "a"), _result("a")],  # 1 maths
        [
            maths,
            user,
            _call("transfer_to_math_agent", "a"),
            _result("a"),
            _call("ls", "b"),
            _result("b"),
        ],  # 2 maths
        [
            triage,
            user,
            _call("transfer_to_math_agent", "a"),
            _result("a"),
            _call("ls", "b"),
            _result("b"),
            _call("transfer_to_triage", "c"),
            _result("c"),
        ],  # 3 main
    ]
    got = []
    for i, items in enumerate(convs):
        stream = h.stream("s", i, i - 1, True, None, items)
        got.append(
            (
                stream,
                agents.place("s", i, None if stream == MAIN else stream, 10 * i, i - 1).depends_on,
            )
        )
        agents.complete("s", i, 10 * i + 5)
    assert got == [(MAIN, []), ("math_agent", [0]), ("math_agent", [1]), (MAIN, [0, 2])]
    # another session starts over; a request without a conversation parent stays main
    assert h.stream("t", 0, -1, False, None, [maths, user]) == MAIN
    assert h.stream("t", 1, 0, False, None, convs[1]) == MAIN
