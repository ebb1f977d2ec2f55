"""``--timing agentx`` against the simulated engine with 8 session trees: recycling,
cache-bust per play, warm-up excluded from statistics, validity in run.json; and the idle
gap skipping under the fake clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agent_replay.engines.sim
from agent_replay.analysis.results import read_run_record
from agent_replay.analysis.runstats import accumulate
from agent_replay.engines.sim import SimProcess
from agent_replay.replay.agentx import (
    IDLE_CAP_NS,
    AgentXDriver,
    Rule,
    ValidityInput,
    ValidityRules,
    agentx_validity,
    capped_times,
    first_play,
    lane_seed,
    sample_t_star,
    stream_rules,
    warm_spread,
)
from agent_replay.replay.clock import FakeClock
from agent_replay.replay.config import RunConfig
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlanOptions, build_plan
from agent_replay.replay.presets import PRESETS, AgentXSettings
from agent_replay.replay.run import run
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta
from tests.replay.helpers import MS, FakeTransport, columns_table, tree_rows_table

pytestmark = pytest.mark.slow

SPEC = [  # (agent, depends_on, prefix parent) of one tree
    ("main", [], -1),
    ("x", [0], -1),
    ("y", [0], -1),
    ("x", [1], 1),
    ("y", [2], 2),
    ("main", [0, 3, 4], 0),
    ("main", [5], 5),
    ("main", [6], 6),
]


def tree_table(n_sessions: int = 8, think_ns: int = 30 * MS) -> pa.Table:
    rows = []
    for s in range(n_sessions):
        blocks: dict[int, list[int]] = {}
        for i, (agent, deps, parent) in enumerate(SPEC):
            base = (
                blocks[parent]
                if parent >= 0
                else [s * 10_000 + (0 if agent == "main" else (3000 if agent == "x" else 6000))]
            )
            ids = base + [s * 10_000 + 100 * (i + 1) + k for k in range(4)]
            blocks[i] = ids
            rows.append(
                {
                    "session_id": f"t{s}",
                    "request_index": i,
                    "parent_index": parent,
                    "arrival_ns": s * 7 * MS + i * 100 * MS,
                    "think_ns": think_ns if deps else None,
                    "input_tokens": 16 * len(ids),
                    "output_tokens": 8,
                    "hash_ids": ids,
                    "agent_id": agent,
                    "depends_on": deps,
                }
            )
    return tree_rows_table(rows)


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("agentx")
    trace = write_trace(tree_table(), tmp / "trees.parquet", TraceMeta(block_size=16))
    profile = json.loads(
        (Path(agent_replay.engines.sim.__file__).parent / "profiles" / "fast.json").read_text()
    )
    profile.update(name="fast-short", max_model_len=150)  # the longest prompts (> 150) overflow
    (tmp / "short.json").write_text(json.dumps(profile))
    out: dict[str, Path] = {}
    # 160 tokens: main's r6 and r7 (208, 272 tokens) get vLLM's engine-side "longer than the
    # maximum model length", which only our overflow rule knows; every earlier turn fits
    profile.update(name="fast-160", max_model_len=160)
    (tmp / "160.json").write_text(json.dumps(profile))
    runs = (
        ("ok", "fast", 4.0, AgentXSettings()),
        ("overflow", str(tmp / "short.json"), 1.5, AgentXSettings()),
        ("engine_aiperf", str(tmp / "160.json"), 1.5, AgentXSettings()),
        ("engine_ours", str(tmp / "160.json"), 1.5, AgentXSettings(overflow_rule="agent-replay")),
        ("short", "fast", 1.0, PRESETS["aiperf-agentx-mvp"].agentx),
    )
    for name, prof, dur, ax in runs:
        with SimProcess(prof) as sim:
            out[name] = tmp / name
            summary = run(
                RunConfig(
                    trace=str(trace),
                    target=sim.url,
                    output=str(out[name]),
                    salt=7,
                    timing="agentx",
                    concurrency=8,
                    duration_s=dur,
                    agentx=ax,
                    scrape_interval_s=0,
                    progress=False,
                ),
                progress=None,
            )
            (out[name] / "exit").write_text(f"{summary.exit_code} {summary.status}")
    yield out


def rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path / "requests").to_pylist()


def test_recycling_and_a_fresh_cache_bust_per_play(sim_runs: dict[str, Path]) -> None:
    r = [x for x in rows(sim_runs["ok"]) if x["status"] == "ok"]
    plays: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for x in r:
        plays.setdefault((x["session_id"], x["clone"]), []).append(x)
    assert len(plays) > 8 and all(c > 0 for _, c in plays)  # trees recycled, each play its clone
    assert len({c for _, c in plays}) == len(plays)
    # full plays (every request of the tree, none warm-up) of one session: the server's
    # prefix-hit rate is the same for every copy, as for a first play (no sharing across copies)
    full: dict[str, list[float]] = {}
    for (sid, _), xs in plays.items():
        if len(xs) == len(SPEC) and not any(x["warmup"] for x in xs):
            full.setdefault(sid, []).append(
                sum(x["cached_tokens"] for x in xs) / sum(x["prompt_tokens"] for x in xs)
            )
    repeated = {s: v for s, v in full.items() if len(v) >= 2}
    assert repeated, full
    for rates in repeated.values():
        assert max(rates) - min(rates) < 1e-9, rates
        assert 0 < rates[0] < 1


def test_first_plays_start_mid_tree_after_an_excluded_warm_up(sim_runs: dict[str, Path]) -> None:
    r = rows(sim_runs["ok"])
    warm = [x for x in r if x["warmup"]]
    assert warm and all(x["expected_output_tokens"] == 1 for x in warm)
    measured_start = max(x["end_ns"] for x in warm)
    assert all(x["sent_ns"] >= measured_start for x in r if not x["warmup"])
    for key in {(x["session_id"], x["clone"]) for x in warm}:
        played = {
            x["request_index"]
            for x in r
            if (x["session_id"], x["clone"]) == key and not x["warmup"]
        }
        first = min(played)
        assert first >= 2  # 25-75% of the 0.7 s span: t* after r1's start
        assert played == set(range(first, len(SPEC)))
        # every stream with turns on both sides of t* warms its last turn before t*
        want = set()
        for agent in {SPEC[i][0] for i in played}:
            before = [i for i in range(first) if SPEC[i][0] == agent]
            if before:
                want.add(before[-1])
        assert {x["request_index"] for x in warm if (x["session_id"], x["clone"]) == key} == want
    stats = accumulate(pq.read_table(sim_runs["ok"] / "requests").to_batches()).finish()
    assert stats.requests["counted"] == len(r) - len(warm)
    meta = read_run_record(sim_runs["ok"])
    assert meta.agentx is not None and meta.agentx["responses"] == len(r) - len(warm)
    assert meta.agentx["valid"] is True and meta.valid is True


def test_overflow_above_one_percent_marks_the_run_invalid(
    sim_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    r = [x for x in rows(sim_runs["overflow"]) if not x["warmup"]]
    over = [x for x in r if x["http_status"] == 400]
    assert len(over) / len(r) > 0.01
    meta = read_run_record(sim_runs["overflow"])
    assert meta.agentx is not None
    assert meta.valid is False and meta.agentx["context_overflows"] == len(over)
    # main's turns are r0, r5, r6, r7: an overflow before r7 ends main in its play, and
    # main's later turns are not sent (nothing spawns after r0)
    mains, dropped = [0, 5, 6, 7], 0
    for play in {(x["session_id"], x["clone"]) for x in over}:
        first = min(
            (
                x["request_index"]
                for x in over
                if (x["session_id"], x["clone"]) == play and x["request_index"] in mains
            ),
            default=7,
        )
        later = {m for m in mains if m > first}
        dropped += len(later)
        assert not later & {x["request_index"] for x in r if (x["session_id"], x["clone"]) == play}
    assert dropped > 0 and meta.agentx["overflow_dropped"] == dropped
    assert meta.warnings[0].startswith("INVALID run (AgentX rule)")
    from agent_replay.replay.cli import main

    assert main(["report", str(sim_runs["overflow"])]) == 0
    assert "INVALID run (AgentX rule)" in capsys.readouterr().out


def test_the_default_overflow_rule_is_aiperfs_list(sim_runs: dict[str, Path]) -> None:
    """vLLM's engine-side "longer than the maximum model length" is not in AIPerf's list:
    under the default rule main's r6 fails and its last turn r7 is still sent, as AIPerf
    sends it; under ours (``agent-replay``) r6 is an overflow that ends main, so r7 is not."""
    got: dict[str, tuple[int, int, int, int]] = {}
    for name in ("engine_aiperf", "engine_ours"):
        r = [x for x in rows(sim_runs[name]) if not x["warmup"]]
        meta = json.loads((sim_runs[name] / "run.json").read_text())
        r6 = [x for x in r if x["request_index"] == 6]
        assert r6 and all(
            x["http_status"] == 400
            and "maximum model length" in x["error"]
            and "context length" not in x["error"].lower()
            for x in r6
        )
        assert all(x["http_status"] in (None, 200) for x in r if x["request_index"] < 6)
        # r7 goes the moment r6 ends (think 30 ms): no play that sent r6 misses it but by the duration
        plays6 = {(x["session_id"], x["clone"]) for x in r6 if x["end_ns"] < sim_end(r) - 100 * MS}
        plays7 = {(x["session_id"], x["clone"]) for x in r if x["request_index"] == 7}
        got[name] = (
            len(plays6),
            len(plays6 & plays7),
            meta["agentx"]["context_overflows"],
            meta["agentx"]["overflow_dropped"],
        )
        assert meta["agentx"]["rules"]["overflow_rule"] == (
            "aiperf" if name == "engine_aiperf" else "agent-replay"
        )
    n6, sent7, over, dropped = got["engine_aiperf"]
    assert n6 > 0 and sent7 == n6 and over == 0 and dropped == 0
    n6, sent7, over, dropped = got["engine_ours"]
    assert n6 > 0 and sent7 == 0 and over > 0 and dropped >= n6


def sim_end(r: list[dict[str, Any]]) -> int:
    return max(x["end_ns"] for x in r if x["end_ns"] is not None)


def test_overflow_rules_on_hand_written_messages() -> None:
    from agent_replay.replay.validity import is_overflow

    engine = (
        "HTTP 400: The decoder prompt (length 208) is longer than the maximum model length of 160."
    )
    front = (
        'HTTP 400: {"error": {"message": "This model\'s maximum context length is 160 '
        'tokens", "type": "BadRequestError"}}'
    )
    escaped = 'HTTP 400: {"error": {"message": "context\\u0020length exceeded"}}'  # JSON escape
    event = "error event: {'message': 'prompt is too long: 210000 tokens'}"
    table = {
        ("aiperf", 400, engine): False,
        ("agent-replay", 400, engine): True,
        ("aiperf", 400, front): True,
        ("agent-replay", 400, front): True,
        ("aiperf", 400, escaped): True,
        ("agent-replay", 400, escaped): False,
        ("aiperf", None, event): True,
        ("agent-replay", None, event): False,
        ("aiperf", 500, "HTTP 500: Internal Server Error"): False,
        ("aiperf", 400, None): False,
    }
    assert {k: is_overflow(k[1], k[2], k[0]) for k in table} == table


S = 1_000 * MS
# (agent, depends_on, think in ms) of a tree whose idle gaps the cap shortens three times
IDLE_TREE = [
    ("main", [], None),
    ("x", [0], 30_000),
    ("y", [0], 2_000),
    ("x", [1], 40_000),
    ("main", [0, 2, 3], 5_000),
    ("main", [4], 7_410),
    ("main", [5], 100_000),
]


def idle_tree_table() -> pa.Table:
    rows = []
    for i, (agent, deps, think) in enumerate(IDLE_TREE):
        rows.append(
            {
                "session_id": "t",
                "request_index": i,
                "parent_index": -1,
                "arrival_ns": i * S,
                "think_ns": None if think is None else think * MS,
                "input_tokens": 32,
                "output_tokens": 4,
                "hash_ids": [i * 10, i * 10 + 1],
                "agent_id": agent,
                "depends_on": deps,
            }
        )
    return tree_rows_table(rows)


def test_idle_cap_after_several_skips_keeps_the_schedule_exact() -> None:
    """Every request served in 1 s; nothing in flight is idle and capped at 10 s. x and y
    are one branch (spawned by r0, joined by r4), starting at x's first t (1 s). By hand:
    r0 at 0 (ends 1); r1 (x's first) at 1 + 0 (ends 2); r2 (y's first) at 1 + (2 - 1) = 2
    (ends 3); r3 due 2 + 40 = 42, idle since 3: capped to 13 (skip 29); r4 joins at r3's end
    14 (x ran past r0, the parent's previous turn: no delay); r5 at 15 + 7.41 = 22.41; r6
    due 23.41 + 100, capped to 33.41 (skip 90). The lane recycles the tree at 34.41: r0
    34.41, r1 35.41, r2 36.41, r3 due 76.41 capped to 47.41 (skip 29), r4 48.41; r5 (due
    56.82) and r6 fall after the 50 s duration."""
    plan = build_plan(idle_tree_table(), 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=50 * S,
        start_range=(0.0, 0.0),
    )
    clock.run(d.run())
    got = [(x.clone, x.request_index, x.intended_ns, x.think_ns) for x in recs]
    assert got == [
        (1, 0, 0, None),
        (1, 1, 1 * S, 0),
        (1, 2, 2 * S, 1 * S),
        (1, 3, 13 * S, 11 * S),
        (1, 4, 14 * S, 0),
        (1, 5, 22_410 * MS, 7_410 * MS),
        (1, 6, 33_410 * MS, 10 * S),
        (2, 0, 34_410 * MS, None),
        (2, 1, 35_410 * MS, 0),
        (2, 2, 36_410 * MS, 1 * S),
        (2, 3, 47_410 * MS, 11 * S),
        (2, 4, 48_410 * MS, 0),
    ]
    assert not any(x.warmup for x in recs)
    assert all(x.sent_ns == x.intended_ns for x in recs)
    assert list(d.schedule_lag) == [0] * len(recs)  # against the shifted schedule
    assert d.idle_skipped_ns == (29 + 90 + 29) * S and d.idle_skips == 3 and d.skipped == 2


def _tree(rows: list[tuple[str, str, float, list[int], float | None]]) -> pa.Table:
    """(session, agent, t s, depends_on, service s or None) rows -> a trace table (think
    times end-to-start from the latest dependency, an unknown service time counting as 0,
    as the weka import gives them)."""
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
            "end_ns",
            "agent_id",
            "depends_on",
        )
    }
    index: dict[str, int] = {}
    at: dict[tuple[str, int], tuple[float, float]] = {}
    for sid, agent, t, deps, svc in rows:
        i = index.get(sid, 0)
        index[sid] = i + 1
        at[(sid, i)] = (t, svc or 0.0)
        think = None if not deps else max(0.0, t - max(sum(at[(sid, d)]) for d in deps))
        for k, v in (
            ("session_id", sid),
            ("request_index", i),
            ("parent_index", -1),
            ("arrival_ns", round(t * S)),
            ("think_ns", None if think is None else round(think * S)),
            ("input_tokens", 32),
            ("output_tokens", 4),
            ("hash_ids", [i]),
            ("end_ns", None if svc is None else round(svc * S)),
            ("agent_id", agent),
            ("depends_on", deps),
        ):
            cols[k].append(v)
    return columns_table(cols)


def test_an_agentx_run_reuses_a_connection_idle_past_four_seconds(tmp_path: Path) -> None:
    """AIPerf keeps idle connections for reuse up to 300 s, and so does an AgentX run (the
    simulated engine keeps them open an hour): the turn sent 4.5 s after its parent ended
    rides the parent's connection, where the 4 s of other timings would open a new one."""
    table = _tree([("a", "main", 0.0, [], 0.05), ("a", "main", 4.55, [0], 0.05)])
    trace = write_trace(table, tmp_path / "t.parquet", TraceMeta(block_size=32))
    with SimProcess("fast") as sim:
        run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(tmp_path / "out"),
                timing="agentx",
                concurrency=1,
                duration_s=5.5,
                agentx=AgentXSettings(start_min=0.0, start_max=0.0),
                scrape_interval_s=0,
                progress=False,
            ),
            progress=None,
        )
    r = sorted((x for x in rows(tmp_path / "out") if not x["warmup"]), key=lambda x: x["sent_ns"])
    assert [x["request_index"] for x in r[:2]] == [0, 1] and all(x["status"] == "ok" for x in r[:2])
    assert r[1]["sent_ns"] - r[0]["end_ns"] > 4.4 * S
    assert r[0]["connect_ns"] is not None and r[1]["connect_ns"] is None


