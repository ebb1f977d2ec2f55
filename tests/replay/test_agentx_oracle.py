"""The AIPerf-oracle comparison functions (benchmarks/agentx_oracle.py) on hand-built
traces, AIPerf records and plans: every figure below is computed by hand."""

from __future__ import annotations

import math

import pytest

from benchmarks import agentx_oracle as ao

# A WEKA trace: main turn 0 (t 0, 10 s), a subagent spawned at t 30 with two calls (inner t
# relative: 0 and 5 -> 30 and 35), main turn 2 at t 60 after the subagent ended (t 30 + 20 s).
TRACE = {
    "id": "tr",
    "requests": [
        {"type": "s", "t": 0.0, "api_time": 10.0, "in": 100, "out": 10, "hash_ids": [1]},
        {
            "type": "subagent",
            "t": 30.0,
            "agent_id": "agent_001",
            "duration_ms": 20000,
            "requests": [
                {"type": "n", "t": 0.0, "api_time": 2.0, "in": 50, "out": 5, "hash_ids": [9]},
                {"type": "n", "t": 5.0, "api_time": 3.0, "in": 70, "out": 7, "hash_ids": [9]},
            ],
        },
        {"type": "s", "t": 60.0, "api_time": 4.0, "in": 200, "out": 20, "hash_ids": [1, 2]},
    ],
}
M0, S0, S1, M2 = ("tr", 0, None), ("tr", 1, 0), ("tr", 1, 1), ("tr", 2, None)


def test_index_trace_puts_relative_inner_times_on_the_session_clock() -> None:
    ix = ao.index_trace(TRACE)
    assert ix.streams[("tr", "main")] == [M0, M2]
    assert ix.streams[("tr", "agent_001")] == [S0, S1]
    assert ix.calls[S1].t == 35.0 and ix.calls[S1].input_tokens == 70
    assert ix.subagents[0].end == 50.0
    assert ao.key_str(S1) == "tr[1].1" and ao.key_str(M2) == "tr[2]"


def _rec(
    conv: str,
    outer: int,
    inner: int | None,
    start_ms: float,
    end_ms: float,
    *,
    phase: str = "profiling",
    ttft_ms: float = 1.0,
    isl: int = 100,
    osl: int = 10,
    root: str = "play1",
) -> dict:
    md = {
        "conversation_id": conv,
        "source_trace_id": "tr",
        "source_outer_idx": outer,
        "request_start_ns": int(start_ms * 1e6),
        "request_end_ns": int(end_ms * 1e6),
        "benchmark_phase": phase,
        "root_correlation_id": root,
        "x_correlation_id": conv,
    }
    if inner is not None:
        md["source_inner_idx"] = inner
    return {
        "metadata": md,
        "metrics": {
            "time_to_first_token": {"value": ttft_ms, "unit": "ms"},
            "usage_prompt_tokens": {"value": isl, "unit": "tokens"},
            "output_sequence_length": {"value": osl, "unit": "tokens"},
        },
    }


def test_aiperf_sent_reads_keys_streams_phases_and_times() -> None:
    recs = [
        _rec("tr", 0, None, 0, 100, phase="warmup"),
        _rec("tr::sa:agent_001:aux:002", 1, 1, 200, 260, ttft_ms=20, isl=70, osl=7),
        {"metadata": {"conversation_id": "x"}, "metrics": {}},
    ]  # no source: skipped
    a = ao.aiperf_sent(recs, run=3)
    assert len(a) == 2
    assert a[0].warmup and a[0].key == M0 and a[0].stream == "main"
    s = a[1]
    assert (s.key, s.stream, s.run, s.play, s.warmup) == (S1, "agent_001", 3, "play1", False)
    assert (s.send_ns, s.first_token_ns, s.end_ns) == (200_000_000, 220_000_000, 260_000_000)
    assert (s.input_tokens, s.output_tokens, s.error) == (70, 7, False)


