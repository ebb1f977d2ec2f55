"""Session inference beyond reply matching (dropped replies, retries), agent streams with
spawn and join, and the session headers real agents send. Hand-computed expectations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from agent_replay.replay.record.agents import MAIN, AgentTracker
from agent_replay.replay.record.content import conversation
from agent_replay.replay.record.replies import Reply
from agent_replay.replay.record.sessions import SessionTracker
from agent_replay.replay.record.wire import header_session


def user(t: str) -> dict[str, Any]:
    return {"role": "user", "content": t}


def asst(t: str) -> dict[str, Any]:
    return {"role": "assistant", "content": t}


def conv(*msgs: dict[str, Any]) -> list[Any]:
    return conversation("chat", {"messages": list(msgs)})


SYS = {"role": "system", "content": "you are an agent"}
TOOLS: Any = [{"name": "ls", "description": "List files.", "input_schema": {"type": "object"}}]
"""An agent's requests offer tools (one that offers none and carries no earlier reply is
a side request, a title)."""


def test_a_child_that_dropped_the_reply_continues_the_session() -> None:
    # mini-swe-agent: a malformed reply is not sent back; only a user message is appended
    tr = SessionTracker()
    a, ta = tr.assign(0, conv(SYS, user("task")))
    tr.complete(ta, 100, Reply("no code block here", ()))
    b, tb = tr.assign(130, conv(SYS, user("task"), user("format error: one bash block")))
    assert (b.session_id, b.request_index, b.parent_index, b.think_ns, b.how) == (
        a.session_id,
        1,
        0,
        30,
        "prefix",
    )
    tr.complete(tb, 200, Reply("```bash\nls\n```", ()))
    # the next turn keeps the reply and extends the longer conversation: its parent is 1
    c, _ = tr.assign(
        260,
        conv(
            SYS,
            user("task"),
            user("format error: one bash block"),
            asst("```bash\nls\n```"),
            user("a.txt"),
        ),
    )
    assert (c.session_id, c.parent_index, c.think_ns) == (a.session_id, 1, 60)
    assert tr.session_count == 1


def test_a_prefix_still_running_is_not_a_parent() -> None:
    tr = SessionTracker()
    _, _ = tr.assign(0, conv(user("task")))  # still running
    b, _ = tr.assign(10, conv(user("task"), user("more")))
    assert (b.session_id, b.parent_index, b.how) == ("auto-00002", -1, "new")


def test_retries_of_a_first_request_stay_in_its_session() -> None:
    tr = SessionTracker()
    a, ta = tr.assign(0, conv(user("go")))
    tr.complete(ta, 50, None)  # failed
    r1, t1 = tr.assign(60, conv(user("go")))
    tr.complete(t1, 90, None)  # failed again
    r2, t2 = tr.assign(100, conv(user("go")))
    assert [(x.session_id, x.request_index, x.parent_index, x.how) for x in (a, r1, r2)] == [
        ("auto-00001", 0, -1, "new"),
        ("auto-00001", 1, -1, "retry"),
        ("auto-00001", 2, -1, "retry"),
    ]
    tr.complete(t2, 150, Reply("ok", ()))
    # the next turn follows the retry that succeeded
    n, _ = tr.assign(170, conv(user("go"), asst("ok"), user("next")))
    assert (n.session_id, n.parent_index, n.think_ns) == ("auto-00001", 2, 20)


def test_an_identical_request_after_a_success_is_a_new_session() -> None:
    tr = SessionTracker()
    _, ta = tr.assign(0, conv(user("go")))
    tr.complete(ta, 50, Reply("ok", ()))
    b, _ = tr.assign(60, conv(user("go")))
    assert (b.session_id, b.how) == ("auto-00002", "new")


def test_session_headers_of_real_agents_by_default() -> None:
    h = CIMultiDict({"x-claude-code-session-id": "cc-1"})
    assert header_session(h, "X-Session-ID") == "cc-1"
    assert header_session(CIMultiDict({"session_id": "codex-9"}), "X-Session-ID") == "codex-9"
    assert header_session(CIMultiDict({"thread-id": "t-3"}), "X-Session-ID") == "t-3"
    # the configured header comes first
    both = CIMultiDict({"X-Session-ID": "mine", "X-Claude-Code-Session-Id": "cc"})
    assert header_session(both, "X-Session-ID") == "mine"
    assert header_session(CIMultiDict({"X-Other": "x"}), "X-Other") == "x"
    assert header_session(CIMultiDict(), "X-Session-ID") is None


def test_subagents_spawn_from_the_main_turn_and_join_it() -> None:
    """Main turns 0, 1; subagents A (turns 2, 4) and B (turn 3) spawned by turn 1; main
    turn 5 arrives after both finished and joins them; main turn 6 follows 5 only."""
    at = AgentTracker()
    p0 = at.place("s", 0, None, 0, -1)
    at.complete("s", 0, 100)
    p1 = at.place("s", 1, None, 150, 0)
    at.complete("s", 1, 300)
    a1 = at.place("s", 2, "agent-a", 320, 1)
    b1 = at.place("s", 3, "agent-b", 325, 1)
    at.complete("s", 2, 400)
    a2 = at.place("s", 4, "agent-a", 450, 2)
    at.complete("s", 3, 500)
    at.complete("s", 4, 600)
    m = at.place("s", 5, None, 640, 1)
    at.complete("s", 5, 700)
    m2 = at.place("s", 6, None, 710, 5)
    got = [(p.agent_id, p.depends_on, p.think_ns) for p in (p0, p1, a1, b1, a2, m, m2)]
    assert got == [
        (MAIN, [], None),
        (MAIN, [0], 50),
        ("agent-a", [1], 20),
        ("agent-b", [1], 25),
        ("agent-a", [2], 50),
        (MAIN, [1, 3, 4], 40),  # after the later of the subagents' ends (600)
        (MAIN, [5], 10),
    ]


def test_nested_subagents_join_their_own_spawner() -> None:
    """main 0 spawns A (1); A spawns B (2); B ends; A's next turn (3) joins B; A ends; main's
    next turn (4) joins A only."""
    at = AgentTracker()
    at.place("s", 0, None, 0, -1)
    at.complete("s", 0, 10)
    a1 = at.place("s", 1, "A", 20, 0)
    at.complete("s", 1, 30)
    b1 = at.place("s", 2, "B", 40, 1)
    at.complete("s", 2, 50)
    a2 = at.place("s", 3, "A", 60, 1)
    at.complete("s", 3, 70)
    m = at.place("s", 4, None, 80, 0)
    assert [p.depends_on for p in (a1, b1, a2, m)] == [[0], [1], [1, 2], [0, 3]]
    assert [p.think_ns for p in (a1, b1, a2, m)] == [10, 10, 10, 10]


def test_a_subagent_still_running_is_not_joined() -> None:
    at = AgentTracker()
    at.place("s", 0, None, 0, -1)
    at.complete("s", 0, 10)
    at.place("s", 1, "bg", 20, 0)  # running in the background
    m = at.place("s", 2, None, 30, 0)
    assert m.depends_on == [0]
    at.complete("s", 1, 40)
    m2 = at.place("s", 3, None, 50, 2)
    assert m2.depends_on == [1, 2]


async def test_recorded_agent_streams_are_written_and_validate(tmp_path: Path) -> None:
    """Through the proxy: main turn, a subagent (two turns, same opening as the main
    agent's), then the main agent's next turn; the trace holds agent_id and depends_on and
    passes validation."""
    import anthropic

    from agent_replay.engines.sim import SimServer
    from agent_replay.replay.record import Recorder
    from agent_replay.traces.io import read_trace
    from agent_replay.traces.validate import validate_or_raise

    trace = tmp_path / "t"
    sess = {"X-Claude-Code-Session-Id": "cc-7"}
    sub = {**sess, "x-claude-code-agent-id": "agent-1"}
    async with (
        SimServer("fast") as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="k", max_retries=0)

        async def turn(msgs: list[dict[str, Any]], headers: dict[str, str]) -> str:
            r = await client.messages.create(
                model="sim-fast",
                max_tokens=5,
                messages=msgs,  # type: ignore[arg-type]
                tools=TOOLS,
                extra_headers=headers,
            )
            return r.content[0].text  # type: ignore[union-attr]

        opening = [user("look at the repo")]
        r0 = await turn(opening, sess)
        s0 = await turn(opening, sub)  # the subagent opens with the same words
        await turn([*opening, asst(s0), user("go on")], sub)
        await turn([*opening, asst(r0), user("subagent says: done")], sess)
        await client.close()
    table, meta = read_trace(trace)
    validate_or_raise(table, meta, str(trace))
    rows = sorted(table.to_pylist(), key=lambda r: r["request_index"])
    got = [(r["session_id"], r["agent_id"], r["parent_index"], r["depends_on"]) for r in rows]
    assert got == [
        ("cc-7", "main", -1, []),
        ("cc-7", "agent-1", 0, [0]),
        ("cc-7", "agent-1", 1, [1]),
        ("cc-7", "main", 0, [0, 2]),
    ]
    last = rows[3]
    assert last["think_ns"] == last["arrival_ns"] - rows[2]["arrival_ns"] - rows[2]["end_ns"]


def test_side_requests_and_parallel_branches_stay_concurrent() -> None:
    """Claude Code's interactive turn: a title request (a side request: no conversation
    parent, no tools) and, 8 ms later, the turn that continues the conversation. The title
    goes in a lane of its own (each title does) and depends on the turn that ended before it; the turn does
    not wait for the title, and nothing later does. A branch whose parent already has a
    successor (a parallel request) opens a lane of its own; each lane stays a sequence."""
    at = AgentTracker()
    t0 = at.place("s", 0, None, 0, -1, linked=False)  # the first turn
    at.complete("s", 0, 100)
    title = at.place("s", 1, None, 5_000, 0, linked=False, side=True)
    turn = at.place("s", 2, None, 5_008, 0)  # the title still running
    at.complete("s", 1, 5_300)
    at.complete("s", 2, 6_000)
    tool = at.place("s", 3, None, 6_050, 2)
    branch = at.place("s", 4, None, 6_060, 2)  # the same parent, side by side with 3
    at.complete("s", 3, 7_000)
    at.complete("s", 4, 7_100)
    title2 = at.place("s", 5, None, 9_000, 4, linked=False, side=True)  # ended last: 4
    turn2 = at.place("s", 6, None, 9_001, 3)
    got = [
        (p.agent_id, p.depends_on, p.think_ns)
        for p in (t0, title, turn, tool, branch, title2, turn2)
    ]
    assert got == [
        (MAIN, [], None),
        ("main/2", [0], 4_900),
        (MAIN, [0], 4_908),
        (MAIN, [2], 50),
        ("main/3", [2], 60),
        ("main/4", [4], 1_900),  # a lane of its own again
        (MAIN, [3], 2_001),
    ]


def test_a_title_sent_first_is_no_dependency() -> None:
    """Claude Code -p: the title (no tools) first, the first turn (tools) 2 ms later, after
    the title ended; the first turn waits for nothing, and the session's explicit
    last-finished parent (the title) is not made a dependency."""
    at = AgentTracker()
    title = at.place("s", 0, None, 0, -1, linked=False, side=True)
    at.complete("s", 0, 1_000)
    turn = at.place("s", 1, None, 2_000, 0, linked=False)
    at.complete("s", 1, 3_000, True)
    turn2 = at.place("s", 2, None, 3_100, 1)
    assert [(p.agent_id, p.depends_on) for p in (title, turn, turn2)] == [
        (MAIN, []),
        ("main/2", []),
        ("main/2", [1]),
    ]


def test_a_subagent_is_spawned_by_the_turn_that_called_a_tool() -> None:
    """Interactive Claude Code: a title and the turn that calls the Agent tool; the title
    ends last, and a text-only turn of another stream ends later still; the subagent's
    first turn is spawned by the tool-calling turn, and the main turn after the
    subagent's end joins it."""
    at = AgentTracker()
    at.place("s", 0, None, 0, -1, linked=False)
    at.complete("s", 0, 100, True)  # called the Agent tool
    at.place("s", 1, None, 10, -1, linked=False, side=True)  # the title
    at.complete("s", 1, 150, False)
    sub = at.place("s", 2, "agent-a", 200, 0, linked=False)
    at.complete("s", 2, 300, False)
    join = at.place("s", 3, None, 320, 0)
    assert (sub.agent_id, sub.depends_on, sub.think_ns) == ("agent-a", [0], 100)
    assert (join.agent_id, join.depends_on, join.think_ns) == (MAIN, [0, 2], 20)