def _first_plays(
    table: pa.Table, lanes: int, duration_s: float, **kw: Any
) -> list[tuple[int, int, int]]:
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=lanes,
        duration_ns=round(duration_s * S),
        **kw,
    )
    clock.run(d.run())
    return sorted(
        (x.clone, x.request_index, x.intended_ns) for x in recs if x.clone <= lanes and not x.warmup
    )


def test_a_join_goes_when_its_subagent_ends_after_the_parents_previous_turn() -> None:
    """AIPerf's join: a subagent still running when the parent's previous turn ends
    releases the join the moment it ends (no delay); one done before gets the parent's
    end-to-start delay after that turn. Served in 1 s, no idle cap. Session a: r0 0-1; x
    spawned by r0 (r1 at 1, ends 2; r3 at 2, ends 3); r2 (main) at 1 + 0.2 = 1.2, ends 2.2;
    r4 joins x: x ended at 3 > 2.2, so r4 at 3 (the recorded think after x's end, 17 s,
    is not waited). Session b: r0 0-1; x r1 at 1, ends 2; r2 at 1 + 4 = 5, ends 6 (after
    x); r3 at 6 + (10 - 5 - 1) = 10."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 1, [0], 1),
            ("a", "main", 1.2, [0], 1),
            ("a", "x", 2, [1], 1),
            ("a", "main", 20, [2, 3], 1),
            ("b", "main", 0, [], 1),
            ("b", "x", 1, [0], 1),
            ("b", "main", 5, [0], 1),
            ("b", "main", 10, [2, 1], 1),
        ]
    )
    got = _first_plays(table, 2, 30, start_range=(0.0, 0.0), idle_cap_ns=None)
    assert got == [
        (1, 0, 0),
        (1, 1, 1 * S),
        (1, 2, 1_200 * MS),
        (1, 3, 2 * S),
        (1, 4, 3 * S),
        (2, 0, 0),
        (2, 1, 1 * S),
        (2, 2, 5 * S),
        (2, 3, 10 * S),
    ]


def test_subagents_and_the_main_agents_flattened_agents_are_branches_apart() -> None:
    """A subagent x (first call at 1 s) and a flattened agent of the main agent, fa:000
    (first call at 3 s), both spawned by r0 and joined by r3: AIPerf's ``spawn:x`` and
    ``flatspawn:0`` are two branches, each starting at its own first t, so both first calls
    go 0 s after r0 ends (one branch would start at 1 s and send fa:000 2 s late). Served
    in 1 s: r0 0-1, x 1-2, fa:000 1-2; r3 joins at 2 (x outlived r0)."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 1, [0], 1),
            ("a", "fa:000", 3, [0], 1),
            ("a", "main", 10, [0, 1, 2], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    reqs = plan.sessions[0].requests
    rules = stream_rules(reqs, *capped_times(reqs, None))
    assert [(r.kind, r.delay_ns, r.branch) for r in rules[1:3]] == [
        ("child", 0, (1,)),
        ("child", 0, (2,)),
    ]
    assert _first_plays(table, 1, 30, start_range=(0.0, 0.0), idle_cap_ns=None) == [
        (1, 0, 0),
        (1, 1, 1 * S),
        (1, 2, 1 * S),
        (1, 3, 2 * S),
    ]


def test_a_request_waits_for_the_calls_of_its_scope_that_ended_before_it_started() -> None:
    """AIPerf's recorded-interval barrier between the main agent and its flattened agent
    fa:000. Recorded: r0 main 0-1; r1 fa:000 1-1.5 (spawned by r0); r2 main 1.6-2.1; r3
    fa:000 3-3.5; r4 main at 10 joins fa:000. Each call is held back for the other stream's
    latest call that ended before it started: r1 for r0, r2 for r1, r3 for r2, r4 for r3.
    Served in 1 s: r0 0-1; r1 at 1 (ends 2); r2's own rule says 1 + 0.6 = 1.6, but r1 ends
    at 2: r2 at 2 (ends 3); r3 at 2 + 1.5 = 3.5 (r2 ended at 3: no hold), ends 4.5; r4 joins
    at 4.5 (fa:000 outlived r2). The join of an unknown service time: a call with none
    counts as ending at its start (AIPerf's start-to-start gap)."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "fa:000", 1, [0], 0.5),
            ("a", "main", 1.6, [0], 0.5),
            ("a", "fa:000", 3, [1], 0.5),
            ("a", "main", 10, [2, 3], 1),
        ]
    )
    reqs = build_plan(table, 16, PlanOptions()).sessions[0].requests
    rules = stream_rules(reqs, *capped_times(reqs, None))
    assert [r.barrier for r in rules] == [(), (0,), (1,), (2,), (3,)]
    assert _first_plays(table, 1, 30, start_range=(0.0, 0.0), idle_cap_ns=None) == [
        (1, 0, 0),
        (1, 1, 1 * S),
        (1, 2, 2 * S),
        (1, 3, 3_500 * MS),
        (1, 4, 4_500 * MS),
    ]
    # a real subagent is a scope of its own: no barrier between it and the main agent
    real = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 1, [0], 0.5),
            ("a", "main", 1.6, [0], 0.5),
            ("a", "x", 3, [1], 0.5),
            ("a", "main", 10, [2, 3], 1),
        ]
    )
    reqs = build_plan(real, 16, PlanOptions()).sessions[0].requests
    assert all(r.barrier == () for r in stream_rules(reqs, *capped_times(reqs, None)))
    # a join after a call without a service time: 5 - (0 + 0) = 5 s, start to start
    cut = _tree([("a", "main", 0, [], None), ("a", "x", 1, [0], 1), ("a", "main", 5, [0, 1], 1)])
    reqs = build_plan(cut, 16, PlanOptions()).sessions[0].requests
    assert stream_rules(reqs, *capped_times(reqs, None))[2] == Rule(
        "join", 5 * S, prev=0, deps=(0, 1)
    )


def test_a_branch_that_overlapped_its_spawning_turn_goes_from_that_turns_send() -> None:
    """AIPerf's runtime dispatches a branch that started while its spawning main turn was
    in flight (recorded: r0 0-8.2 s, x's first call at 8 s, y's at 9 s) when that turn is
    sent, each child at its offset from the turn's start (``on_credit_issued``). Served in
    1 s: r0 0-1; x at 0 + 8 = 8 (after r0's end it would go at 1 + 0), y at 9; r3 joins at
    y's end, 10. A subagent's own spawn is not dispatched so: z's turn w (spawned by z's
    r1 at 2 s, recorded 2-5 s) waits for r1's end."""
    table = _tree(
        [
            ("a", "main", 0, [], 8.2),
            ("a", "x", 8, [0], 1),
            ("a", "y", 9, [0], 1),
            ("a", "main", 100, [0, 1, 2], 1),
        ]
    )
    reqs = build_plan(table, 16, PlanOptions()).sessions[0].requests
    rules = stream_rules(reqs, *capped_times(reqs, None))
    assert [(r.kind, r.delay_ns, r.at_send) for r in rules[1:3]] == [
        ("child", 8 * S, True),
        ("child", 9 * S, True),
    ]
    assert _first_plays(table, 1, 40, start_range=(0.0, 0.0)) == [
        (1, 0, 0),
        (1, 1, 8 * S),
        (1, 2, 9 * S),
        (1, 3, 10 * S),
    ]
    nested = _tree(
        [
            ("b", "main", 0, [], 1),
            ("b", "z", 1, [0], 1),
            ("b", "z", 2, [1], 3),
            ("b", "w", 3, [2], 1),
            ("b", "main", 50, [0, 3], 1),
        ]
    )
    reqs = build_plan(nested, 16, PlanOptions()).sessions[0].requests
    assert not any(r.at_send for r in stream_rules(reqs, *capped_times(reqs, None)))


def test_a_branch_of_a_turn_an_overflow_dropped_is_dropped_with_it() -> None:
    """r0 overflows, so main's later turns (r1, r3) are not sent; x's branch overlapped r1
    (recorded 2-10.2 s, x at 10 s) and would go at r1's send, which never comes: x is
    dropped too, and the play ends with nothing else sent."""

    class Overflowing(FakeTransport):
        async def send(self, prepared: Any, rec: RequestRecord) -> None:
            await super().send(prepared, rec)
            if prepared[0].request_index == 0:
                rec.http_status, rec.error = 400, "This model's maximum context length is 8 tokens"

    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "main", 2, [0], 8.2),
            ("a", "x", 10, [1], 1),
            ("a", "main", 100, [1, 2], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        Overflowing(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=3 * S,
        start_range=(0.0, 0.0),
        idle_cap_ns=None,
    )
    clock.run(d.run())
    assert [(x.clone, x.request_index) for x in recs if x.clone == 1] == [(1, 0)]
    assert d.dropped >= 3


def test_a_request_task_that_raises_fails_the_run_instead_of_leaving_it_waiting() -> None:
    """r1's task raises before it is sent: r2, which waits for r1, is never spawned, so its
    play would wait forever; the run ends with r1's error instead."""

    class Failing(FakeTransport):
        async def prepare(self, q: Any, request_id: str, session_key: str) -> Any:
            if q.request_index == 1 and "warmup" not in request_id:
                raise RuntimeError("prepare failed")
            return await super().prepare(q, request_id, session_key)

    table = _tree([("a", "main", 0, [], 1), ("a", "main", 2, [0], 1), ("a", "main", 4, [1], 1)])
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    d = AgentXDriver(
        plan,
        Failing(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=lambda r: None,
        lanes=1,
        duration_ns=30 * S,
        start_range=(0.0, 0.0),
        idle_cap_ns=None,
    )
    with pytest.raises(RuntimeError, match="prepare failed"):
        clock.run(asyncio.wait_for(d.run(), 60))


def test_a_subagents_first_turn_waits_its_branch_offset_past_the_idle_cap() -> None:
    """x and y are one branch (spawned by r0, joined by r3), its start x's first t (1 s):
    x goes 0 s after r0 ends, y 30 s after (31 - 1), although nothing is in flight from 2
    s on and the system idle cap is 10 s (AIPerf sleeps a child's offset outside the
    scheduler its cap moves); r3 joins at y's end, 32."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 1, [0], 1),
            ("a", "y", 31, [0], 1),
            ("a", "main", 100, [0, 1, 2], 1),
        ]
    )
    assert _first_plays(table, 1, 40, start_range=(0.0, 0.0)) == [
        (1, 0, 0),
        (1, 1, 1 * S),
        (1, 2, 31 * S),
        (1, 3, 32 * S),
    ]


def test_a_first_play_warms_every_live_stream_and_keeps_offsets_from_t_star() -> None:
    """Span 0-10 s, start range 0.35-0.35: t* = 3.5 s. Played: r2 (main, 4 s), r3 (x, 6 s),
    r4 (the join, 10 s). Warm-ups, one token each: main's last turn before t* (r0, recorded
    3.5 s before t*) at 0 and x's (r1, 2.5 s before) at 3.5 - 2.5 = 1 s; r1 ends at 2, the
    measured start. r2 goes at 2 + (4 - 3.5) = 2.5, r3 at 2 + (6 - 3.5) = 4.5 (their
    dependencies were before t*), r4 joins at r3's end 5.5 (x outlived r2)."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 1, [0], 1),
            ("a", "main", 4, [0], 1),
            ("a", "x", 6, [1], 1),
            ("a", "main", 10, [3, 2], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=5 * S,
        start_range=(0.35, 0.35),
    )
    clock.run(d.run())
    warm = sorted(
        (x.request_index, x.intended_ns, x.expected_output_tokens) for x in recs if x.warmup
    )
    assert warm == [(0, 0, 1), (1, 1 * S, 1)]
    assert d.measured_start_ns == 2 * S
    got = sorted((x.intended_ns, x.request_index) for x in recs if x.clone == 1 and not x.warmup)
    assert got == [(2_500 * MS, 2), (4_500 * MS, 3), (5_500 * MS, 4)]


def test_warm_ups_are_spread_so_every_lanes_t_star_lands_at_their_end() -> None:
    """AIPerf's spread warm-up, two lanes, served in 1 s, system idle cap 10 s, start range
    0.5-0.5. Lane 0 plays a (span 0-60 s, t* = 30): main warms r0 (lead 30 s), x warms r1
    (t 12, lead 18); r2 (main at 30), r3 (x at 40) and the join r4 are played. Lane 1 plays
    b (span 0-100, t* = 50): main warms r1 (t 5, lead 45); r2 (at 100) is played. The
    longest lead, 45, goes first: b.r1 at 0, a.r0 due 45 - 30 = 15, a.r1 due 45 - 18 = 27.
    b.r1 ends at 1; idle since, the cap moves every waiting warm-up 4 s earlier: a.r0 at 11
    (ends 12), a.r1 due 23, moved 1 s to 22 (ends 23): the measured start. a.r2 at 23 + (30 -
    30) = 23 (ends 24), a.r3 at 23 + (40 - 30) = 33 (idle 24-33 is under the cap), a.r4
    joins at a.r3's end 34; b.r2, due 23 + 50 = 73, is past the 11.5 s duration (34.5)."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "x", 12, [0], 1),
            ("a", "main", 30, [0], 1),
            ("a", "x", 40, [1], 1),
            ("a", "main", 60, [2, 3], 1),
            ("b", "main", 0, [], 1),
            ("b", "main", 5, [0], 1),
            ("b", "main", 100, [1], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    assert [s.session_id for s in plan.sessions] == ["a", "b"]
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=2,
        duration_ns=11_500 * MS,
        start_range=(0.5, 0.5),
    )
    clock.run(d.run())
    got = sorted((x.intended_ns, x.session_id, x.request_index, x.warmup) for x in recs)
    assert got == [
        (0, "b", 1, True),
        (11 * S, "a", 0, True),
        (22 * S, "a", 1, True),
        (23 * S, "a", 2, False),
        (33 * S, "a", 3, False),
        (34 * S, "a", 4, False),
    ]
    assert d.measured_start_ns == 23 * S
    assert (d.idle_skips, d.idle_skipped_ns, d.skipped) == (2, 5 * S, 1)


class _OverflowTransport(FakeTransport):
    """Answers a prompt over 500 tokens with vLLM's context-length HTTP 400, after serving it."""

    async def send(self, prepared: Any, rec: RequestRecord) -> None:
        await super().send(prepared, rec)
        if prepared[0].input_tokens > 500:
            rec.http_status = 400
            rec.fail("http", "This model's maximum context length is 400 tokens")


def test_a_context_overflow_ends_its_stream_and_the_tree_goes_on() -> None:
    """AIPerf ends a stream at a context overflow on any turn but its last. One lane,
    served in 1 s, no idle cap. r0 (main) 0-1; r1 (x, spawned by r0) 1-2 overflows: x's
    r2 is dropped at 2; r3 (main) at 1 + 1 = 2, ends 3; the join r4 waits for r3 and x,
    whose dropped r2 ended at 2, before r3: its delay, 10 - (2 + 1) = 7 s, after r3, at 10;
    r5 at 11 + 1 = 12 overflows: main's r6 and y (r7, which r6 would spawn) are dropped.
    The 13 s duration ends the run before the lane's next play."""
    rows = [
        ("main", 0, [], 32),
        ("x", 1, [0], 900),
        ("x", 3, [1], 32),
        ("main", 2, [0], 32),
        ("main", 10, [3, 2], 32),
        ("main", 12, [4], 900),
        ("main", 14, [5], 32),
        ("y", 15, [6], 32),
    ]
    table = _tree([("a", agent, t, deps, 1) for agent, t, deps, _ in rows])
    table = table.set_column(
        table.schema.get_field_index("input_tokens"),
        "input_tokens",
        pa.array([n for *_, n in rows], pa.int32()),
    )
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        _OverflowTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=13 * S,
        start_range=(0.0, 0.0),
        idle_cap_ns=None,
    )
    clock.run(d.run())
    got = sorted((x.intended_ns, x.request_index, x.http_status) for x in recs)
    assert got == [
        (0, 0, None),
        (1 * S, 1, 400),
        (2 * S, 3, None),
        (10 * S, 4, None),
        (12 * S, 5, 400),
    ]
    assert (d.dropped, d.total, d.skipped) == (3, 5, 0)


