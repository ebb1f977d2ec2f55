"""Claude Code's and Codex's own OpenTelemetry export, received by ``record-otlp``, against
the trace the recorder makes of the same session: the agent talks through the recorder to
the simulated engine and exports its telemetry to the receiver at the same time. Request
count and token totals must agree.

Install the programs with scripts/setup-real-clients.sh; each test skips when its program
is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.otlp_receiver import EXPORTS_FILE, OtlpReceiver
from agent_replay.traces.io import read_trace
from agent_replay.traces.otlp import attributes, log_records
from agent_replay.traces.otlp import spans as export_spans
from agent_replay.traces.stats import implied_cached_tokens
from benchmarks import realclients
from tests.realclient.test_real_clients import (
    AGENT,
    CODEX_LS,
    LS,
    SECRET,
    codex_exec,
    no_secret_written,
    program,
    replay_matches,
    run_program,
)

pytestmark = [pytest.mark.slow, pytest.mark.realclient]


async def _both(tmp: Path, tool_calls: list[str], argv_env: Any) -> tuple[list[dict], list[dict]]:
    """(recorder rows, receiver rows) of one run, each in arrival order."""
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("hello\n")
    async with (
        SimServer("fast", seed=3, tool_call=tool_calls) as sim,
        Recorder(sim.url, "127.0.0.1:0", tmp / "recorded", flush_interval_s=60) as rec,
    ):
        otlp = OtlpReceiver("127.0.0.1:0", tmp / "received", flush_interval_s=60)
        await otlp.start()
        try:
            argv, env = argv_env(rec.url, sim.profile.model_name, home, otlp.url)
            await run_program(argv, env, work)
        finally:
            await otlp.stop()
    recorded = sorted(read_trace(tmp / "recorded")[0].to_pylist(), key=lambda r: r["arrival_ns"])
    received = sorted(read_trace(tmp / "received")[0].to_pylist(), key=lambda r: r["arrival_ns"])
    no_secret_written(tmp / "received")
    return recorded, received


def _reuse_points(received: Path, recorded: list[dict]) -> float:
    """Prefix reuse implied by the received trace's hash ids (derived from cache counts)
    minus the server's own cached fraction of the recorded prompts, in points."""
    table, meta = read_trace(received)
    assert meta.extra["hash_ids_from"] == "cache counts"
    total = sum(r["input_tokens"] for r in recorded)
    implied = int(implied_cached_tokens(table, meta.block_size).sum())
    server = sum(r["cached_tokens"] or 0 for r in recorded)
    return 100 * (implied - server) / total


def _report(name: str, tmp: Path, recorded: list[dict], received: list[dict]) -> list[float]:
    """One line of figures (pytest -s shows it): counts, totals, reuse, send-time gaps;
    returns the gaps (recorder arrival - OTel send, ms)."""
    r_meta, o_meta = read_trace(tmp / "recorded")[1], read_trace(tmp / "received")[1]
    gaps = [
        (
            (r_meta.start_wall_ns or 0)
            + r["arrival_ns"]
            - (o_meta.start_wall_ns or 0)
            - o["arrival_ns"]
        )
        / 1e6
        for r, o in zip(recorded, received, strict=True)
    ]
    size = sorted(abs(g) for g in gaps)
    print(
        f"{name}: requests, input, output {_totals(recorded)} recorded, {_totals(received)} "
        f"received; reuse {_reuse_points(tmp / 'received', recorded):+.2f} points; "
        f"recorder arrival - OTel send, ms: {[round(g, 1) for g in gaps]} (|error| p50 "
        f"{size[(len(size) - 1) // 2]:.1f}, max {size[-1]:.1f}); tree equal: "
        f"{_tree(received) == _tree(recorded)}"
    )
    return gaps


def _totals(rows: list[dict]) -> tuple[int, int, int]:
    return (len(rows), sum(r["input_tokens"] for r in rows), sum(r["output_tokens"] for r in rows))


