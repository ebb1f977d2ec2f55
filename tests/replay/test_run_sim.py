"""End to end against the simulated engine: exact tokens, prefix-cache fidelity, causality,
chat/messages prompts sized with /tokenize, several workers."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.engines.sim import SimProcess
from agent_replay.replay.config import RunConfig
from agent_replay.replay.provenance import code_version
from agent_replay.replay.run import run
from tests.replay.helpers import MS, chain_rows, write_rows


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess("fast") as s:
        yield s


def rows_of(out: Path) -> dict[str, list]:
    return pq.read_table(out / "requests").to_pydict()


def test_completions_exact_tokens_cache_and_causality(sim: SimProcess, tmp_path: Path) -> None:
    # 12 sessions x 5 chained requests, prompts growing by 40 tokens, 16-token blocks
    rows = chain_rows(12, 5, gap_ns=40 * MS, think_ns=30 * MS, input_tokens=200, output_tokens=12)
    trace = write_rows(tmp_path / "t.parquet", rows)
    out = tmp_path / "res"
    s = run(
        RunConfig(
            trace=str(trace),
            target=sim.url,
            output=str(out),
            salt=0,
            speedup=2,
            scrape_interval_s=0,
        ),
        progress=None,
    )
    assert (s.ok, s.failed, s.mismatches, s.total) == (60, 0, 0, 60)
    d = rows_of(out)
    assert d["prompt_tokens"] == d["expected_input_tokens"]
    assert d["completion_tokens"] == d["expected_output_tokens"]
    assert [sum(k) for k in d["chunk_tokens"]] == d["expected_output_tokens"]
    assert set(d["status"]) == {"ok"} and set(d["error_kind"]) == {None}
    # the server's prefix-cache hit rate matches what the hash ids imply (within 1 point)
    served = sum(d["cached_tokens"]) / sum(d["prompt_tokens"])
    implied = sum(d["implied_cached_tokens"]) / sum(d["expected_input_tokens"])
    assert implied > 0.5
    assert abs(served - implied) <= 0.01, (served, implied)
    # causality: no request left before its parent completed plus its think time
    by = {
        (sid, ri): i
        for i, (sid, ri) in enumerate(zip(d["session_id"], d["request_index"], strict=False))
    }
    for i, pi in enumerate(d["parent_index"]):
        if pi < 0:
            continue
        p = by[(d["session_id"][i], pi)]
        assert d["parent_end_ns"][i] == d["end_ns"][p]
        assert d["think_ns"][i] == 15 * MS
        assert d["sent_ns"][i] >= d["end_ns"][p] + d["think_ns"][i]
        assert d["intended_ns"][i] == d["end_ns"][p] + d["think_ns"][i]
    # headers reached the server's request ids
    assert all(
        r.startswith(s.workers and d["request_id"][0].split("-")[0]) for r in d["request_id"]
    )
    meta = (out / "run.json").read_text()
    assert '"status": "ok"' in meta and '"salt": 0' in meta
    assert json.loads(meta)["environment"]["commit"] == code_version()  # the code that ran
    # the host's CPU over the run, as the self-check saw it
    m = json.loads(meta)["machine"]
    assert m["cpus"] == os.cpu_count() and 0 < m["busy_cores"] <= m["cpus"] + 0.1
    assert m["ours_cores"] > 0 and 0 <= m["steal"] <= 1


def test_second_run_with_new_salt_misses_cache(sim: SimProcess, tmp_path: Path) -> None:
    rows = chain_rows(3, 1, input_tokens=160, output_tokens=2)
    trace = write_rows(tmp_path / "t.parquet", rows)
    cfg = RunConfig(trace=str(trace), target=sim.url, salt=12345, scrape_interval_s=0)
    run(RunConfig(**{**cfg.__dict__, "output": str(tmp_path / "a")}), progress=None)
    run(RunConfig(**{**cfg.__dict__, "output": str(tmp_path / "b")}), progress=None)
    run(RunConfig(**{**cfg.__dict__, "output": str(tmp_path / "c"), "salt": 54321}), progress=None)
    assert sum(rows_of(tmp_path / "b")["cached_tokens"]) == 3 * 144  # same salt: hits
    assert sum(rows_of(tmp_path / "c")["cached_tokens"]) == 0  # new salt: cold


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_text_prompts_have_exact_length(sim: SimProcess, tmp_path: Path, api: str) -> None:
    rows = chain_rows(2, 2, input_tokens=300, output_tokens=5)
    trace = write_rows(tmp_path / "t.parquet", rows)
    out = tmp_path / "res"
    s = run(
        RunConfig(
            trace=str(trace),
            target=sim.url,
            output=str(out),
            api=api,
            speedup=4,
            scrape_interval_s=0,
        ),
        progress=None,
    )
    d = rows_of(out)
    assert s.ok == 4 and s.failed == 0, d["error"]
    assert d["prompt_tokens"] == d["expected_input_tokens"]
    assert [sum(k) for k in d["chunk_tokens"]] == d["expected_output_tokens"]
    assert s.mismatches == 0, d["error"]


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_text_prompts_keep_the_last_blocks_the_trace_shares(
    sim: SimProcess, tmp_path: Path, api: str
) -> None:
    """Trace blocks of 64 tokens, the engine's of 16, its template 3 tokens before the
    content and 5 after. a/0 (258 tokens) has 4 whole blocks and 2 tokens of a fifth; the
    template's last tokens end it inside block 3, which a/1 shares whole. b/0 (296 tokens)
    ends with a partial block (40 tokens) that b/1 has whole. The engine serves b/1 the 288
    tokens the trace implies (4 blocks and the partial block's 2 whole server blocks), and
    a/1 all of block 3's server blocks but the one the template starts in (240 of 256)."""
    rows = [
        {
            "session_id": "a",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 258,
            "output_tokens": 2,
            "hash_ids": [1, 2, 3, 4, 5],
        },
        {
            "session_id": "a",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 100 * MS,
            "think_ns": MS,
            "input_tokens": 400,
            "output_tokens": 2,
            "hash_ids": [1, 2, 3, 4, 6, 7, 8],
        },
        {
            "session_id": "b",
            "request_index": 0,
            "parent_index": -1,
            "arrival_ns": 0,
            "input_tokens": 296,
            "output_tokens": 2,
            "hash_ids": [11, 12, 13, 14, 15],
        },
        {
            "session_id": "b",
            "request_index": 1,
            "parent_index": 0,
            "arrival_ns": 100 * MS,
            "think_ns": MS,
            "input_tokens": 400,
            "output_tokens": 2,
            "hash_ids": [11, 12, 13, 14, 15, 16, 17],
        },
    ]
    trace = write_rows(tmp_path / "t.parquet", rows, block_size=64)
    out = tmp_path / "res"
    salt = 7 if api == "chat" else 8  # the engine is shared: each run's blocks its own
    s = run(
        RunConfig(
            trace=str(trace),
            target=sim.url,
            output=str(out),
            api=api,
            salt=salt,
            scrape_interval_s=0,
        ),
        progress=None,
    )
    d = rows_of(out)
    assert s.ok == 4 and s.mismatches == 0, d["error"]
    got = {
        (sid, ri): (c, i)
        for sid, ri, c, i in zip(
            d["session_id"],
            d["request_index"],
            d["cached_tokens"],
            d["implied_cached_tokens"],
            strict=True,
        )
    }
    assert got[("b", 1)] == (288, 288)
    assert got[("a", 1)] == (240, 256)


@pytest.mark.slow
def test_two_workers_share_one_t0(sim: SimProcess, tmp_path: Path) -> None:
    rows = chain_rows(16, 2, gap_ns=20 * MS, output_tokens=4)
    trace = write_rows(tmp_path / "t.parquet", rows)
    out = tmp_path / "res"
    s = run(
        RunConfig(
            trace=str(trace), target=sim.url, output=str(out), workers=2, scrape_interval_s=0
        ),
        progress=None,
    )
    d = rows_of(out)
    assert s.ok == 32 and sorted(set(d["worker"])) == [0, 1]
    roots = {
        sid: t
        for sid, ri, t in zip(d["session_id"], d["request_index"], d["intended_ns"], strict=False)
        if ri == 0
    }
    assert roots == {f"s{i}": i * 20 * MS for i in range(16)}  # offsets from the one t0
    assert len(list((out / "requests").glob("part-00[01]-*.parquet"))) >= 2


def test_dashboard_is_pointed_at_the_servers_metrics(
    sim: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_replay.analysis.dashboard as dashboard
    from agent_replay.analysis.gauges import scrape_gauges
    from agent_replay.analysis.live import LiveStats, PartsFeed

    seen: list[dict[str, float]] = []
    folders: list[str | None] = []
    updates: list[bytes] = []

    class Recording:
        def __init__(
            self,
            total: int,
            title: str,
            server_gauges_url: str | None,
            results_dir: str | None = None,
            shared_gauges: object = None,
            gpu_gauges: object = None,
            planned_ns: object = None,
        ) -> None:
            assert server_gauges_url is not None and shared_gauges is None  # no scraper in this run
            seen.append(scrape_gauges(server_gauges_url))
            folders.append(results_dir)

        def start(self) -> None: ...
        def update(self, encoded: bytes) -> None:
            updates.append(encoded)

        def stop(self) -> None: ...

    monkeypatch.setattr(dashboard, "DashboardProcess", Recording)
    trace = write_rows(
        tmp_path / "t.parquet",
        chain_rows(2, 3, gap_ns=MS, think_ns=MS, input_tokens=32, output_tokens=4),
    )
    run(
        RunConfig(
            trace=str(trace), target=sim.url, output=str(tmp_path / "res"), scrape_interval_s=0
        ),
        progress=lambda line: None,
    )
    assert seen and "vllm:num_requests_running" in seen[0]
    # The dashboard reads the request statistics from the part files; the run sends it the
    # progress (final counts included) and nothing about requests.
    assert folders == [str(tmp_path / "res")]
    last = LiveStats.decode(updates[-1])
    assert (last.done, last.total, last.ok, last.hists["ttft"].count) == (6, 6, 0, 0)
    feed = PartsFeed(tmp_path / "res")
    feed.poll()
    feed.stats.flush()
    assert (feed.stats.ok, feed.stats.output_tokens) == (6, 2 * (4 + 5 + 6))


def test_dashboard_shows_the_scrapers_gauges(
    sim: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the run's scraper on, the server is scraped once per interval, by the scraper;
    # the dashboard gets the gauges of each scrape through shared memory.
    import agent_replay.analysis.dashboard as dashboard
    from agent_replay.analysis.gauges import GAUGES, SharedGauges

    shared: list[SharedGauges] = []
    at_stop: list[tuple[int, dict[str, float]]] = []
    started: list[int] = []

    class Recording:
        def __init__(
            self,
            total: int,
            title: str,
            server_gauges_url: str | None,
            results_dir: str | None = None,
            shared_gauges: SharedGauges | None = None,
            gpu_gauges: object = None,
            planned_ns: object = None,
        ) -> None:
            assert shared_gauges is not None
            shared.append(shared_gauges)

        def start(self) -> None:  # a renderer that takes 0.3 s to start up
            time.sleep(0.3)
            started.append(time.monotonic_ns())

        def update(self, encoded: bytes) -> None: ...
        def stop(self) -> None:  # the last frame is drawn now
            at_stop.append(shared[0].read())

    monkeypatch.setattr(dashboard, "DashboardProcess", Recording)
    trace = write_rows(
        tmp_path / "t.parquet",
        chain_rows(2, 2, gap_ns=MS, think_ns=MS, input_tokens=32, output_tokens=4),
    )
    run(
        RunConfig(
            trace=str(trace), target=sim.url, output=str(tmp_path / "res"), scrape_interval_s=0.1
        ),
        progress=lambda line: None,
    )
    writes, gauges = shared[0].read()
    scrapes = pq.read_table(tmp_path / "res" / "server_metrics.parquet", columns=["t_ns"])
    assert writes == len(set(scrapes.column("t_ns").to_pylist())) >= 2  # one write per scrape
    assert gauges["vllm:num_requests_running"] == 0.0  # the final scrape, after the run
    assert at_stop == [(writes, gauges)]  # ... taken before the dashboard's last frame
    # The run's t0 (chosen 0.2 s ahead) was chosen once the dashboard had started up.
    t0 = read_run_record(tmp_path / "res").clock.t0_monotonic_ns or 0
    assert len(started) == 1 and started[0] < t0 - 150_000_000
    assert set(gauges) <= set(GAUGES)