async def test_child_sessions_are_streams_of_their_root_session(tmp_path: Path) -> None:
    """opencode's subagent: a child session (X-Session-Id) whose requests name their parent
    session (x-parent-session-id), nested twice. Every request lands in the root session;
    each child session is a stream spawned by the turn that ended before it."""
    import anthropic

    from agent_replay.engines.sim import SimServer
    from agent_replay.replay.record import Recorder
    from agent_replay.traces.io import read_trace
    from agent_replay.traces.validate import validate_or_raise

    trace = tmp_path / "t"
    root = {"X-Session-Id": "ses_root"}
    child = {"X-Session-Id": "ses_child", "x-parent-session-id": "ses_root"}
    grandchild = {"X-Session-Id": "ses_grand", "x-parent-session-id": "ses_child"}
    async with (
        SimServer("fast") as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="k", max_retries=0)
        for headers in (root, child, grandchild, root):
            await client.messages.create(
                model="sim-fast",
                max_tokens=5,
                tools=TOOLS,
                messages=[user("do it")],
                extra_headers=headers,
            )
        await client.close()
    table, meta = read_trace(trace)
    validate_or_raise(table, meta, str(trace))
    rows = sorted(table.to_pylist(), key=lambda r: r["request_index"])
    got = [(r["session_id"], r["agent_id"], r["depends_on"]) for r in rows]
    assert got == [
        ("ses_root", "main", []),
        ("ses_root", "ses_child", [0]),
        ("ses_root", "ses_grand", [1]),
        # main's lane and the child it joins (which waited for its own)
        ("ses_root", "main", [0, 1]),
    ]


