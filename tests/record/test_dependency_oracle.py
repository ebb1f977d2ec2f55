"""The dependency oracle of benchmarks/bench_dependencies.py: its verdicts by hand, and one
run end to end with a scripted client whose waits are known, through the delaying hop,
the recorder and the simulated engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_replay.replay.record.agents import AgentTracker
from agent_replay.traces.io import read_trace
from agent_replay.traces.summary import summarize_table
from benchmarks.bench_dependencies import (
    Client,
    Labeler,
    compare,
    longer_holds,
    measured_ancestors,
    oracle,
    record_once,
    reduction,
    request_kind,
    run_shift,
    run_verdicts,
    suggestion,
    trace_ancestors,
)


def test_labels_tell_requests_apart_by_tools_length_and_order() -> None:
    tools = [{"name": "Bash", "input_schema": {}}]
    lab = Labeler()
    a = lab(request_kind("messages", {"messages": [{"role": "user", "content": "x"}]}))
    b = lab(
        request_kind("messages", {"messages": [{"role": "user", "content": "y"}], "tools": tools})
    )
    c = lab(
        request_kind("messages", {"messages": [{"role": "user", "content": "z"}], "tools": tools})
    )
    assert a.split("#")[0] != b.split("#")[0]  # the tools differ
    assert (b.split("#")[0], b[-2:], c[-2:]) == (c.split("#")[0], "#0", "#1")


def test_verdicts_by_hand() -> None:
    """Baseline: title t at 0, turn a at 0, b at 10, c at 20 (c after b after a). Holding
    t back moves b and c in one of two runs only (a slow start): no dependency; a moves b
    and c by the delay (100); c was not sent when b was held (no verdict). The trace makes
    a wait for t (false) and b wait for nothing (two pairs missing)."""
    base = {"t": 0, "a": 0, "b": 10, "c": 20}
    delayed = {
        "t": [
            {"t": 0, "a": 0, "b": 12, "c": 19},
            {"t": 0, "a": 0, "b": 90, "c": 95},
        ],  # a slow start: once only
        "a": [{"t": 0, "a": 0, "b": 110, "c": 121}],
        "b": [{"t": 0, "a": 1, "b": 10}],
        "c": [{"t": 0, "a": 0, "b": 10, "c": 20}],
    }
    measured, unknown = measured_ancestors(base, delayed, 100)
    assert measured == {"t": set(), "a": set(), "b": {"a"}, "c": {"a"}}
    assert unknown == {("c", "b")}
    assert reduction({"b": {"a"}, "c": {"a", "b"}, "a": set()}) == {
        "b": {"a"},
        "c": {"b"},
        "a": set(),
    }
    rows = {
        lab: {"session_id": "s", "request_index": i, "depends_on": d}
        for i, (lab, d) in enumerate([("t", []), ("a", [0]), ("b", []), ("c", [2])])
    }
    traced = trace_ancestors(rows)
    assert traced == {"t": set(), "a": {"t"}, "b": set(), "c": {"b"}}
    v = compare(measured, traced, 2, unknown)
    assert (v.requests, v.true_deps, v.trace_deps) == (4, 2, 2)
    assert v.false == [("a", "t")]  # ("c", "b") has no verdict
    assert v.missing == [("b", "a"), ("c", "a")]
    assert v.unknown == 1


def test_a_codex_subagent_is_spawned_by_the_turn_that_called_spawn_agent() -> None:
    """Codex: main turn 0 calls spawn_agent; its follow-up (1, the tool's output, a text
    reply) ends before the subagent thread's first request arrives; the thread is the
    spawning turn's."""
    at = AgentTracker()
    at.place("s", 0, None, 0, -1, linked=False)
    at.complete("s", 0, 100, True)
    at.place("s", 1, None, 110, 0)
    at.complete("s", 1, 150, False)
    sub = at.place("s", 2, "thread-b", 160, -1, linked=False)
    assert (sub.agent_id, sub.depends_on, sub.think_ns) == ("thread-b", [0], 60)