def test_ours_sent_maps_each_agent_stream_by_rank_and_checks_tokens() -> None:
    ix = ao.index_trace(TRACE)
    plan = [
        {"session_id": "tr", "request_index": i, "agent_id": a}
        for i, a in enumerate(["main", "agent_001", "agent_001", "main"])
    ]
    ranks = ao.stream_ranks(plan)
    assert ranks == {("tr", 0): 0, ("tr", 1): 0, ("tr", 2): 1, ("tr", 3): 1}
    base = {
        "session_id": "tr",
        "clone": 2,
        "warmup": False,
        "first_token_ns": 5,
        "end_ns": 9,
        "prompt_tokens": 70,
        "completion_tokens": 7,
        "status": "ok",
    }
    rows = [
        dict(base, request_index=2, agent_id="agent_001", sent_ns=1, expected_input_tokens=70),
        dict(
            base,
            request_index=3,
            agent_id="main",
            sent_ns=2,
            expected_input_tokens=999,
            status="error",
        ),
        dict(base, request_index=7, agent_id="main", sent_ns=3, expected_input_tokens=1),
    ]
    got, problems = ao.ours_sent(rows, ix, ranks, run=0)
    assert [s.key for s in got] == [S1, M2]
    assert got[0].play == "tr#2" and not got[0].error and got[1].error
    assert problems == [
        "ours: tr[2] expected 200 input tokens, row says 999",
        "ours: tr/main request 7 is not in the traces",
    ]


META = {
    "conversations": [
        {
            "conversation_id": "tr",
            "branches": [
                {
                    "branch_id": "tr:spawn:agent_001",
                    "child_conversation_ids": ["tr::sa:agent_001"],
                    "start_timestamp_ms": 30000.0,
                }
            ],
            "turns": [
                {
                    "source_trace_id": "tr",
                    "source_outer_idx": 0,
                    "timestamp_ms": 0.0,
                    "delay_ms": None,
                    "branch_ids": ["tr:spawn:agent_001"],
                    "prerequisites": [],
                    "replay_predecessors": [],
                },
                {
                    "source_trace_id": "tr",
                    "source_outer_idx": 2,
                    "timestamp_ms": 60000.0,
                    "delay_ms": 50000.0,
                    "branch_ids": [],
                    "prerequisites": [{"kind": "spawn_join", "branch_id": "tr:spawn:agent_001"}],
                    "replay_predecessors": [],
                },
            ],
        },
        {
            "conversation_id": "tr::sa:agent_001",
            "branches": [],
            "turns": [
                {
                    "source_trace_id": "tr",
                    "source_outer_idx": 1,
                    "source_inner_idx": 0,
                    "timestamp_ms": 30000.0,
                    "delay_ms": None,
                    "prerequisites": [],
                    "replay_predecessors": [],
                },
                {
                    "source_trace_id": "tr",
                    "source_outer_idx": 1,
                    "source_inner_idx": 1,
                    "timestamp_ms": 35000.0,
                    "delay_ms": 3000.0,
                    "prerequisites": [],
                    "replay_predecessors": [],
                },
            ],
        },
    ]
}


def test_aiperf_rules_spawn_at_the_turns_end_and_join_without_delay() -> None:
    r = ao.aiperf_rules(META)
    assert r[M0] == ao.Rule(frozenset(), 0.0, "first")
    # the child's first call: the spawning turn's end + (30000 - branch start 30000)
    assert r[S0] == ao.Rule(frozenset({M0}), 0.0, "child-first", branch=frozenset({S0}))
    assert r[S1] == ao.Rule(frozenset({S0}), 3000.0, "next")
    assert r[M2] == ao.Rule(frozenset({M0, S1}), 50000.0, "join")  # its own delay_ms


