"""Gemini CLI (Google's Gemini API, ``streamGenerateContent``) recorded through the proxy in
front of the simulated engine, which answers with Gemini function calls, and replayed
against a fresh one.

- ``-p`` with a tool: one session, each turn the child of the one before, replayed with
  the same token counts, think times and tree.
- A subagent (``invoke_agent``; the subagent ends with ``complete_task``): a stream of the
  main session, spawned by the turn that called it and joined by the turn that carries
  its result, not a session of its own.
- Two prompts in one session (``--resume``): the CLI sends the first prompt's function
  call again without the ``thoughtSignature`` it had while that prompt ran; the second
  prompt still continues the first prompt's last turn (no false branch).

Gemini CLI on a fresh HOME: ``security.auth.selectedType`` set to the API-key auth in
its settings (the base-URL variable alone picks an auth it then refuses) and
``--skip-trust``. Install it with scripts/setup-real-clients.sh; the tests skip without it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from benchmarks import realclients
from tests.realclient.test_real_clients import (
    SECRET,
    no_secret_written,
    program,
    record,
    replay_matches,
    run_program,
    the_agent_session,
)

pytestmark = [pytest.mark.slow, pytest.mark.realclient]

LS = 'list_directory={"dir_path": "."}'
AGENT = 'invoke_agent={"agent_name": "generalist", "prompt": "List the files here."}'
DONE = 'complete_task={"result": {"response": "hello.txt"}}'


def gemini_env(url: str, model: str, home: Path) -> dict[str, str]:
    """The README's recipe: settings on a fresh HOME, the key and the base URL."""
    return realclients.gemini_env(url, model, home, SECRET)


def gemini_p(prompt: str):  # type: ignore[no-untyped-def]
    gemini = program("gemini")

    def argv_env(url: str, model: str, home: Path) -> tuple[list[str], dict[str, str]]:
        return [gemini, "-p", prompt, "-m", model, "--yolo", "--skip-trust"], gemini_env(
            url, model, home
        )

    return argv_env


async def test_gemini_cli(tmp_path: Path) -> None:
    trace, rows = await record(tmp_path, [LS], gemini_p("List the files here."))
    main = the_agent_session(rows)
    assert all(r["api"] == "gemini" for r in main)
    assert all(r["agent_id"] == "main" for r in main)
    assert [list(r["depends_on"] or ()) for r in main] == [[]] + [[i] for i in range(len(main) - 1)]
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


async def test_gemini_cli_subagent(tmp_path: Path) -> None:
    trace, rows = await record(
        tmp_path, [DONE, AGENT, LS], gemini_p("Use a subagent to list the files.")
    )
    assert len({r["session_id"] for r in rows}) == 1, [
        (r["session_id"], r["agent_id"]) for r in rows
    ]
    rows.sort(key=lambda r: r["request_index"])
    subs = [r for r in rows if r["agent_id"] != "main"]
    main = [r for r in rows if r["agent_id"] == "main"]
    assert subs and len(main) >= 2 and all(r["error"] is None for r in rows)
    spawn = subs[0]["depends_on"][0]
    assert rows[spawn]["agent_id"] == "main"  # the turn that called invoke_agent
    after = [r for r in main if r["request_index"] > spawn]
    assert subs[-1]["request_index"] in after[0]["depends_on"]  # the join
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")


async def test_gemini_cli_resumed_prompt_continues_the_session(tmp_path: Path) -> None:
    gemini = program("gemini")
    trace, home, work = tmp_path / "trace", tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    async with (
        SimServer("fast", seed=3, tool_call=[LS]) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60, content="full") as rec,
    ):
        model = sim.profile.model_name
        for more in ([], ["--resume", "latest"]):
            await run_program(
                [
                    gemini,
                    "-p",
                    "List the files here.",
                    "-m",
                    model,
                    "--yolo",
                    "--skip-trust",
                    *more,
                ],
                gemini_env(rec.url, model, home),
                work,
            )
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["request_index"])
    assert len(rows) == 4 and len({r["session_id"] for r in rows}) == 1
    assert [(r["parent_index"], list(r["depends_on"] or ())) for r in rows] == [
        (-1, []),
        (0, [0]),
        (1, [1]),
        (2, [2]),
    ]
    # the edits this rides over: the first call sent again unsigned, its result twice
    first, again = (orjson.loads(rows[i]["content"])["contents"] for i in (1, 2))
    assert "thoughtSignature" in first[1]["parts"][0]
    assert "thoughtSignature" not in again[1]["parts"][0]
    assert again[2]["parts"] == first[2]["parts"] * 2
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")
