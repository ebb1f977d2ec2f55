"""Gemini CLI's conversations through the recorder in front of the simulated engine, its
wire moves made by hand: the engine's function calls, the CLI's own history edits (a
stand-in ``thoughtSignature`` on the running prompt's calls only, call ids of its own)
kept in one session without a false branch, and a subagent (a fresh conversation
offering ``complete_task``) recorded as a stream of the session that called it, spawned
by that turn and joined by the turn that carries its result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson

from agent_replay.engines.apis import dialect
from agent_replay.engines.sim import SimServer
from agent_replay.engines.sse import SSEEvent, SSEParser
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.gemini import GeminiSubagents, session_items
from agent_replay.replay.record.sessions import SessionTracker, chain_digests
from agent_replay.traces.io import read_trace

GEMINI = dialect("gemini")
SIG = "skip_thought_signature_validator"
LS = {"functionDeclarations": [{"name": "list_directory", "parameters": {"type": "object"}}]}
AGENT = {"functionDeclarations": [{"name": "invoke_agent", "parameters": {"type": "object"}}]}
DONE = {"functionDeclarations": [{"name": "complete_task", "parameters": {"type": "object"}}]}
CALLS = [
    'complete_task={"result": {"response": "two files"}}',
    'invoke_agent={"agent_name": "generalist", "prompt": "List the files."}',
    'list_directory={"dir_path": "."}',
]


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def _result(call: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": call_id,
                    "name": call["name"],
                    "response": {"output": "a.txt b.txt"},
                }
            }
        ],
    }


async def _turn(
    http: aiohttp.ClientSession, url: str, contents: list[Any], tools: list[Any]
) -> list[dict[str, Any]]:
    """One streamed request; the model's parts, as the client keeps them."""
    body = {"contents": contents, "tools": tools, "generationConfig": {"maxOutputTokens": 8}}
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    parts: list[dict[str, Any]] = []
    for ev in SSEParser().feed(raw):
        for cand in orjson.loads(ev.data).get("candidates") or ():
            parts += [p for p in cand["content"]["parts"] if p.get("functionCall") or p.get("text")]
    return parts