def test_aiperf_rules_dispatch_an_overlapping_branch_at_the_spawning_turns_send() -> None:
    """AIPerf's runtime (``BranchOrchestrator.on_credit_issued``): the branch starts at 30 s
    while its spawning root turn, recorded 0-40 s (``api_time_ms`` 40000), is in flight, so
    its child goes 30000 ms after that turn's send; without an ``api_time_ms``, or from a
    conversation that is not a root (depth 1), it goes after the turn's end."""
    import copy

    meta = copy.deepcopy(META)
    root = meta["conversations"][0]
    root.update(agent_depth=0, replay_scope_id="tr")
    root["turns"][0]["api_time_ms"] = 40000.0
    assert ao.aiperf_rules(meta)[S0] == ao.Rule(
        frozenset({M0}), 30000.0, "child-at-send", branch=frozenset({S0})
    )
    root["turns"][0]["api_time_ms"] = 20000.0  # ended at 20 s, before the branch's start
    assert ao.aiperf_rules(meta)[S0].kind == "child-first"
    root["turns"][0]["api_time_ms"] = None
    assert ao.aiperf_rules(meta)[S0].kind == "child-first"
    root["turns"][0]["api_time_ms"] = 40000.0
    root["agent_depth"] = 1
    assert ao.aiperf_rules(meta)[S0].kind == "child-first"


def test_ours_rules_are_the_replays_stream_rules_and_equal_aiperfs_here() -> None:
    """Our plan of TRACE (our import's rows: offsets, service times, dependencies, think
    times end-to-start from the latest dependency). ``stream_rules``: the subagent's first
    call goes 0 ms after M0 ends (its branch starts at its own first t, 30 s), S1 3 s after
    S0 (35 - (30 + 2)), the join M2 50 s after M0 (60 - (0 + 10)) when the subagent ended
    first, although the recorded think time counts 22 s from S1's end: the same as
    AIPerf's plan, request by request."""
    import pyarrow as pa

    from agent_replay.replay.plan import PlanOptions, build_plan

    S = 1_000_000_000
    rows = [
        ("main", 0, 10, [], None),
        ("agent_001", 30, 2, [0], 20),
        ("agent_001", 35, 3, [1], 3),
        ("main", 60, 4, [0, 2], 22),
    ]
    table = pa.table(
        {
            "session_id": ["tr"] * 4,
            "request_index": list(range(4)),
            "parent_index": [-1] * 4,
            "arrival_ns": [t * S for _, t, _, _, _ in rows],
            "think_ns": [None if k is None else k * S for *_, k in rows],
            "input_tokens": [100, 50, 70, 200],
            "output_tokens": [10, 5, 7, 20],
            "hash_ids": [[1], [9], [9], [1, 2]],
            "end_ns": [d * S for _, _, d, _, _ in rows],
            "agent_id": [a for a, *_ in rows],
            "depends_on": [deps for _, _, _, deps, _ in rows],
        },
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("request_index", pa.int32()),
                ("parent_index", pa.int32()),
                ("arrival_ns", pa.int64()),
                ("think_ns", pa.int64()),
                ("input_tokens", pa.int32()),
                ("output_tokens", pa.int32()),
                ("hash_ids", pa.list_(pa.int64())),
                ("end_ns", pa.int64()),
                ("agent_id", pa.string()),
                ("depends_on", pa.list_(pa.int32())),
            ]
        ),
    )
    o = ao.ours_rules(build_plan(table, 16, PlanOptions()), ao.index_trace(TRACE))
    assert o == {
        M0: ao.Rule(frozenset(), 0.0, "first"),
        S0: ao.Rule(frozenset({M0}), 0.0, "child-first", branch=frozenset({S0})),
        S1: ao.Rule(frozenset({S0}), 3000.0, "next"),
        M2: ao.Rule(frozenset({M0, S1}), 50000.0, "join"),
    }
    assert ao.compare_rules(ao.aiperf_rules(META), o) == []


def _sent(
    side: str,
    key: ao.Key,
    send: int,
    end: int,
    *,
    play: str = "p",
    warmup: bool = False,
    first: int | None = None,
    osl: int = 10,
    run: int = 0,
    error: bool = False,
) -> ao.Sent:
    stream = "main" if key[2] is None else "agent_001"
    return ao.Sent(side, run, key, stream, play, warmup, send, first, end, 100, osl, error)