TOOLS: Any = [{"name": "ls", "description": "List files.", "input_schema": {"type": "object"}}]


def scripted(log: list[str]) -> Any:
    """A client with known waits: a title (no tools) and the first turn sent together; the
    second turn after the first's answer; a second title after the second turn's."""
    import anthropic

    async def run(url: str, model: str, home: Path, work: Path) -> None:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
        hdr = {"X-Claude-Code-Session-Id": "s1"}

        async def ask(msgs: list[dict[str, Any]], tools: bool) -> str:
            # a turn streams 100 tokens (about 0.1 s on the fast profile), so that the title
            # sent beside the first turn reaches the recorder before that turn has ended,
            # however late a loaded host runs the title's task
            r = await client.messages.create(
                model=model,
                max_tokens=100 if tools else 4,
                messages=msgs,  # type: ignore[arg-type]
                extra_headers=hdr,
                extra_body={"ignore_eos": True},
                **({"tools": TOOLS} if tools else {}),
            )
            return "".join(b.text for b in r.content if b.type == "text")

        first = [{"role": "user", "content": "list the files"}]
        title = asyncio.ensure_future(ask([{"role": "user", "content": "title?"}], False))
        r0 = await ask(first, True)
        second = [
            *first,
            {"role": "assistant", "content": r0 or "ok"},
            {"role": "user", "content": "again"},
        ]
        await ask(second, True)
        await ask([{"role": "user", "content": "title 2?"}], False)
        await title  # nothing waited for it
        await client.close()
        log.append("done")

    return run


@pytest.mark.slow
async def test_the_oracle_finds_a_scripted_clients_waits(tmp_path: Path) -> None:
    log: list[str] = []
    client = Client("scripted", [], lambda exe: scripted(log))
    v, base, notes = await oracle("scripted", client, tmp_path, 0.4)
    assert len(log) == 5  # the baseline and one run per request
    # turn 2 waited for turn 1; title 2 for turn 2 (and so turn 1); title 1 for nothing
    assert (v.requests, v.true_deps) == (4, 2), notes
    assert (v.false, v.missing, v.unknown) == ([], [], 0), notes
    assert len(base.rows) == 4
    # a run's prefix figures are those traces inspect gives for its trace (one function);
    # the second turn extends the first: the engine cached some of it
    again = await record_once(client, tmp_path, None, 0)
    table, meta = read_trace(tmp_path / "trace")
    s = summarize_table(table, meta.block_size)
    assert (again.server, again.implied) == (s.server_cached_rate, s.implied_cached_rate)
    assert again.server is not None and again.server > 0


def test_a_runs_clock_is_aligned_on_the_requests_before_the_held_one() -> None:
    """Arrivals count from a run's first request; when the client sent its second request
    50 later than in the baseline, everything after it reads 50 late: the requests sent
    before the held one (the last of them) set the run's clock."""
    base = {"t": 0, "a": 1, "b": 2, "c": 10}
    run = {"t": 0, "a": 51, "b": 52, "c": 60}
    assert run_shift(base, run, "c") == 50
    assert run_shift(base, run, "t") == 0  # nothing before it
    measured, _ = measured_ancestors(base, {"c": [run], "b": [{**run, "c": 160}]}, 100)
    assert measured["c"] == {"b"}


def test_a_request_sent_before_the_held_one_in_the_baseline_never_waited_for_it() -> None:
    """A host that slowed b down in the run holding c: b came 200 later than in the
    baseline on both clocks, as a dependency would; but b was sent
    before c in the baseline, so it cannot have waited for c's answer. d, sent after c,
    moved by as much: it did."""
    base = {"a": 0, "b": 300, "g": 305, "c": 310, "d": 320}
    run = {"a": 0, "b": 500, "g": 305, "c": 20, "d": 520}
    measured, _ = measured_ancestors(base, {"c": [run]}, 100)
    assert measured["b"] == set() and measured["d"] == {"c"}