def _signed(parts: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    """The model turn as the CLI sends it in the running prompt: its call's id prefixed
    with the name, the stand-in signature on the first call."""
    call = parts[0]["functionCall"]
    return {
        "role": "model",
        "parts": [{"functionCall": {**call, "id": call_id}, "thoughtSignature": SIG}],
    }


def _unsigned(turn: dict[str, Any]) -> dict[str, Any]:
    """The same turn once a later prompt runs: the signature dropped."""
    return {
        "role": "model",
        "parts": [{k: v for k, v in p.items() if k != "thoughtSignature"} for p in turn["parts"]],
    }


async def test_the_clis_signature_edit_continues_the_session(tmp_path: Path) -> None:
    async with (
        SimServer("fast", seed=3, tool_call=CALLS) as sim,
        Recorder(sim.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60) as rec,
        aiohttp.ClientSession() as http,
    ):
        url = rec.url + GEMINI.url_path(sim.profile.model_name)
        convo = [_user("List the files here.")]
        parts = await _turn(http, url, convo, [LS])  # 0: the call
        assert [p["functionCall"]["name"] for p in parts] == ["list_directory"]
        model = _signed(parts, "list_directory__c1")
        convo += [model, _result(parts[0]["functionCall"], "list_directory__c1")]
        text = await _turn(http, url, convo, [LS])  # 1: text
        assert text and "functionCall" not in text[0]
        convo = [
            convo[0],
            _unsigned(model),
            convo[2],
            {"role": "model", "parts": text},
            _user("List them again."),
        ]
        again = await _turn(http, url, convo, [LS])  # 2: the call
        assert again[0]["functionCall"]["name"] == "list_directory"
    rows = sorted(read_trace(tmp_path / "t")[0].to_pylist(), key=lambda r: r["arrival_ns"])
    assert len({r["session_id"] for r in rows}) == 1
    assert [(r["request_index"], r["parent_index"], list(r["depends_on"] or ())) for r in rows] == [
        (0, -1, []),
        (1, 0, [0]),
        (2, 1, [1]),
    ]
    assert [r["agent_id"] for r in rows] == ["main"] * 3
    assert all(r["error"] is None and r["exact_chunk_tokens"] for r in rows)
    # the call's output tokens are its arguments' pieces, all counted
    assert rows[0]["output_tokens"] == len(sim.tokenizer.pieces('{"dir_path": "."}'))


async def test_a_subagent_is_a_stream_spawned_and_joined(tmp_path: Path) -> None:
    async with (
        SimServer("fast", seed=3, tool_call=CALLS) as sim,
        Recorder(sim.url, "127.0.0.1:0", tmp_path / "t", flush_interval_s=60) as rec,
        aiohttp.ClientSession() as http,
    ):
        url = rec.url + GEMINI.url_path(sim.profile.model_name)
        main = [_user("Use a subagent to list the files.")]
        parts = await _turn(http, url, main, [AGENT, LS])  # 0 main: invoke_agent
        call = parts[0]["functionCall"]
        assert call["name"] == "invoke_agent"
        sub = [_user("List the files.")]
        done = await _turn(http, url, sub, [LS, DONE])  # 1 sub: complete_task
        assert done[0]["functionCall"]["name"] == "complete_task"
        sub += [
            _signed(done, "complete_task__s1"),
            _result(done[0]["functionCall"], "complete_task__s1"),
        ]
        await _turn(http, url, sub, [LS, DONE])  # 2 sub: text
        main += [_signed(parts, "invoke_agent__m1"), _result(call, "invoke_agent__m1")]
        await _turn(http, url, main, [AGENT, LS])  # 3 main: text
    rows = sorted(read_trace(tmp_path / "t")[0].to_pylist(), key=lambda r: r["arrival_ns"])
    assert len({r["session_id"] for r in rows}) == 1
    assert [(r["agent_id"], list(r["depends_on"] or ())) for r in rows] == [
        ("main", []),
        ("invoke_agent-1", [0]),
        ("invoke_agent-1", [1]),
        ("main", [0, 2]),
    ]


def _assign(
    tracker: SessionTracker,
    subs: GeminiSubagents,
    t: int,
    contents: list[Any],
    tools: list[Any],
    reply: list[Any],
) -> tuple[str, str | None]:
    items = session_items("gemini", GEMINI.conversation({"contents": contents}))
    chains = chain_digests(items)
    route = subs.route(t, chains, tools)
    explicit, agent = (route.session_id, route.agent) if route else (None, None)
    a, turn = tracker.assign(t, items, explicit, agent, chains=chains)
    subs.seen(chains, turn, a.parent_index, a.how.endswith("prefix"))
    event = SSEEvent(None, orjson.dumps({"candidates": [{"content": {"parts": reply}}]}))
    tracker.complete(turn, t + 5, GEMINI.reply_from_events([event]))
    return a.session_id, agent


def test_a_fresh_conversation_without_complete_task_or_a_running_call_is_its_own() -> None:
    tracker, subs = SessionTracker(), GeminiSubagents()
    ls = {"functionCall": {"name": "list_directory", "args": {}}}
    s0, _ = _assign(tracker, subs, 0, [_user("a")], [LS], [{"text": "done"}])
    # no call is running: a subagent-shaped request starts a session of its own
    s1, agent = _assign(tracker, subs, 10, [_user("b")], [LS, DONE], [ls])
    assert s1 != s0 and agent is None
    # s1's call is running: a request without complete_task is not a subagent
    s2, agent = _assign(tracker, subs, 20, [_user("c")], [LS], [{"text": "x"}])
    assert s2 not in (s0, s1) and agent is None
    # ... one with it is, of the session whose call runs
    s3, agent = _assign(tracker, subs, 30, [_user("d")], [DONE], [{"text": "y"}])
    assert (s3, agent) == (s1, "list_directory-1")


def test_the_session_view_leaves_out_only_the_clis_edits() -> None:
    call = {"name": "list_directory", "args": {"dir_path": "."}}
    result = _result(call, "list_directory__c1")

    def view(contents: list[Any]) -> Any:
        return session_items("gemini", GEMINI.conversation({"contents": contents}))

    ran = view([_user("a"), _signed([{"functionCall": call}], "list_directory__c1"), result])
    resumed = [
        _user("a"),
        {"role": "model", "parts": [{"functionCall": call}]},
        {"role": "user", "parts": result["parts"] * 2},
    ]  # --resume: sent twice
    assert view(resumed) == ran
    # another call, or another call's result beside it, is not an edit
    other = {"name": "list_directory", "args": {"dir_path": "src"}}
    assert view([_user("a"), {"role": "model", "parts": [{"functionCall": other}]}, result]) != ran
    twice = {"role": "user", "parts": result["parts"] + _result(call, "c2")["parts"]}
    assert view([_user("a"), {"role": "model", "parts": [{"functionCall": call}]}, twice]) != ran
    # other APIs' items are left as they are
    items = [{"role": "user", "content": "a", "thoughtSignature": "x"}]
    assert session_items("chat", items) is items


def test_the_readmes_gemini_settings_are_the_tested_ones(tmp_path: Path) -> None:
    """The README's recipe writes the settings the real-client tests and the benches run
    Gemini CLI with."""
    from benchmarks.realclients import gemini_env

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("cat > ~/.gemini/settings.json <<'EOF'\n", 1)[1].split("    EOF", 1)[0]
    gemini_env("http://127.0.0.1:1", "sim-8b", tmp_path, "key")
    assert orjson.loads(block) == orjson.loads(
        (tmp_path / ".gemini" / "settings.json").read_bytes()
    )


def test_a_running_invoke_agent_call_is_preferred_to_a_later_other_call() -> None:
    tracker, subs = SessionTracker(), GeminiSubagents()
    invoke = {"functionCall": {"name": "invoke_agent", "args": {"prompt": "x"}}}
    ls = {"functionCall": {"name": "list_directory", "args": {}}}
    s0, _ = _assign(tracker, subs, 0, [_user("a")], [AGENT], [invoke])
    s1, _ = _assign(tracker, subs, 10, [_user("b")], [LS], [ls])  # another session's tool
    assert s1 != s0
    s2, agent = _assign(tracker, subs, 30, [_user("x")], [DONE], [{"text": "y"}])
    assert (s2, agent) == (s0, "invoke_agent-1")


def test_complete_task_hands_nothing_back() -> None:
    from agent_replay.replay.record.gemini import hands_back

    assert hands_back(("run_shell_command:1f2e", "complete_task:9a0b"))
    assert not hands_back(("complete_task:9a0b",))
    assert hands_back(("toolu_01ABC",))  # an Anthropic tool_use id
    assert not hands_back(())