async def test_codex_subagent_threads_are_streams_of_their_session(tmp_path: Path) -> None:
    """Codex's subagent: a thread of its own (thread-id) in the root's session
    (session-id), naming its parent thread (x-codex-parent-thread-id). Its requests are a
    stream named by its thread, spawned by the turn that ended before it and joined by the
    main thread's next turn."""
    import anthropic

    from agent_replay.engines.sim import SimServer
    from agent_replay.replay.record import Recorder
    from agent_replay.traces.io import read_trace

    trace = tmp_path / "t"
    root = {"session-id": "th-root", "thread-id": "th-root"}
    child = {
        "session-id": "th-root",
        "thread-id": "th-child",
        "x-codex-parent-thread-id": "th-root",
        "x-openai-subagent": "collab_spawn",
    }
    async with (
        SimServer("fast") as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="k", max_retries=0)
        for headers, text in (
            (root, "do it"),
            (child, "list files"),
            (child, "and more"),
            (root, "done?"),
        ):
            await client.messages.create(
                model="sim-fast",
                max_tokens=5,
                tools=TOOLS,
                messages=[user(text)],
                extra_headers=headers,
            )
        await client.close()
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["request_index"])
    got = [(r["session_id"], r["agent_id"], r["depends_on"]) for r in rows]
    assert got == [
        ("th-root", "main", []),
        ("th-root", "th-child", [0]),
        ("th-root", "th-child", [1]),
        ("th-root", "main", [0, 2]),
    ]