def test_measured_gaps_use_the_latest_awaited_end_in_the_same_play() -> None:
    """Play p: the join M2 follows S1's end (the subagent ended after M0): 1 ms after it,
    planned 0 (it goes at once). Play r: M0 ends after S1, so M2's planned gap is its delay,
    7 ms, after M0's end; sent 10 ms after it."""
    rules = {
        M0: ao.Rule(frozenset(), 0.0, "first"),
        S0: ao.Rule(frozenset({M0}), 0.0, "child-first"),
        S1: ao.Rule(frozenset({S0}), 3.0, "next"),
        M2: ao.Rule(frozenset({M0, S1}), 7.0, "join"),
    }
    ms = 1_000_000
    sent = [
        _sent("x", M0, 0, 10 * ms),
        _sent("x", S0, 12 * ms, 20 * ms),
        _sent("x", S1, 23 * ms, 40 * ms),
        _sent("x", M2, 41 * ms, 50 * ms),
        # another play: M2 measured, but its awaited S1 only as a warm-up -> left out
        _sent("x", M0, 0, 5 * ms, play="q"),
        _sent("x", S1, 0, 7 * ms, play="q", warmup=True),
        _sent("x", M2, 9 * ms, 10 * ms, play="q"),
        # a failed request is left out
        _sent("x", S0, 30 * ms, 31 * ms, play="q", error=True),
        _sent("x", M0, 0, 50 * ms, play="r"),
        _sent("x", S1, 0, 40 * ms, play="r"),
        _sent("x", M2, 60 * ms, 70 * ms, play="r"),
    ]
    g = ao.measured_gaps(sent, rules)
    assert g == {
        S0: [ao.Gap(2.0, 0.0)],
        S1: [ao.Gap(3.0, 3.0)],
        M2: [ao.Gap(1.0, 0.0), ao.Gap(10.0, 7.0)],
    }
    d = ao.compare_gaps(
        {S0: [ao.Gap(2.0, 1.0), ao.Gap(4.0, 1.0), ao.Gap(9.0, 5.0)], M2: [ao.Gap(1.0, 0.0)]},
        {S0: [ao.Gap(1.0, 1.0)], S1: [ao.Gap(5.0, 5.0)]},
    )
    assert [
        (x.key, x.aiperf_ms, x.ours_ms, x.diff_ms, x.n_aiperf, x.plan_aiperf_ms, x.plan_ours_ms)
        for x in d
    ] == [(S0, 4.0, 1.0, 3.0, 3, 1.0, 1.0)]


def test_percentile_is_linear_interpolation() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert ao.percentile(xs, 50) == 2.5
    assert ao.percentile(xs, 90) == pytest.approx(3.7)  # 1 + 0.9 * 3 = position 2.7
    assert ao.percentile([5.0], 99) == 5.0
    assert math.isnan(ao.percentile([], 50))
    s = ao.summarize([-3.0, 1.0, 2.0])
    assert s == {"n": 3, "p50_ms": 2.0, "p99_ms": pytest.approx(2.98), "max_ms": 3.0}


def test_interactivity_pools_non_error_measured_requests_with_osl_over_one() -> None:
    s = 1_000_000_000
    rows = [  # (E2E - TTFT) / (OSL - 1): 9 s / 9 = 1.0, 4 s / 4 = 1.0 ... below
        _sent("x", M0, 0, 10 * s, first=1 * s, osl=10),  # 1.0 s/token
        _sent("x", S0, 0, 5 * s, first=1 * s, osl=5),  # 1.0
        _sent("x", S1, 0, 3 * s, first=1 * s, osl=5),  # 0.5
        _sent("x", M2, 0, 9 * s, first=1 * s, osl=3),  # 4.0
        _sent("x", M2, 0, 9 * s, first=1 * s, osl=1),  # OSL 1: left out
        _sent("x", M2, 0, 9 * s, first=1 * s, osl=9, warmup=True),
        _sent("x", M2, 0, 9 * s, first=1 * s, osl=9, error=True),
    ]
    got = ao.interactivity(rows)
    # sorted 0.5, 1.0, 1.0, 4.0; P90 at position 2.7 -> 1.0 + 0.7 * 3.0 = 3.1 s/token
    assert got["n"] == 4
    assert got["p90_s_per_token"] == pytest.approx(3.1)
    assert got["tok_s_user"] == pytest.approx(1 / 3.1)


