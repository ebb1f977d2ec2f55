"""The AIPerf-vs-ours AgentX bench's own logic (benchmarks/bench_agentx_aiperf.py): its North
Star is the report's on the same rows, each run's host load is measured over a real
subprocess, and a verdict is refused under host contention (the rule and the line
``compare`` uses) or when the sides measured different requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent_replay.analysis.definitions import speeds
from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.report import build_report
from agent_replay.analysis.selfcheck import OTHERS_BUSY
from benchmarks import agentx_oracle as ao
from benchmarks import bench_agentx_aiperf as bench
from tests.analysis.test_north_star import NORTH_STAR, ROWS, _rows


def test_the_bench_north_star_is_the_reports_on_the_same_requests(tmp_path: Path) -> None:
    """The bench reads our rows from the send (``sent_ns``): its North Star is the one
    ``analysis.definitions`` gives the report, connect time inside (1e9 / 123 here)."""
    rep = build_report(write_results(tmp_path / "r", rows_to_table(_rows()), {}))
    sent = [
        ao.Sent("ours", 0, ("t", i, None), "main", "p", False, s0, f, e, 10, sum(ck), False)
        for i, (s0, _c, f, e, _cn, ck) in enumerate(ROWS)
    ]
    sent.append(ao.Sent("ours", 0, ("t", 9, None), "main", "p", True, 0, 1, 5, 10, 4, False))
    ns = ao.north_star(sent)
    assert ns["n"] == 4
    assert ns["tok_s_user"] == pytest.approx(NORTH_STAR) == speeds(rep.stats.latency)["north_star"]


def _res(a: list[float], o: list[float], keys: tuple[int, int, int] = (10, 10, 10)) -> dict:
    return {
        "coverage": dict(zip(("aiperf_keys", "ours_keys", "both"), keys, strict=True)),
        "scores": {
            side: {"spread": {"interactivity": ao.spread(v), "north_star": ao.spread(v)}}
            for side, v in (("aiperf", a), ("ours", o))
        },
    }


def _run(side: str, rep: int, busy: float, ours: float, cpus: int = 2) -> dict:
    return {
        "side": side,
        "repeat": rep,
        "machine": {"cpus": cpus, "busy_cores": busy, "steal": 0.0, "ours_cores": ours},
    }


def test_verdicts_refuse_under_contention_and_on_different_requests() -> None:
    quiet = [_run("aiperf", 0, 1.2, 1.1), _run("ours", 0, 1.0, 0.9)]
    # others 0.1 of 2 CPUs: below OTHERS_BUSY x 2 = 1.0; ranges 99-101 and 100-102 overlap
    v = bench.verdicts(_res([99.0, 101.0], [100.0, 102.0]), quiet)
    assert v[0].startswith(
        "AgentX interactivity, 1 / P90 of (E2EL - TTFT) / (OSL - 1): equal "
        "within the repeats' spread (AIPerf 99.0-101.0, ours 100.0-102.0"
    )
    # apart: ours 110-112 against 99-101 -> mean 111 vs 100: 11.0% higher
    v = bench.verdicts(_res([99.0, 101.0], [110.0, 112.0]), quiet)
    assert "North Star, 1 / P90 of E2EL / OSL: ours higher by 11.0% beyond" in v[1]
    busy = [*quiet, _run("ours", 1, 0.5 + 2 * OTHERS_BUSY, 0.5)]  # others exactly at the bound
    assert bench.contended(busy) == ["ours-1"]
    assert bench.verdicts(_res([99.0], [100.0]), busy) == [
        "no verdict: host contention in run ours-1: rerun on a quiet host or when nothing "
        "else runs on it"
    ]
    assert bench.verdicts(_res([99.0], [100.0], (10, 9, 9)), quiet) == [
        "no verdict: the sides measured different requests (AIPerf 10, ours 9, both 9)"
    ]


def test_each_run_measures_its_host_load_over_a_real_subprocess(tmp_path: Path) -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    info = bench._timed([sys.executable, "-c", burn], tmp_path / "x.log", {}, 10.0)
    m = info["machine"]
    assert info["rc"] == 0 and m["cpus"] >= 1
    # the child burned 0.3 s of CPU (plus its start-up) within the wall time
    assert 0.3 <= m["side_cores"] * info["wall_s"] <= info["wall_s"] + 0.1
    assert m["engine_cores"] == 0.0 and m["ours_cores"] == pytest.approx(m["side_cores"], rel=0.01)
    assert isinstance(m["host_busy"], bool)


def test_a_side_counts_processes_its_tree_left_unreaped(tmp_path: Path) -> None:
    """AIPerf's services need not be reaped by the process the bench started: a child that
    burns 0.4 s of CPU and that its parent leaves behind still counts for the side."""
    child = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    # the parent waits for the child's exit without reaping it (WNOWAIT), lets a poll see the
    # finished child, and exits: the child is never reaped by the process the bench started
    parent = (
        "import os, sys, time\n"
        f"pid = os.posix_spawn(sys.executable, [sys.executable, '-c', {child!r}], os.environ)\n"
        "os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)\ntime.sleep(0.6)\n"
    )
    info = bench._timed([sys.executable, "-c", parent], tmp_path / "x.log", {}, 10.0)
    assert info["rc"] == 0 and info["machine"]["side_cores"] * info["wall_s"] >= 0.3


def test_picked_traces_follow_the_seed_and_count_calls_without_api_time(tmp_path: Path) -> None:
    for i in range(10):
        reqs = [
            {"t": 0.0, "api_time": 1.0},
            {"t": 2.0},
            {"type": "subagent", "requests": [{"t": 0.0}, {"t": 1.0, "api_time": 0.5}]},
        ]
        (tmp_path / f"trace_{i:04d}.json").write_text(json.dumps({"requests": reqs[: 1 + i % 3]}))
    a, b = bench.pick_traces(tmp_path, 6, 7), bench.pick_traces(tmp_path, 6, 7)
    assert a == b and len(set(a)) == 6 and a == sorted(a)
    assert bench.pick_traces(tmp_path, 6, 8) != a
    assert [bench.calls_without_api_time(tmp_path / f"trace_{i:04d}.json") for i in range(3)] == [
        (0, 1),
        (1, 2),
        (2, 4),
    ]
    with pytest.raises(SystemExit):
        bench.pick_traces(tmp_path, 11, 7)