def test_the_runs_clock_is_read_on_the_requests_nearest_the_held_one() -> None:
    """A baseline that slowed down as it went (each of its steps 2 s where the held run
    took 0.5): by X's time the run's clock reads 4.5 s earlier, as the request nearest X
    says; the median of all before X says 1.5, too little to see that Y, sent 8 after X's
    own arrival where the baseline had it 0.7 after, waited for X."""
    base = {"a": 0, "b": 2000, "c": 4000, "d": 6000, "x": 8000, "y": 8700}
    run = {"a": 0, "b": 500, "c": 1000, "d": 1500, "x": 2000, "y": 10000}
    assert run_shift(base, run, "x") == -4500
    measured, _ = measured_ancestors(base, {"x": [run]}, 8000)
    assert measured["y"] == {"x"}


def test_a_wait_off_the_critical_path_is_told_by_a_longer_hold() -> None:
    """qwen-code's shape: turn a calls the agent tool; r, the main agent's reply to the
    call's result, is sent at 300; the subagent's s at 1000 and its last step e at 10300
    do not wait for r; the completion notice n (10500) carries r's reply and e's result.
    Held 8000, r's answer begins at 8600: s and e, sent before it, did not wait for r
    (e: 10300 >= 8600, yet it did not move either: the run cannot tell); n did not move
    (e held it longer) but came after r's answer: the run cannot tell either. A hold of
    2 * 8000 + 10500 - 8600 = 17900 tells both: n moves, e comes before r's answer."""
    base = {"a": 0, "r": 300, "s": 1000, "e": 10300, "n": 10500}
    held = {"a": 0, "r": 300, "s": 1000, "e": 10300, "n": 10500}
    assert run_verdicts(base, held, "r", 8000, 8600) == {
        "a": False,
        "s": False,
        "e": None,
        "n": None,
    }
    assert run_verdicts(base, held, "r", 8000) == {"a": False, "s": False, "e": False, "n": False}
    measured, unknown = measured_ancestors(base, {"r": [held]}, 8000, {"r": [8600]})
    assert measured["n"] == set() and {("n", "r"), ("e", "r")} <= unknown
    assert longer_holds(base, {"r": [held]}, {"r": [8600]}, 8000) == {"r": 17900}
    longer = {**held, "n": 18700}  # r answered at 18500; e as before
    measured, unknown = measured_ancestors(base, {"r": [held, longer]}, 8000, {"r": [8600, 18500]})
    assert measured["n"] == {"r"} and measured["e"] == set()
    assert not {("n", "r"), ("e", "r")} & unknown
    # a run that tells the opposite of another: no wait (every run that can tell must)
    other = {**held, "n": 10600}
    measured, _ = measured_ancestors(
        base, {"r": [held, longer, other]}, 8000, {"r": [8600, 18500, 19000]}
    )
    assert measured["n"] == set()
    # a host that slowed e by 4100 in the longer run: late enough to read as moved, but e
    # was sent before r's answer began (18500), so it did not wait for r
    slowed = {**longer, "e": 14400}
    assert run_verdicts(base, slowed, "r", 8000, 18500)["e"] is False
    assert run_verdicts(base, slowed, "r", 8000)["e"] is True  # what the delay alone says
    # nothing left to tell: no longer hold
    assert longer_holds(base, {"r": [longer]}, {"r": [18500]}, 8000) == {}


def test_qwen_codes_prompt_suggestion_is_no_turn_the_user_waits_for() -> None:
    said = [{"type": "text", "text": "[SUGGESTION MODE: Suggest what the user might type.]"}]
    typed = [{"type": "text", "text": "List them again."}]
    msgs: Any = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert suggestion("chat", {"messages": [*msgs, {"role": "user", "content": said}]})
    assert not suggestion("chat", {"messages": [*msgs, {"role": "user", "content": typed}]})
    assert not suggestion("chat", {"messages": msgs})