def test_compare_tokens_and_spread() -> None:
    ix = ao.index_trace(TRACE)
    a = ao.Sent("aiperf", 0, S1, "agent_001", "p", False, 0, 1, 2, 68, 7, False)
    o = ao.Sent("ours", 0, S1, "agent_001", "p", False, 0, 1, 2, 70, 7, False)
    only = ao.Sent("ours", 0, M0, "main", "p", False, 0, 1, 2, 100, 10, False)
    (t,) = ao.compare_tokens([a, o, only], ix)
    assert (t.key, t.trace_in, t.aiperf_in, t.ours_in, t.trace_out, t.aiperf_out) == (
        S1,
        70,
        68.0,
        70.0,
        7,
        7.0,
    )
    sp = ao.spread([90.0, 110.0, 100.0])
    assert sp == {"mean": 100.0, "min": 90.0, "max": 110.0, "rel_range": 0.2}


def test_classify_separates_plan_idle_cap_and_lag() -> None:
    g = ao.GapDiff(
        S1,
        aiperf_ms=3010.0,
        ours_ms=3001.0,
        n_aiperf=1,
        n_ours=1,
        plan_aiperf_ms=3000.0,
        plan_ours_ms=3000.0,
    )
    assert ao.classify(g, False) == "lag"
    capped = ao.GapDiff(
        S1,
        aiperf_ms=3010.0,
        ours_ms=2900.0,
        n_aiperf=1,
        n_ours=1,
        plan_aiperf_ms=3000.0,
        plan_ours_ms=3000.0,
    )
    assert ao.classify(capped, False) == "idle-cap"  # ours 100 ms short of its plan
    assert ao.classify(g, True) == "plan"
    join = ao.GapDiff(
        M2, aiperf_ms=20.0, ours_ms=1.0, n_aiperf=1, n_ours=1, plan_aiperf_ms=0.0, plan_ours_ms=0.0
    )  # both at the subagent's end
    assert ao.classify(join, False) == "lag"


def test_compare_rules_ignores_waits_implied_by_the_others() -> None:
    # AIPerf also makes S1 wait for M0, which S0 (S1's other wait) already waits for
    a = {
        M0: ao.Rule(frozenset(), 0.0, "first"),
        S0: ao.Rule(frozenset({M0}), 0.0, "child-first"),
        S1: ao.Rule(frozenset({S0, M0}), 5.0, "next"),
        M2: ao.Rule(frozenset({S1, M0}), 7.0, "next"),
    }
    o = {
        M0: a[M0],
        S0: a[S0],
        S1: ao.Rule(frozenset({S0}), 5.0, "next"),
        M2: ao.Rule(frozenset({M0}), 7.0, "next"),
    }
    assert ao.direct_waits(S1, a) == frozenset({S0})
    assert ao.direct_waits(M2, a) == frozenset({S1})
    (d,) = ao.compare_rules(a, o)
    assert d.key == M2 and d.what == "waits: AIPerf also for ['tr[1].1'], ours also for ['tr[0]']"
    o[S0] = ao.Rule(frozenset({M0}), 20000.0, "next")
    d0, _ = ao.compare_rules(a, o)
    assert d0.key == S0 and d0.what == (
        "kind: AIPerf child-first, ours next; delay: AIPerf 0 ms, ours 20,000 ms (-20,000)"
    )


def test_warmups_are_timed_from_each_runs_first_warm_up() -> None:
    ms = 1_000_000
    sent = [
        _sent("x", M0, 100 * ms, 110 * ms, warmup=True),
        _sent("x", S0, 125 * ms, 130 * ms, warmup=True),
        _sent("x", S1, 140 * ms, 150 * ms),
        _sent("x", M2, 160 * ms, 170 * ms),
        _sent("x", M0, 5 * ms, 6 * ms, run=1),
    ]  # run 1 had no warm-up
    w = ao.warmups(sent)
    assert list(w) == [0]
    assert w[0].sends == {M0: 0.0, S0: 25.0} and w[0].measured_start_ms == 40.0