def claude_env(
    claude: str, url: str, model: str, home: Path, otlp: str, spans: bool = False
) -> tuple[list[str], dict[str, str]]:
    env = realclients.claude_env(url, model, home, SECRET, max_output=8000)
    del env["DISABLE_TELEMETRY"]
    env.update(
        # the telemetry recipe of docs/recording.md
        CLAUDE_CODE_ENABLE_TELEMETRY="1",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp,
        OTEL_LOGS_EXPORT_INTERVAL="500",
    )
    if spans:  # the enhanced-telemetry recipe: its claude_code.llm_request spans too
        env.update(
            CLAUDE_CODE_ENHANCED_TELEMETRY_BETA="1",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_TRACES_EXPORT_INTERVAL="500",
        )
    return [
        claude,
        "-p",
        "List the files here.",
        "--max-turns",
        "3",
        "--allowedTools",
        "Bash(ls)",
    ], env


@pytest.mark.parametrize("spans", [False, True], ids=["events", "spans"])
async def test_claude_code_telemetry(tmp_path: Path, spans: bool) -> None:
    claude = program("claude")

    def argv_env(url: str, model: str, home: Path, otlp: str) -> tuple[list[str], dict[str, str]]:
        return claude_env(claude, url, model, home, otlp, spans)

    recorded, received = await _both(tmp_path, [LS], argv_env)
    assert _totals(received) == _totals(recorded), (recorded, received)
    assert {r["api"] for r in received} == {"messages"}
    assert abs(_reuse_points(tmp_path / "received", recorded)) <= 1
    gaps = _report(f"claude code {'spans' if spans else 'events'}", tmp_path, recorded, received)
    assert len({r["session_id"] for r in received}) == 1
    assert max(abs(g) for g in gaps) <= 250, gaps  # as for the subagents below


def _tree(rows: list[dict]) -> list[tuple[object, ...]]:
    """Each request's stream (numbered by first appearance), parent and dependencies."""
    names: dict[str, int] = {}
    return [
        (names.setdefault(r["agent_id"], len(names)), r["parent_index"], r["depends_on"])
        for r in sorted(rows, key=lambda r: r["request_index"])
    ]


def _streams(rows: list[dict], *, subagents: bool = False) -> list[list[int]]:
    """The request indices of each stream (only the subagents' with ``subagents``), the
    streams in order of their first request."""
    by: dict[str, list[int]] = {}
    for r in sorted(rows, key=lambda r: r["request_index"]):
        if not (subagents and r["agent_id"].startswith("main")):
            by.setdefault(r["agent_id"], []).append(r["request_index"])
    return list(by.values())


@pytest.mark.parametrize("spans", [False, True], ids=["events", "spans"])
async def test_claude_code_subagents_telemetry(tmp_path: Path, spans: bool) -> None:
    """The engine answers with the Agent tool where it is offered: nested subagents, which
    Claude Code's events (agent.name, the Agent call's tool_decision and tool_result) must
    give the same tree as the recorder's headers. Claude Code 2.1.197: nested subagents,
    each waited for by its caller. Its spans name no query_source: the session title is a
    side request by its api_request event."""
    claude = program("claude-2.1.197")

    def argv_env(url: str, model: str, home: Path, otlp: str) -> tuple[list[str], dict[str, str]]:
        argv, env = claude_env(claude, url, model, home, otlp, spans=spans)
        return [*argv, "Agent"], env

    recorded, received = await _both(tmp_path, [AGENT, LS], argv_env)
    assert _totals(received) == _totals(recorded)
    assert len({r["agent_id"] for r in recorded}) >= 3
    assert _streams(received, subagents=True) == _streams(recorded, subagents=True)
    if not any("/" in r["agent_id"] for r in recorded + received):
        assert _tree(received) == _tree(recorded)
    # else the session title request and the first turn overlapped in one trace (a race;
    # the events' end times are the client's, later than the server's): the main agent's
    # lanes differ, and the recorder spawns the first subagent off the title request
    if spans:  # the spans' own times: who waits for whom as the recorder saw it, the
        # session title waited for by none
        assert [t[::2] for t in _tree(received)] == [t[::2] for t in _tree(recorded)]
    assert abs(_reuse_points(tmp_path / "received", recorded)) <= 1
    _report(f"claude code subagents {'spans' if spans else 'events'}", tmp_path, recorded, received)
    # the received trace replays: same token counts, tree and think times
    await replay_matches(tmp_path / "received", received, tmp_path / "results")


