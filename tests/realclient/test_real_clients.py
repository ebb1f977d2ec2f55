"""Real agent programs nobody here wrote, recorded through the proxy in front of the
simulated engine and replayed against a fresh one: Claude Code (messages), Codex CLI
(responses), opencode (chat), qwen-code (chat), aider and mini-swe-agent (chat, through
litellm);
the OpenAI Agents SDK in test_agents_sdk.py.

The engine answers a user's turn with a tool call (``ls``), so each agent runs a tool and
sends its result: a multi-turn session. The recording must hold that session (one
session, each turn the child of the one before), and its replay must send the same token
counts in the same tree with the recorded think times. No dummy key may appear in any
file written. The programs talk to loopback only: HTTP(S)_PROXY points at a closed
loopback port, so anything else they try fails.

Install the programs with scripts/setup-real-clients.sh; each test skips when its
program is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProcess, SimServer
from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from benchmarks import realclients
from benchmarks.realclients import (
    AIDER_FLAGS,
    CODEX_FLAGS,
    Tmux,
    aider_env,
    base_env,
    claude_state,
    codex_env,
    env_script,
    manual_permissions,
    opencode_env,
    qwen_env,
)

pytestmark = [pytest.mark.slow, pytest.mark.realclient]

SECRET = "sk-realclient-test-0f9e8d7c"
LS = 'Bash={"command": "ls"}'
CODEX_LS = 'exec_command={"cmd": "ls"}'
MINI_LS = 'bash={"command": "ls"}'


def program(name: str) -> str:
    found = realclients.program(name)
    if found is None:
        pytest.skip(f"{name} not installed (scripts/setup-real-clients.sh)")
    return found


async def run_program(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float = 240,
    stdin: str | None = None,
) -> str:
    rc, text = await realclients.run_program(argv, env, cwd, timeout_s, stdin)
    assert rc == 0, text[-3000:]
    return text


async def record(
    tmp: Path, tool_calls: list[str], argv_env: Any, stdin: str | None = None
) -> tuple[Path, list[dict]]:
    """Record one run of the program; ``argv_env(proxy_url, model, home)`` gives
    (argv, env); ``stdin``: what it reads on its standard input."""
    trace = tmp / "trace"
    home = tmp / "home"
    work = tmp / "work"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    async with (
        SimServer("fast", seed=3, tool_call=tool_calls) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        argv, env = argv_env(rec.url, sim.profile.model_name, home)
        await run_program(argv, env, work, stdin=stdin)
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    return trace, rows


def the_agent_session(rows: list[dict]) -> list[dict]:
    """The rows of the session with the most turns, in request order; it must be one chain
    with a tool-call turn and a turn after it."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["session_id"], []).append(r)
    main = max(by.values(), key=len)
    main.sort(key=lambda r: r["request_index"])
    assert len(main) >= 2, [(r["session_id"], r["request_index"]) for r in rows]
    assert [r["parent_index"] for r in main] == list(range(-1, len(main) - 1))
    assert all(r["error"] is None for r in main)
    return main


async def replay_matches(trace: Path, rows: list[dict], out: Path) -> None:
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
    res = {
        (x["session_id"], x["request_index"]): x
        for x in pq.read_table(out / "requests").to_pylist()
    }
    assert len(res) == len(rows)
    for r in rows:
        x = res[(r["session_id"], r["request_index"])]
        assert x["status"] == "ok", x["error"]
        assert x["api"] == r["api"]
        assert x["prompt_tokens"] == r["input_tokens"]
        assert x["completion_tokens"] == r["output_tokens"]
        assert x["parent_index"] == r["parent_index"]
        if r["parent_index"] >= 0:
            assert x["think_ns"] == r["think_ns"]


def no_secret_written(*dirs: Path) -> None:
    for d in dirs:
        for f in d.rglob("*"):
            if f.is_file():
                assert SECRET.encode() not in f.read_bytes(), f


CLAUDES = ["claude", "claude-2.1.197"]
"""The current Claude Code and 2.1.197 (the last on node 20, with title requests and
foreground subagents): scripts/setup-real-clients.sh installs both."""