def test_a_client_without_tools_keeps_one_stream() -> None:
    """A chat client that offers no tools: its first request looks like a side request,
    but the next one continues its conversation, so it was a turn: one stream, each turn
    waiting for the one before."""
    at = AgentTracker()
    p0 = at.place("s", 0, None, 0, -1, linked=False, side=True)
    at.complete("s", 0, 100)
    p1 = at.place("s", 1, None, 150, 0)
    at.complete("s", 1, 300)
    p2 = at.place("s", 2, None, 350, 1)
    assert [(p.agent_id, p.depends_on) for p in (p0, p1, p2)] == [
        (MAIN, []),
        (MAIN, [0]),
        (MAIN, [1]),
    ]


def test_a_branch_off_the_spawning_turn_joins_the_subagent() -> None:
    """Claude Code 2.1.332, background subagents: main turn 1 calls the Agent tool; the
    subagent's first turn (2) and two requests continuing turn 1 follow: 3 (first: it
    keeps turn 1's lane) and 4, the main turn with the launch notice (a new lane,
    branching off turn 1). The subagent ends (5); the main turn that carries its
    completion notice (6) continues 4: it joins the subagent, although turn 1's lane is
    3's."""
    at = AgentTracker()
    at.place("s", 0, None, 0, -1)
    at.complete("s", 0, 10)
    at.place("s", 1, None, 20, 0)
    at.complete("s", 1, 30, True)
    sub = at.place("s", 2, "agent-a", 40, 1)
    at.place("s", 3, None, 41, 1)
    branch = at.place("s", 4, None, 45, 1)
    assert (sub.depends_on, branch.agent_id, branch.depends_on) == ([1], "main/2", [1])
    at.complete("s", 3, 50)
    at.complete("s", 2, 60)
    at.complete("s", 4, 70)
    mid = at.place("s", 5, "agent-a", 80, 2)
    at.complete("s", 5, 90)
    notice = at.place("s", 6, None, 100, 4)
    assert (mid.depends_on, notice.agent_id, notice.depends_on) == ([2], "main/2", [4, 5])
    # a later turn of turn 1's own lane does not join it again
    assert at.place("s", 7, None, 110, 3).depends_on == [3]


def test_a_main_turn_between_a_subagents_tool_calls_does_not_join_it() -> None:
    """Claude Code 2.1.332, background subagents: the subagent's first turn (2) ended with
    a tool call, and the main turn with the launch notice (4, a branch off the spawning
    turn 1) came while that tool ran. The subagent was not done: it went on (5) and ended
    with its answer; the main turn that carries its completion notice (6) is the join."""
    at = AgentTracker()
    at.place("s", 0, None, 0, -1)
    at.complete("s", 0, 10)
    at.place("s", 1, None, 20, 0)
    at.complete("s", 1, 30, True)
    assert at.place("s", 2, "agent-a", 40, 1).depends_on == [1]
    at.place("s", 3, None, 41, 1)
    at.complete("s", 2, 43, True)  # its reply called a tool
    at.complete("s", 3, 44)
    branch = at.place("s", 4, None, 45, 1)
    assert (branch.agent_id, branch.depends_on) == ("main/2", [1])
    at.complete("s", 4, 50)
    assert at.place("s", 5, "agent-a", 60, 2).depends_on == [2]
    at.complete("s", 5, 70, False)  # its answer
    assert at.place("s", 6, None, 80, 4).depends_on == [4, 5]
