"""``--timing agentx`` against the simulated engine with 8 session trees: recycling,
cache-bust per play, warm-up excluded from statistics, validity in run.json; and the idle
gap skipping under the fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agent_replay.engines.sim
from agent_replay.analysis.runstats import accumulate
from agent_replay.engines.sim import SimProcess
from agent_replay.replay.agentx import IDLE_SKIP_NS, AgentXDriver
from agent_replay.replay.clock import FakeClock
from agent_replay.replay.config import RunConfig
from agent_replay.replay.outcome import RequestRecord
from agent_replay.replay.plan import PlanOptions, build_plan
from agent_replay.replay.run import run
from agent_replay.traces.io import write_trace
from agent_replay.traces.schema import TraceMeta
from tests.replay.helpers import MS, FakeTransport

pytestmark = pytest.mark.slow

SPEC = [  # (agent, depends_on, prefix parent) of one tree
    ("main", [], -1), ("x", [0], -1), ("y", [0], -1), ("x", [1], 1), ("y", [2], 2),
    ("main", [0, 3, 4], 0), ("main", [5], 5), ("main", [6], 6)]


def tree_table(n_sessions: int = 8, think_ns: int = 30 * MS) -> pa.Table:
    cols: dict[str, list[Any]] = {k: [] for k in (
        "session_id", "request_index", "parent_index", "arrival_ns", "think_ns", "input_tokens",
        "output_tokens", "hash_ids", "agent_id", "depends_on")}
    for s in range(n_sessions):
        blocks: dict[int, list[int]] = {}
        for i, (agent, deps, parent) in enumerate(SPEC):
            base = blocks[parent] if parent >= 0 else [s * 10_000 + (0 if agent == "main" else
                                                                    (3000 if agent == "x" else 6000))]
            ids = base + [s * 10_000 + 100 * (i + 1) + k for k in range(4)]
            blocks[i] = ids
            cols["session_id"].append(f"t{s}")
            cols["request_index"].append(i)
            cols["parent_index"].append(parent)
            cols["arrival_ns"].append(s * 7 * MS + i * 100 * MS)
            cols["think_ns"].append(think_ns if deps else None)
            cols["input_tokens"].append(16 * len(ids))
            cols["output_tokens"].append(8)
            cols["hash_ids"].append(ids)
            cols["agent_id"].append(agent)
            cols["depends_on"].append(deps)
    return pa.table(cols, schema=pa.schema([
        ("session_id", pa.string()), ("request_index", pa.int32()), ("parent_index", pa.int32()),
        ("arrival_ns", pa.int64()), ("think_ns", pa.int64()), ("input_tokens", pa.int32()),
        ("output_tokens", pa.int32()), ("hash_ids", pa.list_(pa.int64())),
        ("agent_id", pa.string()), ("depends_on", pa.list_(pa.int32()))]))


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("agentx")
    trace = write_trace(tree_table(), tmp / "trees.parquet", TraceMeta(block_size=16))
    profile = json.loads((Path(agent_replay.engines.sim.__file__).parent / "profiles" / "fast.json").read_text())
    profile.update(name="fast-short", max_model_len=150)  # the longest prompts (> 150) overflow
    (tmp / "short.json").write_text(json.dumps(profile))
    out: dict[str, Path] = {}
    for name, prof in (("ok", "fast"), ("overflow", str(tmp / "short.json"))):
        with SimProcess(prof) as sim:
            out[name] = tmp / name
            run(RunConfig(trace=str(trace), target=sim.url, output=str(out[name]), salt=7,
                          timing="agentx", concurrency=8, duration_s=4.0 if name == "ok" else 1.5,
                          scrape_interval_s=0, progress=False), progress=None)
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
                sum(x["cached_tokens"] for x in xs) / sum(x["prompt_tokens"] for x in xs))
    repeated = {s: v for s, v in full.items() if len(v) >= 2}
    assert repeated, full
    for rates in repeated.values():
        assert max(rates) - min(rates) < 1e-9, rates
        assert 0 < rates[0] < 1


def test_first_plays_start_mid_tree_after_an_excluded_warm_up(sim_runs: dict[str, Path]) -> None:
    r = rows(sim_runs["ok"])
    warm = [x for x in r if x["warmup"]]
    assert 1 <= len(warm) <= 8 and all(x["expected_output_tokens"] == 1 for x in warm)
    for w in warm:
        play = [x for x in r if (x["session_id"], x["clone"]) == (w["session_id"], w["clone"]) and not x["warmup"]]
        first = min(play, key=lambda x: x["sent_ns"])
        assert first["request_index"] >= 2  # 25-75% of 8 requests: start at 2..6
        assert first["sent_ns"] >= w["end_ns"]
        assert SPEC[first["request_index"]][2] == w["request_index"]  # warm-up = prefix parent
    stats = accumulate(pq.read_table(sim_runs["ok"] / "requests").to_batches()).finish()
    assert stats.requests["counted"] == len(r) - len(warm)
    meta = json.loads((sim_runs["ok"] / "run.json").read_text())
    assert meta["agentx"]["responses"] == len(r) - len(warm)
    assert meta["agentx"]["valid"] is True and meta["valid"] is True


def test_overflow_above_one_percent_marks_the_run_invalid(
        sim_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    r = [x for x in rows(sim_runs["overflow"]) if not x["warmup"]]
    over = [x for x in r if x["http_status"] == 400]
    assert len(over) / len(r) > 0.01
    meta = json.loads((sim_runs["overflow"] / "run.json").read_text())
    assert meta["valid"] is False and meta["agentx"]["context_overflows"] == len(over)
    assert meta["warnings"][0].startswith("INVALID run (AgentX rule)")
    from agent_replay.replay.cli import main

    assert main(["report", str(sim_runs["overflow"])]) == 0
    assert "INVALID run (AgentX rule)" in capsys.readouterr().out


def test_idle_gaps_over_10s_are_skipped() -> None:
    t = tree_table(1, think_ns=60_000 * MS)  # every think time a minute: nothing in flight
    plan = build_plan(t, 16, PlanOptions())
    clock = FakeClock(start_ns=0)
    recs: list[RequestRecord] = []
    d = AgentXDriver(plan, FakeTransport(clock, 5 * MS), clock, t0_ns=0, on_record=recs.append,
                     lanes=1, duration_ns=2_000 * MS)
    clock.run(d.run())
    real = [x for x in recs if not x.warmup]
    assert len(real) >= 2
    for x in real:
        if x.parent_end_ns is not None:
            # a 60 s think with nothing in flight: skipped, so the request goes at once
            assert x.intended_ns == x.parent_end_ns and x.think_ns == 0
    assert d.idle_skipped_ns >= IDLE_SKIP_NS