@pytest.mark.parametrize("name", CLAUDES)
async def test_claude_code(tmp_path: Path, name: str) -> None:
    claude = program(name)

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        env = claude_env(url, model, home)
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        return [
            claude,
            "-p",
            "List the files here.",
            "--max-turns",
            "3",
            "--allowedTools",
            "Bash(ls)",
        ], env

    trace, rows = await record(tmp_path, [LS], argv_env)
    main = the_agent_session(rows)
    assert all(r["api"] == "messages" for r in main)
    assert main[0]["input_tokens"] > 5000  # Claude Code's tools and system are counted
    assert main[0]["session_id"] != "auto-00001"  # named by X-Claude-Code-Session-Id
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


AGENT = (
    'Agent={"description": "List files", "prompt": "List the files here.", '
    '"subagent_type": "general-purpose"}'
)


@pytest.mark.parametrize("name", CLAUDES)
async def test_claude_code_subagents(tmp_path: Path, name: str) -> None:
    """The engine answers with the Agent tool where it is offered: Claude Code runs a
    subagent (x-claude-code-agent-id), which spawns its own, down to --max-turns; each
    subagent is spawned by a turn of another stream and
    joined by its spawner's first turn after the subagent's end (the current release
    runs subagents in the background: the turn that carries its completion notice)."""
    claude = program(name)

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        env = claude_env(url, model, home)
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        return [
            claude,
            "-p",
            "List the files here.",
            "--max-turns",
            "3",
            "--allowedTools",
            "Bash(ls)",
            "Agent",
        ], env

    trace, rows = await record(tmp_path, [AGENT, LS], argv_env)
    session = [r for r in rows if r["session_id"] == rows[0]["session_id"]]
    session.sort(key=lambda r: r["request_index"])
    agents = {r["agent_id"] for r in session}
    assert "main" in agents and len(agents) >= 2
    by_index = {r["request_index"]: r for r in session}
    subs = [a for a in agents if a != "main"]
    for a in subs:
        turns = [r for r in session if r["agent_id"] == a]
        first, last = turns[0], turns[-1]
        spawn = by_index[first["depends_on"][0]]
        assert spawn["agent_id"] != a  # spawned by another stream's turn
        # joined by a later turn of the spawner's stream, when the spawner went on
        assert spawn["output_tokens"] > 0 and spawn["error"] is None
        later = [
            r
            for r in session
            if r["agent_id"] == spawn["agent_id"]
            and r["arrival_ns"] >= last["arrival_ns"] + last["end_ns"]
        ]
        if later:
            assert last["request_index"] in later[0]["depends_on"]
    main_turns = [r for r in session if r["agent_id"] == "main"]
    assert len(main_turns) >= 2
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


def codex_exec(
    codex: str, prompt: str
) -> Callable[[str, str, Path], tuple[list[str], dict[str, str]]]:
    """``codex exec PROMPT`` against the recorder: a ``[model_providers]`` entry on the
    Responses API, its key from the environment."""

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return [codex, "exec", *CODEX_FLAGS, prompt], codex_env(url, model, home, SECRET)

    return argv_env


async def test_codex_cli(tmp_path: Path) -> None:
    codex = program("codex")

    trace, rows = await record(tmp_path, [CODEX_LS, LS], codex_exec(codex, "List the files here."))
    main = the_agent_session(rows)
    assert all(r["api"] == "responses" for r in main)
    assert main[0]["session_id"] != "auto-00001"  # named by Codex's session header
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


CODEX_SPAWN = 'spawn_agent={"message": "List the files here."}'


async def test_codex_subagent(tmp_path: Path) -> None:
    """Codex offers spawn_agent (its multi-agent tools, on by default in 0.171); the engine
    calls it: the subagent runs in a thread of its own (thread-id, x-codex-parent-thread-id)
    in the root's session. Its requests are a stream of that session, spawned by the turn
    that called the tool; a subagent may spawn its own (the engine calls the tool on every
    user turn that offers it). (On the engine the main agent answers the tool's result
    with text and ends without waiting for the subagent, so the run may end inside it: no
    join here, and a subagent's last request may be cut.)"""
    codex = program("codex")

    trace, rows = await record(
        tmp_path,
        [CODEX_SPAWN, CODEX_LS],
        codex_exec(codex, "Spawn a subagent to list the files here."),
    )
    assert len({r["session_id"] for r in rows}) == 1
    by_index = {r["request_index"]: r for r in rows}
    threads = {r["agent_id"] for r in rows} - {"main"}
    assert threads
    spawners = set()
    for a in threads:  # a subagent spawns its own too, down to Codex's depth limit
        first = min((r for r in rows if r["agent_id"] == a), key=lambda r: r["request_index"])
        spawn = by_index[first["depends_on"][0]]
        assert spawn["agent_id"] != a and spawn["error"] is None
        spawners.add(spawn["agent_id"])
    assert "main" in spawners
    assert all(r["error"] is None for r in rows if r["agent_id"] == "main")
    no_secret_written(trace)