def test_warm_spread_caps_each_lead_at_the_trace_idle_cap() -> None:
    """Leads 30, 18 and 45 s: 15, 27 and 0 s after the warm-up starts; with a 20 s trace
    idle cap the leads are 20, 18, 20: 0, 2 and 0 s."""
    assert warm_spread([30 * S, 18 * S, 45 * S], None) == [15 * S, 27 * S, 0]
    assert warm_spread([30 * S, 18 * S, 45 * S], 20 * S) == [0, 2 * S, 0]
    assert warm_spread([], None) == []


def test_warm_up_turns_go_back_to_back_and_the_play_starts_after_them() -> None:
    """One chain, turns at 0, 2, 4, 6 s (1 s each), start range 0.3-0.3: t* = 1.8 s, so r0
    warms (0-1 s); with one warm-up turn r1 follows back to back (1-2 s); the measured start
    is 2 s and the play starts at r2, at once (its offset is the new t*), r3 at 3 + (6 - 4
    - 1) = 4 s."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "main", 2, [0], 1),
            ("a", "main", 4, [1], 1),
            ("a", "main", 6, [2], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=3 * S,
        start_range=(0.3, 0.3),
        warmup_requests=1,
    )
    clock.run(d.run())
    assert [(x.request_index, x.intended_ns, x.warmup) for x in recs] == [
        (0, 0, True),
        (1, 1 * S, True),
        (2, 2 * S, False),
        (3, 4 * S, False),
    ]
    assert d.measured_start_ns == 2 * S


def test_a_warm_up_longer_than_the_duration_still_leaves_a_measured_phase() -> None:
    """The chain above with a 0.5 s duration: the warm-up (r0 0-1 s, then r1 1-2 s back to
    back) outlasts it, yet the duration counts from the warm-up's end (2 s), so r2 goes at
    2 s and r3, due at 4 s, is past the 2.5 s deadline. A deadline counted from the run's
    start cut the warm-up turns and measured nothing (seen on a GPU: 6 lanes whose stream
    warm-ups spread over 48 s of a 40 s run)."""
    table = _tree(
        [
            ("a", "main", 0, [], 1),
            ("a", "main", 2, [0], 1),
            ("a", "main", 4, [1], 1),
            ("a", "main", 6, [2], 1),
        ]
    )
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=S // 2,
        start_range=(0.3, 0.3),
        warmup_requests=1,
    )
    clock.run(d.run())
    assert [(x.request_index, x.intended_ns, x.warmup) for x in recs] == [
        (0, 0, True),
        (1, 1 * S, True),
        (2, 2 * S, False),
    ]
    assert d.measured_start_ns == 2 * S and d.skipped == 1


def test_t_star_is_drawn_as_aiperf_draws_it() -> None:
    """The seed and the draw of AIPerf 0.13.0's ``_seed_for_trace_lane`` and
    ``default_rng(seed).uniform(lo, hi)``, values printed by AIPerf itself: seed 42, trace
    "trace_0277", lanes 0 and 1, over 0-1,062,000 ms."""
    assert lane_seed(42, "trace_0277", 0) == 5455050004541897606
    assert lane_seed(42, "trace_0277", 1) == 2008786018912519716
    offs = [0, 500_000 * MS, 1_062_000 * MS]
    assert sample_t_star(offs, 0.0, 1.0, 42, "trace_0277", 0) == 1061133.657246249
    assert sample_t_star(offs, 0.0, 1.0, 42, "trace_0277", 1) == 132339.42137145528
    assert sample_t_star(offs, 0.5, 0.5, 42, "trace_0277", 1) == 531000.0  # no draw
    from agent_replay.replay.worker import _first_lane

    # 5 lanes over 2 workers: 3 and 2, so worker 1's lane 0 is run-wide lane 3
    assert [_first_lane(5, w, 2) for w in (0, 1)] == [0, 3]
    assert [_first_lane(7, w, 3) for w in (0, 1, 2)] == [0, 3, 5]


def test_start_sampling_is_an_instant_not_a_rounded_turn() -> None:
    """A 3-request session cut at t*: the requests at or after t* are played; a stream
    with requests on both sides warms its last one before t*."""
    table = _tree([("a", "main", 0, [], 1), ("a", "main", 10, [0], 1), ("a", "main", 20, [1], 1)])
    reqs = build_plan(table, 16, PlanOptions()).sessions[0].requests
    offs = [q.offset_ns for q in reqs]
    assert first_play(reqs, offs, 5_000.0).keep == [1, 2]
    assert first_play(reqs, offs, 5_000.0).warm == [0]
    assert first_play(reqs, offs, 10_000.0).keep == [1, 2]  # a turn at t* is played
    assert first_play(reqs, offs, 0.0).keep == [0, 1, 2] and first_play(reqs, offs, 0.0).warm == []
    assert first_play(reqs, offs, 10_000.001).keep == [2]


def test_a_run_below_its_presets_minimum_is_invalid_and_exits_non_zero(
    sim_runs: dict[str, Path],
) -> None:
    meta = read_run_record(sim_runs["short"])
    assert meta.valid is False and meta.status == "invalid"
    assert "below the minimum of 900 s" in (meta.invalid_reason or "")
    assert meta.option("agentx.preset") == "aiperf-agentx-mvp"
    assert meta.option("agentx.start_min") == 0.0 and meta.option("agentx.start_max") == 1.0
    assert (sim_runs["short"] / "exit").read_text() == "1 invalid"
    assert meta.extra["warnings_before_run"] == [
        "--duration 1 s is below the minimum of 900 s (aiperf-agentx-mvp): the run will be invalid"
    ]
    assert (sim_runs["ok"] / "exit").read_text() == "0 ok"  # no minimum without a preset


def test_validity_rules_on_hand_computed_facts() -> None:
    rows = (
        [(False, 200, None)] * 97
        + [(False, 400, "maximum context length exceeded")]
        + [(False, 500, "boom")] * 2
        + [(True, 400, "too long")] * 5
    )  # warm-up left out
    rules = ValidityRules(min_duration_s=900, failure_threshold=0.02, metric_coverage=0.95)
    ok = ValidityInput(
        failed=3, measured_s=1000, expected_s=1000, last_first_token_s=940, last_itl_end_s=960
    )
    v = agentx_validity(rows, rules, ok)
    # 1 overflow of 100 responses = 1% (allowed: strictly more is invalid); 3 failed > 2%
    assert v["responses"] == 100 and v["context_overflows"] == 1 and v["overflow_fraction"] == 0.01
    assert v["valid"] is False and v["invalid_reasons"] == [
        "3 of 100 requests (3.0%) failed (threshold 2%)"
    ]
    assert v["ttft_coverage"] == 0.94 and v["itl_coverage"] == 0.96  # max 0.96 >= 0.95: covered
    short = ValidityInput(
        failed=2,
        measured_s=899.0,
        expected_s=1000,
        last_first_token_s=900,
        last_itl_end_s=940,
        cancelled=4,
    )
    r = agentx_validity(rows, rules, short)["invalid_reasons"]
    assert r == [
        "the run was interrupted (4 requests cancelled)",
        "measured 899 s, below the minimum of 900 s",
        "metrics cover 94.0% of the 1,000 s window (needs 95%)",
    ]
    assert agentx_validity(rows, ValidityRules(), ValidityInput())["valid"] is True


def test_presets_resolve_with_explicit_values_on_top() -> None:
    from agent_replay.replay.presets import resolve

    ax, dur = resolve("inferencex-agentx", {"warmup_requests": 3, "seed": None}, None)
    assert dur == 3600.0 and ax.warmup_requests == 3 and ax.seed == 42
    assert (ax.start_min, ax.start_max, ax.tree_idle_cap_s, ax.idle_cap_s) == (
        0.25,
        0.75,
        300.0,
        10.0,
    )
    assert (ax.failure_threshold, ax.metric_coverage, ax.min_duration_s) == (0.10, 0.95, 900.0)
    ax, dur = resolve("aiperf-agentx-mvp", {}, 1200.0)
    assert dur == 1200.0 and (ax.start_min, ax.start_max, ax.warmup_requests) == (0.0, 1.0, 0)


@pytest.mark.shared_data
def test_real_weka_trees_keep_their_think_times_under_the_idle_cap(shared_data: Path) -> None:
    """Every real weka trace with subagents, one lane, an hour of fake time, every request
    served in 2 s: no intended send before t0 or flagged warm-up outside the warm-up, every
    think time got is the recorded one, or shorter only where the idle cap moved it, and
    nothing in flight never idles longer than the cap."""
    from agent_replay.traces.importers import import_paths

    files = sorted((shared_data / "weka").glob("trace_*.json"))
    res = import_paths(files, "weka")
    plan = build_plan(res.table, res.meta.block_size, PlanOptions())
    recorded = {
        (q.session_id, q.request_index): q.think_ns for s in plan.sessions for q in s.requests
    }
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 2 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=3600 * S,
        seed=3,
    )
    clock.run(d.run())
    real = [x for x in recs if not x.warmup]
    assert len(real) > 100 and d.idle_skips > 10
    shortened = 0
    for x in real:
        assert x.intended_ns >= 0
        if x.parent_end_ns is None or x.think_ns is None:
            continue
        want = recorded[(x.session_id, x.request_index)]
        assert 0 <= x.think_ns <= want
        shortened += x.think_ns < want
    assert shortened > 0
    # a send after every earlier request ended follows idle time: at most the cap
    last_end = None
    for sent, end in sorted((x.sent_ns or 0, x.end_ns or 0) for x in recs):
        if last_end is not None and sent > last_end:
            assert sent - last_end <= IDLE_CAP_NS
        last_end = end if last_end is None else max(last_end, end)


def test_tree_idle_cap_shortens_only_stretches_where_the_tree_was_idle() -> None:
    """Recorded: r0 main 0-1 s; r1 subagent x spawned 1 s later, busy 2-52 s; r2 main at
    100 s (think 99 s after r0); r3 main at 200 s (think 99 s after r2's end at 101 s).
    With a 20 s trace idle cap, the idle stretch 52-100 s loses 28 s and 101-200 s loses
    79 s: r2's think becomes 99 - 28 = 71 s (the subagent kept the tree busy for 50 s of
    it; a cap on each think time would give 20 s), r3's 99 - 79 = 20 s. Served in 1 s
    each, no system idle cap: r0 at 0, r1 (x's first turn, its branch's start) at 1 + 0,
    r2 at 1 + 71 = 72, r3 at 73 + 20 = 93."""
    rows = [
        ("main", 0, [], None, 1),
        ("x", 2, [0], 1, 50),
        ("main", 100, [0], 99, 1),
        ("main", 200, [2], 99, 1),
    ]
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
            "end_ns",
            "agent_id",
            "depends_on",
        )
    }
    for i, (agent, t, deps, think, dur) in enumerate(rows):
        for k, v in (
            ("session_id", "t"),
            ("request_index", i),
            ("parent_index", -1),
            ("arrival_ns", t * S),
            ("think_ns", None if think is None else think * S),
            ("input_tokens", 32),
            ("output_tokens", 4),
            ("hash_ids", [i]),
            ("end_ns", dur * S),
            ("agent_id", agent),
            ("depends_on", deps),
        ):
            cols[k].append(v)
    table = columns_table(cols)
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=1,
        duration_ns=94 * S,
        start_range=(0.0, 0.0),
        idle_cap_ns=None,
        tree_idle_cap_ns=20 * S,
    )
    clock.run(d.run())
    got = sorted((x.intended_ns, x.request_index) for x in recs if x.clone == 1)
    assert got == [(0, 0), (1 * S, 1), (72 * S, 2), (93 * S, 3)]


def test_a_send_due_after_the_duration_goes_if_the_idle_cap_brings_it_before() -> None:
    """Sessions a (r1 thinks 100 s) and b (r1 thinks 0.5 s), two lanes, 1 s service, 15 s
    duration. By hand: a#1 r0 and b#2 r0 at 0 (end 1); b#2 r1 at 1.5 (ends 2.5); lane 2
    recycles a as a#3, r0 at 2.5 (ends 3.5). Idle since 3.5: a#1 r1 (due 101) moves to
    13.5 and a#3 r1 to 16; a#1 r1 goes at 13.5 although due after the duration when it was
    scheduled; lane 1 then recycles b as b#4 at 14.5; a#3 r1 and b#4 r1 fall after 15 s."""
    rows = [("a", 0, None), ("a", 1, 100_000), ("b", 0, None), ("b", 1, 500)]
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "session_id",
            "request_index",
            "parent_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
        )
    }
    for sid, i, think in rows:
        for k, v in (
            ("session_id", sid),
            ("request_index", i),
            ("parent_index", i - 1),
            ("arrival_ns", i * S),
            ("think_ns", None if think is None else think * MS),
            ("input_tokens", 32),
            ("output_tokens", 4),
            ("hash_ids", [i]),
        ):
            cols[k].append(v)
    table = columns_table(cols)
    plan = build_plan(table, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(
        plan,
        FakeTransport(clock, 1 * S),
        clock,
        t0_ns=0,
        on_record=recs.append,
        lanes=2,
        duration_ns=15 * S,
        start_range=(0.0, 0.0),
    )
    clock.run(d.run())
    got = sorted((x.intended_ns, x.clone, x.request_index) for x in recs)
    assert got == [
        (0, 1, 0),
        (0, 2, 0),
        (1_500 * MS, 2, 1),
        (2_500 * MS, 3, 0),
        (13_500 * MS, 1, 1),
        (14_500 * MS, 4, 0),
    ]
    assert d.skipped == 2


def _chain_with_a_long_middle_turn() -> pa.Table:
    """One main stream: r0 (32 tokens), r1 (400), r2 (48); at t* = 60% of its span the
    warm-up is r1, longer than a 150-token context."""
    rows = []
    for i, n in enumerate((2, 25, 3)):
        rows.append(
            {
                "session_id": "s",
                "request_index": i,
                "parent_index": i - 1,
                "arrival_ns": i * 100 * MS,
                "think_ns": 30 * MS if i else None,
                "input_tokens": 16 * n,
                "output_tokens": 4,
                "hash_ids": list(range(100 * i, 100 * i + n)),
                "agent_id": "main",
                "depends_on": [i - 1] if i else [],
            }
        )
    return tree_rows_table(rows)


@pytest.mark.parametrize("policy", ["abort", "continue"])
def test_a_failed_main_warm_up_ends_the_run_unless_told_to_continue(
    tmp_path: Path, policy: str
) -> None:
    """AIPerf ends its run on the first failed warm-up of a root stream; so does ours by
    default, in one line naming the request; `continue` plays the measured turn anyway."""
    trace = write_trace(
        _chain_with_a_long_middle_turn(), tmp_path / "t.parquet", TraceMeta(block_size=16)
    )
    profile = json.loads(
        (Path(agent_replay.engines.sim.__file__).parent / "profiles" / "fast.json").read_text()
    )
    profile.update(name="fast-150", max_model_len=150)
    (tmp_path / "p.json").write_text(json.dumps(profile))
    out = tmp_path / "run"
    with SimProcess(str(tmp_path / "p.json")) as sim:
        summary = run(
            RunConfig(
                trace=str(trace),
                target=sim.url,
                output=str(out),
                salt=7,
                timing="agentx",
                concurrency=1,
                duration_s=2.0,
                scrape_interval_s=0,
                progress=False,
                agentx=AgentXSettings(start_min=0.6, start_max=0.6, warmup_failure=policy),
            ),
            progress=None,
        )
    got = rows(out)
    warm = [x for x in got if x["warmup"]]
    assert [(x["request_index"], x["status"]) for x in warm] == [(1, "error")]
    measured = [x["request_index"] for x in got if not x["warmup"]]
    meta = json.loads((out / "run.json").read_text())
    if policy == "abort":
        assert measured == [] and summary.status == "aborted" and summary.exit_code != 0
        line = meta["abort_reason"]
        assert line.startswith("warm-up request s[1] failed (http 400") and "AIPerf" in line
    else:
        # the measured turn after t*, then recycled plays of the whole session
        assert measured[0] == 2 and len(measured) > 1 and summary.status != "aborted"
