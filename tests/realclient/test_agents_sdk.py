"""The OpenAI Agents SDK (``openai-agents``, installed by scripts/setup-real-clients.sh),
recorded through the proxy in front of the simulated engine: a triage agent hands off to
a maths agent. On Chat Completions the handoff replaces the system message; on the
Responses API it changes the instructions. Either way the second agent's request carries
the transfer call and its result, so the recording is one session whose second request is
the first one's child, in the maths agent's stream (named by the transfer tool) spawned by
the triage turn, and its replay sends the same tokens in the same tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace
from agent_replay.traces.stats import agent_streams
from tests.realclient.test_real_clients import SECRET, no_secret_written, replay_matches

pytestmark = [pytest.mark.slow, pytest.mark.realclient]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_handoff_is_one_session(tmp_path: Path, api: str) -> None:
    agents = pytest.importorskip(
        "agents", reason="openai-agents not installed (scripts/setup-real-clients.sh)"
    )
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    trace = tmp_path / "trace"
    async with (
        SimServer("fast", seed=3, tool_call=["transfer_to_math_agent={}"]) as sim,
        Recorder(sim.url, "127.0.0.1:0", trace, flush_interval_s=60) as rec,
    ):
        client = AsyncOpenAI(base_url=rec.url + "/v1", api_key=SECRET, max_retries=0)
        kind = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
        model = kind(model=sim.profile.model_name, openai_client=client)
        maths = agents.Agent(
            name="Math agent", instructions="You answer maths questions.", model=model
        )
        triage = agents.Agent(
            name="Triage", instructions="You route questions.", handoffs=[maths], model=model
        )
        result = await agents.Runner.run(triage, "What is 2+2?")
        await client.close()
    assert result.last_agent.name == "Math agent"
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    assert [r["api"] for r in rows] == [api, api]
    assert len({r["session_id"] for r in rows}) == 1
    assert [(r["request_index"], r["parent_index"], r["depends_on"]) for r in rows] == [
        (0, -1, []),
        (1, 0, [0]),
    ]
    assert [r["agent_id"] for r in rows] == ["main", "math_agent"]
    streams = agent_streams(read_trace(trace)[0])  # what traces inspect lists
    assert [(a.agent_id, a.first, a.spawned_by, a.joined_by) for a in streams] == [
        ("main", 0, None, None),
        ("math_agent", 1, 0, None),
    ]
    await replay_matches(trace, rows, tmp_path / "results")
    no_secret_written(trace, tmp_path / "results")