async def test_mini_swe_agent(tmp_path: Path) -> None:
    mini = program("mini")

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        env = base_env(home)
        env.update(
            MSWEA_CONFIGURED="true",
            MSWEA_GLOBAL_CONFIG_DIR=str(home),
            MSWEA_COST_TRACKING="ignore_errors",
            OPENAI_API_KEY=SECRET,
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        return [
            mini,
            "-m",
            f"openai/{model}",
            "-t",
            "List the files here.",
            "-y",
            "-c",
            "mini.yaml",
            "-c",
            f"model.model_kwargs.api_base={url}/v1",
            "-c",
            "agent.step_limit=3",
            "-c",
            "agent.cost_limit=0",
            "-o",
            str(home / "trajectory.json"),
        ], env

    trace, rows = await record(tmp_path, [MINI_LS], argv_env)
    main = the_agent_session(rows)
    # tool call, text after the tool's output, then a format-error turn that drops that
    # reply: still one chain
    assert len(main) == 3 and all(r["api"] == "chat" for r in main)
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


def qwen_argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
    """qwen-code -p (node >= 22, the OpenAI variables, the openai auth type, and a
    max_tokens that fits the engine's context: it asks for 32000 otherwise)."""
    env = qwen_env(url, model, home, SECRET)
    return [program("qwen"), "-p", "List the files here.", "--yolo"], env


QWEN_LS = 'run_shell_command={"command": "ls"}'


async def test_qwen_code(tmp_path: Path) -> None:
    """qwen-code's shell tool's call and result are one session (it names none: found by
    conversation)."""
    program("qwen")
    trace, rows = await record(tmp_path, [QWEN_LS], qwen_argv_env)
    main = the_agent_session(rows)
    assert all(r["api"] == "chat" for r in main)
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


QWEN_AGENT = (
    'agent={"description": "List files", "prompt": "List the files here.", '
    '"subagent_type": "general-purpose"}'
)


async def test_qwen_code_subagents(tmp_path: Path) -> None:
    """qwen-code's agent tool (the engine calls it on every user turn that offers it): a
    background subagent, which runs nested ones in the foreground, down to qwen-code's
    depth limit. It names no session and no parent; each subagent's first request ends
    with the task the call handed it. One session: each subagent a stream spawned by the
    turn of another stream whose call handed it its task, and joined by its spawner's
    turn after its end (the main agent's: the one that carries the completion notice)."""
    program("qwen")
    trace, rows = await record(tmp_path, [QWEN_AGENT, QWEN_LS], qwen_argv_env)
    assert len({r["session_id"] for r in rows}) == 1
    assert all(r["error"] is None for r in rows)
    by_index = {r["request_index"]: r for r in rows}
    subs = {r["agent_id"] for r in rows} - {"main"}
    assert subs and all(a.startswith("spawned-") for a in subs)
    for a in subs:
        mine = sorted((r for r in rows if r["agent_id"] == a), key=lambda r: r["request_index"])
        spawn = by_index[mine[0]["depends_on"][0]]
        assert spawn["agent_id"] != a
        joins = [
            r
            for r in rows
            if r["agent_id"] == spawn["agent_id"] and mine[-1]["request_index"] in r["depends_on"]
        ]
        assert joins  # the spawner went on after the subagent and waited for it
    notice = max(rows, key=lambda r: r["arrival_ns"])
    assert notice["agent_id"] == "main" and len(notice["depends_on"]) == 2
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


async def test_aider(tmp_path: Path) -> None:
    """aider, three prompts on its standard input in one run: it appends a reminder to the
    user's message and sends the message back without it on the next turn, so no turn's
    conversation begins with the one before; each carries the previous turn's reply,
    which continues the session: one session, a chain of three turns."""
    aider = program("aider")

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return [aider, "--model", f"openai/{model}", *AIDER_FLAGS], aider_env(url, home, SECRET)

    trace, rows = await record(
        tmp_path, [], argv_env, stdin="Say hello.\nNow say goodbye.\nOnce more.\n"
    )
    main = the_agent_session(rows)
    assert len(rows) == len(main) == 3 and all(r["api"] == "chat" for r in main)
    assert [r["depends_on"] for r in main] == [[], [0], [1]]
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


OPENCODE_TASK = (
    'task={"description": "List files", "prompt": "List the files here.", '
    '"subagent_type": "general"}'
)
OPENCODE_LS = 'bash={"command": "ls", "description": "List files"}'


def opencode_argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
    env = opencode_env(url, model, home, SECRET)
    return [program("opencode"), "run", "List the files here."], env


async def test_opencode_subagent(tmp_path: Path) -> None:
    """opencode (X-Session-Id names its session): its task tool runs a subagent in a child
    session whose requests carry
    x-parent-session-id: a stream of the parent's session, spawned by the turn that called
    the tool and joined by the parent's next turn."""
    program("opencode")
    trace, rows = await record(tmp_path, [OPENCODE_TASK, OPENCODE_LS], opencode_argv_env)
    assert len({r["session_id"] for r in rows}) == 1
    assert rows[0]["session_id"].startswith("ses_")  # named by X-Session-Id
    assert all(r["api"] == "chat" and r["error"] is None for r in rows)
    by_index = {r["request_index"]: r for r in rows}

    def of_main(r: dict[str, Any]) -> bool:  # the main agent, or a lane of it (a side request)
        return r["agent_id"] == "main" or r["agent_id"].startswith("main/")

    subs = [r for r in rows if not of_main(r)]
    assert subs and len({r["agent_id"] for r in subs}) == 1
    spawn = by_index[subs[0]["depends_on"][0]]
    assert of_main(spawn)
    later = [r for r in rows if of_main(r) and r["request_index"] > spawn["request_index"]]
    joins = [r for r in later if subs[-1]["request_index"] in r["depends_on"]]
    assert joins  # the parent's next turn waits for the subagent
    assert joins[0]["think_ns"] < 5_000_000_000  # not the subagent's whole run
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


@pytest.mark.timing
async def test_claude_code_interactive_title_requests_stay_concurrent(tmp_path: Path) -> None:
    """Interactive Claude Code, driven in tmux: each user turn comes with a title request
    sent beside it. Neither waits for the other in the trace (the turn depends on the
    request whose reply it carries), and the replay sends every request its recorded
    think time after the end of its latest dependency."""
    claude = program("claude")
    try:
        tmux = Tmux(f"agent-replay-{os.getpid()}")
    except FileNotFoundError:
        pytest.skip("tmux not installed")
    home, work, trace = tmp_path / "home", tmp_path / "work", tmp_path / "trace"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    claude_state(home, work, SECRET, ())
    async with (
        SimServer("fast", seed=3, tool_call=[LS]) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        env = claude_env(rec.url, sim.profile.model_name, home)
        env.update(CLAUDE_CODE_MAX_OUTPUT_TOKENS="4000", TERM="xterm-256color")
        tmux.start(env_script(tmp_path / "claude.sh", env, claude), work)
        try:
            want = 0
            for text in ("List the files here.", "List them again."):
                await asyncio.sleep(4)  # the prompt is ready
                await tmux.type_in(text)
                want += 3  # title, the turn (a tool call), the turn after the tool's result
                for _ in range(600):
                    if rec.stats.requests >= want and not rec.in_flight:
                        break
                    await asyncio.sleep(0.1)
            await tmux.type_in("/exit")
            await asyncio.sleep(1)
        finally:
            tmux.kill()
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    assert len({r["session_id"] for r in rows}) == 1 and all(r["error"] is None for r in rows)
    by_index = {r["request_index"]: r for r in rows}
    # a request that extends a conversation never depends on a request still running when
    # it arrived (the title request beside it)
    for r in rows:
        for d in r["depends_on"]:
            dep = by_index[d]
            assert dep["arrival_ns"] + dep["end_ns"] <= r["arrival_ns"], (r, dep)
    # the user's turns overlap their title requests: some pair ran side by side
    assert any(
        a["arrival_ns"] < b["arrival_ns"] < a["arrival_ns"] + a["end_ns"]
        for a in rows
        for b in rows
        if a is not b
    )
    await replay_matches(trace, rows, tmp_path / "results")
    # each request is sent its think time after its latest dependency ended (the recorded
    # offsets were 0.02-0.09 ms off on a quiet machine: benchmarks/journal/
    # 2026-12-03-recorded-prefix.md; the bound leaves room for load)
    errs = [
        x["sent_ns"] - x["parent_end_ns"] - x["think_ns"]
        for x in pq.read_table(tmp_path / "results" / "requests").to_pylist()
        if x["depends_on"] and x["parent_end_ns"] is not None
    ]
    print(
        f"send offset from the latest dependency vs recorded think: {len(errs)} requests, "
        f"max |error| {max(abs(e) for e in errs) / 1e6:.3f} ms"
    )
    assert errs and max(abs(e) for e in errs) < 50_000_000, errs
    no_secret_written(trace, tmp_path / "results")


def claude_env(url: str, model: str, home: Path) -> dict[str, str]:
    """Claude Code against ``url`` with every model role on the engine's model."""
    return realclients.claude_env(url, model, home, SECRET, max_output=8000)


async def settled(rec: Recorder, before: int, quiet_s: float, limit_s: float = 240) -> None:
    """Wait as a user reading the answer would: until the recorder has more requests than
    ``before``, none open, and no new one for ``quiet_s``."""
    loop = asyncio.get_running_loop()
    seen, since, start = rec.stats.requests, loop.time(), loop.time()
    while loop.time() - start < limit_s:
        await asyncio.sleep(0.1)
        if rec.stats.requests != seen or rec.in_flight:
            seen, since = rec.stats.requests, loop.time()
        elif seen > before and loop.time() - since >= quiet_s:
            return
    raise AssertionError(f"the agent did not settle in {limit_s:.0f} s ({seen} requests)")


async def record_interactive(
    tmp: Path, claude: str, tool_calls: list[str], prompts: Sequence[str], allowed: Sequence[str]
) -> tuple[Path, list[dict]]:
    """Interactive Claude Code in tmux through the recorder: each prompt typed once the
    previous one's answer has settled, then ``/exit``."""
    try:
        tmux = Tmux(f"agent-replay-{os.getpid()}-{tmp.name}")
    except FileNotFoundError:
        pytest.skip("tmux not installed")
    home, work, trace = tmp / "home", tmp / "work", tmp / "trace"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    claude_state(home, work, SECRET, allowed)
    async with (
        SimServer("fast", seed=3, tool_call=tool_calls) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        env = claude_env(rec.url, sim.profile.model_name, home)
        env.update(CLAUDE_CODE_MAX_OUTPUT_TOKENS="4000", TERM="xterm-256color")
        script = env_script(
            tmp / "claude.sh",
            env,
            f"{claude} {' '.join(manual_permissions(claude))} --allowedTools "
            + " ".join(f"'{a}'" for a in allowed),
        )
        tmux.start(script, work)
        try:
            await asyncio.sleep(5)  # the prompt is ready
            for text in prompts:
                before = rec.stats.requests
                await tmux.type_in(text)
                await settled(rec, before, quiet_s=5)
            await tmux.type_in("/exit")
            await asyncio.sleep(1)
        finally:
            tmux.kill()
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    return trace, rows


def slow_profile(folder: Path, factor: float) -> Path:
    """The simulated engine's ``fast`` profile with every step ``factor`` times as long."""
    from importlib import resources

    fast = json.loads(
        (resources.files("agent_replay.engines.sim") / "profiles" / "fast.json").read_text()
    )
    slow = folder / "slow.json"
    slow.write_text(
        json.dumps(
            {
                **fast,
                "name": f"fast-x{factor:g}",
                "decode_base_ns": int(factor * fast["decode_base_ns"]),
                "decode_per_seq_ns": int(factor * fast["decode_per_seq_ns"]),
                "prefill_tokens_per_s": fast["prefill_tokens_per_s"] / factor,
            }
        )
    )
    return slow


async def joins_kept_on_a_slower_server(tmp: Path, trace: Path, rows: list[dict]) -> int:
    """Replay against a server ten times slower per engine step (checked: every request
    of the session took at least twice as long as recorded, median) and check from the
    result rows that no request that came after a subagent's end in the recording was sent
    before the subagent's last request ended in the replay. Returns how many such
    (request, subagent) pairs were checked."""
    from agent_replay.replay.config import RunConfig
    from agent_replay.replay.run import arun

    out = tmp / "results"
    with SimProcess(str(slow_profile(tmp, 10)), seed=4) as target:
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
    sid = rows[0]["session_id"]
    rec = [r for r in rows if r["session_id"] == sid]
    res = {
        x["request_index"]: x
        for x in pq.read_table(out / "requests").to_pylist()
        if x["session_id"] == sid
    }
    ratios = sorted(
        (res[r["request_index"]]["end_ns"] - res[r["request_index"]]["sent_ns"]) / r["end_ns"]
        for r in rec
        if r["error"] is None and r["end_ns"] > 0
    )
    assert ratios[len(ratios) // 2] >= 2, ratios  # the server was at least 2x slower
    subs = {r["agent_id"] for r in rec if not r["agent_id"].startswith("main")}  # not a lane
    assert subs
    checked = 0
    for a in subs:
        mine = [r for r in rec if r["agent_id"] == a]
        rec_end = max(r["arrival_ns"] + r["end_ns"] for r in mine)
        replay_end = max(res[r["request_index"]]["end_ns"] for r in mine)
        for r in rec:
            if r["agent_id"] != a and r["arrival_ns"] >= rec_end:
                x = res[r["request_index"]]
                assert x["sent_ns"] >= replay_end, (a, r["request_index"], x["sent_ns"], replay_end)
                checked += 1
    return checked


@pytest.mark.parametrize("name", CLAUDES)
async def test_claude_code_subagent_replay_keeps_the_join_on_a_slower_server(
    tmp_path: Path, name: str
) -> None:
    """A Claude Code session with subagents (``-p``), replayed against a server slower
    than the one it was recorded against: no turn that came after a subagent's end in the
    recording is sent before the subagent's last request ended in the replay. Checked
    from the result rows' times, not from the run's own count of early sends."""
    claude = program(name)

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return [
            claude,
            "-p",
            "List the files here.",
            "--max-turns",
            "3",
            "--allowedTools",
            "Bash(ls)",
            "Agent",
        ], claude_env(url, model, home)

    trace, rows = await record(tmp_path, [AGENT, LS], argv_env)
    assert await joins_kept_on_a_slower_server(tmp_path, trace, rows)


@pytest.mark.parametrize("name", CLAUDES)
async def test_claude_code_interactive_subagent_replay_keeps_the_join_on_a_slower_server(
    tmp_path: Path, name: str
) -> None:
    """Interactive Claude Code (tmux), two prompts, each answered with the Agent tool: the
    subagents' turns and the main turn after them are one session; replayed against a
    server slower than the recording's, no main turn goes before the subagent it waited
    for has ended (from the result rows)."""
    claude = program(name)
    trace, rows = await record_interactive(
        tmp_path,
        claude,
        [AGENT, LS],
        ["List the files here.", "List them again."],
        ["Bash(ls)", "Agent"],
    )
    assert len({r["session_id"] for r in rows}) == 1
    assert all(r["error"] is None for r in rows)
    main = [r for r in rows if r["agent_id"].startswith("main")]
    subs = [r for r in rows if not r["agent_id"].startswith("main")]
    assert subs and len(main) >= 4  # both prompts' turns
    # a main turn that came after a subagent ended depends on it (directly or not)
    assert any(set(r["depends_on"]) & {s["request_index"] for s in subs} for r in main)
    assert await joins_kept_on_a_slower_server(tmp_path, trace, rows)
    no_secret_written(trace, tmp_path / "results")
