"""The end-of-run line names why requests were not sent, and where the GPU count of a run
comes from."""

from __future__ import annotations

import io

from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import gpu_count
from agent_replay.replay.runrecord import RunSummary
from agent_replay.replay.summary import render_summary
from agent_replay.results_schema import ErrorKind


def line(s: RunSummary) -> str:
    buf = io.StringIO()
    render_summary(s, buf)
    return buf.getvalue().splitlines()[0]


def test_an_interrupt_is_not_reported_as_past_the_duration() -> None:
    s = RunSummary(
        output="/nonexistent",
        total=20,
        sent=9,
        ok=6,
        skipped=0,
        interrupted=True,
        errors={ErrorKind.CANCELLED: 3},
    )
    assert line(s) == (
        "INTERRUPTED: partial results: 6 ok, 0 failed, 3 cancelled in flight by "
        "the interrupt, 11 not sent (interrupted), 0 not sent (past --duration), "
        "of 20 planned requests in 0.0 s"
    )
    done = RunSummary(output="/nonexistent", total=20, sent=15, ok=15, skipped=5)
    assert (
        line(done)
        == "done: 15 ok, 0 failed, 5 not sent (past --duration), of 20 planned requests in 0.0 s"
    )


def test_an_invalid_agentx_run_says_why_and_exits_1() -> None:
    s = RunSummary(
        output="/nonexistent",
        total=5,
        sent=5,
        ok=5,
        invalid_reason="measured 60 s, below the minimum of 900 s",
    )
    assert (s.status, s.exit_code) == ("invalid", 1)
    assert line(s).startswith(
        "INVALID (AgentX rule): measured 60 s, below the minimum of 900 s: 5 ok"
    )


def test_the_end_line_names_every_condition_with_its_cause() -> None:
    """A run that both failed (3 of 10 sent > 10%) and broke an AgentX rule says both; one
    interrupted and invalid says both too; the exit code follows the most serious."""
    s = RunSummary(
        output="/nonexistent",
        total=10,
        sent=10,
        ok=7,
        errors={ErrorKind.HTTP: 3},
        invalid_reason="measured 60 s, below the minimum of 900 s",
    )
    assert s.conditions == ["failed", "invalid"] and (s.status, s.exit_code) == ("failed", 1)
    assert line(s).startswith(
        "FAILED (3 of 10 sent requests failed, over 10%); INVALID (AgentX "
        "rule): measured 60 s, below the minimum of 900 s: 7 ok, 3 failed"
    )
    cut = RunSummary(
        output="/nonexistent",
        total=10,
        sent=4,
        ok=4,
        interrupted=True,
        invalid_reason="the run was interrupted (0 requests cancelled)",
    )
    assert (cut.conditions, cut.exit_code) == (["interrupted", "invalid"], 130)
    assert line(cut).startswith(
        "INTERRUPTED: partial results; INVALID (AgentX rule): the run was "
        "interrupted (0 requests cancelled): 4 ok"
    )
    one = RunSummary(
        output="/nonexistent", total=10, sent=10, ok=9, errors={ErrorKind.HTTP: 1}
    )  # 10%: not over
    assert one.conditions == [] and line(one).startswith("done: 9 ok, 1 failed")


def test_the_gpu_count_comes_from_an_option_a_launch_profile_or_is_unknown() -> None:
    base = RunConfig(trace="t", target="http://127.0.0.1:1")
    assert gpu_count(RunConfig(trace="t", target="http://x", gpus=12)) == (12, "--gpus")
    launch = RunConfig(trace="t", target="http://x", launch="standard --model m --gpus 4")
    assert gpu_count(launch) == (4, "--launch profile")
    assert gpu_count(base) == (None, "unknown (give --gpus N)")