@pytest.mark.parametrize("spans", [False, True], ids=["events", "spans"])
async def test_claude_code_background_subagents(tmp_path: Path, spans: bool) -> None:
    """The current Claude Code, whose subagents run in the background: its api_request
    events and (enhanced telemetry) llm_request spans name the agent that sent each
    request (agent_id, parent_agent_id)."""
    claude = program("claude")
    version = subprocess.run(
        [claude, "--version"], capture_output=True, text=True, timeout=60
    ).stdout.split()
    if not version or tuple(int(x) for x in version[0].split(".")[:3]) < (2, 1, 300):
        pytest.skip(
            f"claude {' '.join(version[:1])} predates background subagents "
            "(scripts/setup-real-clients.sh installs the current release as claude)"
        )

    def argv_env(url: str, model: str, home: Path, otlp: str) -> tuple[list[str], dict[str, str]]:
        argv, env = claude_env(claude, url, model, home, otlp, spans=spans)
        return [*argv, "Agent"], env

    recorded, received = await _both(tmp_path, [AGENT, LS], argv_env)
    assert _totals(received) == _totals(recorded)
    gaps = _report(
        f"claude code background subagents {'spans' if spans else 'events'}",
        tmp_path,
        recorded,
        received,
    )
    assert len({r["agent_id"] for r in recorded}) >= 3
    assert _streams(received, subagents=True) == _streams(recorded, subagents=True)
    # who waits for whom, as the recorder saw it (the recorder may parent a nested
    # subagent's first request by content elsewhere: parent_index is not compared)
    assert [t[::2] for t in _tree(received)] == [t[::2] for t in _tree(recorded)]
    assert abs(_reuse_points(tmp_path / "received", recorded)) <= 1
    # the same requests, sent at about the same time (client time on a loaded host: up to
    # ~100 ms, benchmarks/journal/2026-12-06-otel-send-times.md)
    assert max(abs(g) for g in gaps) <= 250, gaps


async def test_codex_telemetry(tmp_path: Path) -> None:
    codex = program("codex")
    plain = codex_exec(codex, "List the files here.")

    def argv_env(url: str, model: str, home: Path, otlp: str) -> tuple[list[str], dict[str, str]]:
        argv, env = plain(url, model, home)
        with (home / "config.toml").open("a") as fh:  # the [otel] recipe of docs/recording.md
            fh.write(
                "\n[otel]\nlog_user_prompt = false\nexporter = { otlp-http = { endpoint = "
                f'"{otlp}/v1/logs", protocol = "json" }} }}\n'
                "trace_exporter = { otlp-http = { endpoint = "
                f'"{otlp}/v1/traces", protocol = "json" }} }}\n'
            )
        return argv, env

    recorded, received = await _both(tmp_path, [CODEX_LS, LS], argv_env)
    assert _totals(received) == _totals(recorded), (recorded, received)
    assert {r["api"] for r in received} == {"responses"}
    # the send time is the start of the span each api_request record names: no span of
    # Codex's opens inside it (docs/recording.md, "Send times")
    exported = [
        orjson.loads(x) for x in (tmp_path / "received" / EXPORTS_FILE).read_bytes().splitlines()
    ]
    all_spans = [sp for e in exported for _, sp in export_spans(e)]
    named = {
        rec.get("spanId")
        for e in exported
        for _, rec in log_records(e)
        if attributes(rec.get("attributes")).get("event.name") == "codex.api_request"
    }
    assert len(named) == len(recorded)
    assert named <= {sp["spanId"] for sp in all_spans}
    assert not [sp["name"] for sp in all_spans if sp.get("parentSpanId") in named]
    assert abs(_reuse_points(tmp_path / "received", recorded)) <= 1
    _report("codex", tmp_path, recorded, received)
