"""Session and parent inference on conversations, with hand-computed expectations."""

from __future__ import annotations

from typing import Any

from agent_replay.replay.record.content import conversation
from agent_replay.replay.record.replies import Reply
from agent_replay.replay.record.sessions import SessionTracker


def user(t: str) -> dict[str, Any]:
    return {"role": "user", "content": t}


def asst(t: str, call: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": t}
    if call:
        m["tool_calls"] = [
            {"id": call, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
    return m


def tool(call: str, out: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call, "content": out}


def conv(*msgs: dict[str, Any]) -> list[Any]:
    return conversation("chat", {"messages": list(msgs)})


def test_linear_conversation_with_tools() -> None:
    tr = SessionTracker()
    sys_ = {"role": "system", "content": "you are helpful"}
    a1, t1 = tr.assign(1_000, conv(sys_, user("fix it")))
    assert (a1.session_id, a1.request_index, a1.parent_index, a1.think_ns) == (
        "auto-00001",
        0,
        -1,
        None,
    )
    tr.complete(t1, 5_000, Reply("looking", ("c1",)))
    a2, t2 = tr.assign(7_500, conv(sys_, user("fix it"), asst("looking", "c1"), tool("c1", "ok")))
    assert (a2.session_id, a2.request_index, a2.parent_index, a2.think_ns) == (
        "auto-00001",
        1,
        0,
        2_500,
    )
    tr.complete(t2, 9_000, Reply("done", ()))
    a3, _ = tr.assign(
        19_000,
        conv(
            sys_,
            user("fix it"),
            asst("looking", "c1"),
            tool("c1", "ok"),
            asst("done"),
            user("thanks"),
        ),
    )
    assert (a3.request_index, a3.parent_index, a3.think_ns, a3.how) == (2, 1, 10_000, "prefix")
    assert tr.session_count == 1


def test_interleaved_sessions_with_identical_openings_follow_their_replies() -> None:
    tr = SessionTracker()
    a, ta = tr.assign(0, conv(user("same task")))
    b, tb = tr.assign(10, conv(user("same task")))
    assert a.session_id != b.session_id
    tr.complete(tb, 100, Reply("reply B", ("call_b",)))
    tr.complete(ta, 200, Reply("reply A", ("call_a",)))
    # session A's second turn arrives first, and after B's reply was registered
    a2, _ = tr.assign(300, conv(user("same task"), asst("reply A", "call_a"), tool("call_a", "x")))
    b2, _ = tr.assign(310, conv(user("same task"), asst("reply B", "call_b"), tool("call_b", "y")))
    assert (a2.session_id, a2.parent_index, a2.think_ns) == (a.session_id, 0, 100)
    assert (b2.session_id, b2.parent_index, b2.think_ns) == (b.session_id, 0, 210)


def test_text_reply_match_when_no_tool_calls() -> None:
    tr = SessionTracker()
    _, t1 = tr.assign(0, conv(user("q")))
    _, t2 = tr.assign(0, conv(user("q")))
    tr.complete(t1, 10, Reply("alpha beta", ()))
    tr.complete(t2, 20, lambda: Reply("gamma", ()))  # computed only when asked
    n, _ = tr.assign(50, conv(user("q"), asst("alpha   beta\n"), user("more")))
    assert (n.session_id, n.parent_index, n.think_ns) == ("auto-00001", 0, 40)
    m, _ = tr.assign(60, conv(user("q"), asst("gamma"), user("more")))
    assert (m.session_id, m.parent_index, m.think_ns) == ("auto-00002", 0, 40)


def test_branching_gives_siblings_with_one_parent() -> None:
    tr = SessionTracker()
    _, t0 = tr.assign(0, conv(user("start")))
    tr.complete(t0, 10, Reply("r", ()))
    x, _tx = tr.assign(20, conv(user("start"), asst("r"), user("option 1")))
    y, ty = tr.assign(25, conv(user("start"), asst("r"), user("option 2")))
    assert (x.session_id, x.request_index, x.parent_index) == ("auto-00001", 1, 0)
    assert (y.session_id, y.request_index, y.parent_index) == ("auto-00001", 2, 0)
    tr.complete(ty, 40, Reply("r2", ()))
    # continuing branch 2 picks its own parent, not branch 1
    z, _ = tr.assign(50, conv(user("start"), asst("r"), user("option 2"), asst("r2"), user("go")))
    assert (z.request_index, z.parent_index, z.think_ns) == (3, 2, 10)


def test_retry_of_the_same_request_is_a_sibling() -> None:
    tr = SessionTracker()
    _, t0 = tr.assign(0, conv(user("a")))
    tr.complete(t0, 10, Reply("b", ()))
    r1, t1 = tr.assign(20, conv(user("a"), asst("b"), user("c")))
    tr.complete(t1, 30, None)  # failed
    r2, _ = tr.assign(40, conv(user("a"), asst("b"), user("c")))
    assert (r1.parent_index, r2.parent_index, r2.request_index) == (0, 0, 2)


def test_explicit_sessions() -> None:
    tr = SessionTracker()
    a, ta = tr.assign(0, conv(user("x")), explicit="alice")
    assert (a.session_id, a.request_index, a.parent_index, a.how) == ("alice", 0, -1, "explicit")
    tr.complete(ta, 100, Reply("y", ()))
    # a new conversation in the same explicit session: parent is the last finished request
    b, tb = tr.assign(150, conv(user("unrelated")), explicit="alice")
    assert (b.session_id, b.request_index, b.parent_index, b.think_ns) == ("alice", 1, 0, 50)
    # the same conversation under another explicit id does not cross sessions
    c, _ = tr.assign(160, conv(user("x"), asst("y"), user("z")), explicit="bob")
    assert (c.session_id, c.parent_index) == ("bob", -1)
    tr.complete(tb, 200, Reply("u", ()))
    d, _ = tr.assign(260, conv(user("x"), asst("y"), user("z")), explicit="alice")
    assert (d.parent_index, d.think_ns, d.how) == (0, 160, "explicit+prefix")


def test_anthropic_cache_control_moves_do_not_break_the_chain() -> None:
    tr = SessionTracker()
    m1 = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    _, t = tr.assign(0, conversation("messages", {"messages": m1}))
    tr.complete(t, 5, Reply("yo", ("toolu_1",)))
    m2 = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "yo"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "ok",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    a, _ = tr.assign(9, conversation("messages", {"messages": m2}))
    assert (a.session_id, a.parent_index, a.think_ns) == ("auto-00001", 0, 4)


def test_responses_items() -> None:
    tr = SessionTracker()
    _, t = tr.assign(0, conversation("responses", {"input": "go"}))
    tr.complete(t, 5, Reply("", ("fc_1",)))
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "fc_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc_1", "output": "1"},
    ]
    a, _ = tr.assign(8, conversation("responses", {"input": items}))
    assert (a.session_id, a.parent_index, a.think_ns) == ("auto-00001", 0, 3)


def test_memory_bound_forgets_oldest() -> None:
    tr = SessionTracker(memory=2)
    _, t0 = tr.assign(0, conv(user("a")))
    tr.complete(t0, 1, Reply("b", ()))
    for i in range(2):
        tr.assign(2 + i, conv(user(f"other {i}")))
    a, _ = tr.assign(10, conv(user("a"), asst("b"), user("c")))
    assert a.parent_index == -1 and a.how == "new"


def test_handoff_that_replaces_the_system_message_continues_the_session() -> None:
    """An Agents SDK handoff on Chat Completions: the triage agent's reply calls the
    transfer tool; the next request, with the other agent's system message, sends that
    call and its result back. Same session, the triage request its parent; a request
    that carries no earlier reply still starts its own session."""
    tr = SessionTracker()
    triage = {"role": "system", "content": "You route questions."}
    expert = {"role": "system", "content": "You answer maths questions."}
    a1, t1 = tr.assign(0, conv(triage, user("what is 2+2?")))
    tr.complete(t1, 100, Reply("", ("call_transfer",)))
    a2, t2 = tr.assign(
        150,
        conv(
            expert,
            user("what is 2+2?"),
            asst("", "call_transfer"),
            tool("call_transfer", '{"assistant": "Math"}'),
        ),
    )
    assert (a2.session_id, a2.parent_index, a2.think_ns, a2.how) == (a1.session_id, 0, 50, "prefix")
    tr.complete(t2, 300, Reply("4", ()))
    other, _ = tr.assign(400, conv(expert, user("what is 3+3?")))
    assert other.session_id != a1.session_id


REMINDER = "\n\nReply in the format asked for."


def test_a_rewritten_history_that_carries_the_reply_continues_the_session() -> None:
    """aider appends a reminder to the user's message and sends that message back without
    it on the next turn: no earlier conversation begins the next one, yet it carries the
    first turn's reply (rule 2b). Parent: the turn whose reply comes last; a conversation
    whose reply matches but begins with another item, or whose matching request had not
    finished, starts a session of its own."""
    tr = SessionTracker()
    sys_ = {"role": "system", "content": "you edit code"}
    a1, t1 = tr.assign(1_000, conv(sys_, user("add a test" + REMINDER)))
    tr.complete(t1, 5_000, Reply("Here it is.", ()))
    a2, t2 = tr.assign(
        8_000, conv(sys_, user("add a test"), asst("Here it is."), user("and a doc" + REMINDER))
    )
    assert (a2.session_id, a2.request_index, a2.parent_index, a2.think_ns, a2.how) == (
        a1.session_id,
        1,
        0,
        3_000,
        "reply",
    )
    # a third turn: the last reply carried is the second's
    tr.complete(t2, 9_000, Reply("Done.", ()))
    a3, _ = tr.assign(
        12_000,
        conv(
            sys_,
            user("add a test"),
            asst("Here it is."),
            user("and a doc"),
            asst("Done."),
            user("thanks" + REMINDER),
        ),
    )
    assert (a3.session_id, a3.parent_index, a3.think_ns) == (a1.session_id, 1, 3_000)
    # the same reply text in a conversation that opens otherwise: not this session's
    other, _ = tr.assign(
        13_000,
        conv({"role": "system", "content": "another agent"}, user("x"), asst("Done."), user("y")),
    )
    assert (other.session_id, other.parent_index, other.how) == ("auto-00002", -1, "new")
    # a reply still streaming when the request arrived cannot have been sent back
    tr2 = SessionTracker()
    _, u1 = tr2.assign(0, conv(sys_, user("q" + REMINDER)))
    b2, _ = tr2.assign(100, conv(sys_, user("q"), asst("A."), user("r")))
    tr2.complete(u1, 200, Reply("A.", ()))
    assert (b2.session_id, b2.how) == ("auto-00002", "new")
