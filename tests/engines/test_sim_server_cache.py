"""What a real server's prefix cache held when a recorded run began: the runs before it on
the same server (by vLLM's own prefix-cache counter), and the hits vLLM gives then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim.predict import prefix_hits, served_hit
from agent_replay.engines.sim.server_cache import QUERIES, earlier_runs, served_prompts
from agent_replay.results_schema import REQUEST_SCHEMA, SERVER_METRICS_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
SOLO = ROOT / "benchmarks/results/gpu/2026-12-06-h100-agentx-solo/results/runs"


def _row(session: str, index: int, prompt: int, sent: int, **kw: Any) -> dict[str, Any]:
    row = dict.fromkeys(REQUEST_SCHEMA.names)
    row.update(
        session_id=session,
        clone=1,
        request_index=index,
        parent_index=-1,
        worker=0,
        request_id=f"{session}-{index}",
        api="completions",
        warmup=False,
        intended_ns=sent,
        expected_input_tokens=prompt,
        expected_output_tokens=1,
        prompt_tokens=prompt,
        sent_ns=sent,
        first_token_ns=sent + 10,
        status="ok",
    )
    row.update(kw)
    return row


def test_served_hit_by_hand() -> None:
    served = {("s", 1, 3): 1000, ("s", 1, 2): 900, ("t", 1, 0): 5000}
    # the same request again: all but its last token, in blocks of 16 (999 -> 992)
    assert served_hit(served, ("s", 1, 3), 1000) == 992
    # a later turn: the longest served prompt of its session and play it can extend
    assert served_hit(served, ("s", 1, 4), 1200) == 992  # 1000 -> 992
    assert served_hit(served, ("s", 1, 4), 950) == 896  # 1000 is longer: 900 -> 896
    # another play of the session has other prompts; nothing served: nothing cached
    assert served_hit(served, ("s", 2, 4), 1200) == 0
    assert served_hit({}, ("s", 1, 4), 1200) == 0


def test_prefix_hits_on_a_known_server_cache_by_hand() -> None:
    rows = [
        _row("s", 4, 1200, sent=20),  # sent second: s#3 (1000) is computed by then
        _row("s", 3, 1000, sent=10, implied_cached_tokens=990),  # served before: 992
        _row("u", 0, 700, sent=30, cached_tokens=512),  # the server's own count wins
        _row("u", 1, 800, sent=40, first_token_ns=None),  # failed: never computed
        _row("u", 2, 900, sent=50),  # u#0 is the longest computed: 700 -> 688
    ]
    served = {("s", 1, 3): 1000}
    assert prefix_hits(rows, None, served) == [992, 992, 512, 688, 688]
    # without the server's record: the recorded implied hit and the previous prompt
    assert prefix_hits(rows)[:2] == [992, 990]


def _run(
    tmp: Path, point: str, span: tuple[float, float], prompts: list[int], salt: int = 42
) -> Path:
    d = tmp / "prof" / point / "r1"
    (d / "requests").mkdir(parents=True)
    rows = [_row("s", i, p, sent=i * 100) for i, p in enumerate(prompts)]
    pq.write_table(
        pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA), d / "requests" / "part-0.parquet"
    )
    (d / "run.json").write_text(json.dumps({"run_id": point, "salt": salt}))
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"t_ns": t, "name": QUERIES, "labels": "{}", "value": v}
                for t, v in zip((0, 10), span, strict=True)
            ],
            schema=SERVER_METRICS_SCHEMA,
        ),
        d / "server_metrics.parquet",
    )
    return d


def test_earlier_runs_follow_the_servers_counter(tmp_path: Path) -> None:
    # c1 began on a server that had looked up 8 tokens (a health check: less than any of its
    # prompts), c2 where c1 ended, c3 where c2 ended but with another prompt salt
    c1 = _run(tmp_path, "c1", (8, 2108), [1000, 1100])
    c2 = _run(tmp_path, "c2", (2108, 3308), [1200])
    c3 = _run(tmp_path, "c3", (3308, 4000), [1000], salt=7)
    orphan = _run(tmp_path, "c4", (9000, 9500), [1000])  # its predecessor is not here
    assert earlier_runs(c1) == []
    assert earlier_runs(c2) == [c1]
    assert earlier_runs(c3) == [c1, c2]
    assert earlier_runs(orphan) is None and served_prompts(orphan) is None
    assert served_prompts(c1) == {}
    assert served_prompts(c3) == {}  # the earlier runs' prompts had another salt
    assert served_prompts(c2) == {("s", 1, 0): 1000, ("s", 1, 1): 1100}


def test_the_rule_gives_the_hits_vllm_counted_on_the_solo_ladder() -> None:
    """vLLM's own ``prefix_cache_hits`` counter over each run against the hits the rule
    gives its rows: within 0.1% of the prompt tokens looked up, on all 15 runs."""
    if not SOLO.is_dir():
        pytest.skip("the committed GPU runs are absent")
    for folder in sorted(SOLO.glob("*/c*/r1")):
        t = pq.read_table(folder / "server_metrics.parquet").to_pydict()
        rows = pq.read_table(folder / "requests").to_pylist()
        queries = _delta(t, QUERIES)
        assert queries == sum(r["prompt_tokens"] for r in rows)
        got = sum(prefix_hits(rows, None, served_prompts(folder)))
        assert abs(got - _delta(t, "vllm:prefix_cache_hits_total")) <= 0.001 * queries, folder


def _delta(t: dict[str, list[Any]], name: str) -> float:
    """A counter's increase over a run's /metrics series."""
    pts = sorted(
        (ts, v) for ts, n, v in zip(t["t_ns"], t["name"], t["value"], strict=True) if n == name
    )
    return float(pts[-1][1] - pts[0][1])
