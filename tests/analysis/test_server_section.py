"""The report's server section puts the server's /metrics deltas beside the client's numbers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
from rich.console import Console

from agent_replay.analysis.fixtures import synthetic_results, write_results
from agent_replay.analysis.render import render_table, report_dict
from agent_replay.analysis.report import build_report
from agent_replay.results_schema import SERVER_METRICS_SCHEMA


def _samples(
    t_ns: int,
    gen: float,
    hits: float,
    queries: float,
    ttft_sum: float,
    ttft_le: dict[str, float],
    count: float,
) -> list[dict[str, object]]:
    lab = json.dumps({"engine": "0", "model_name": "m"}, sort_keys=True)
    rows: list[dict[str, object]] = [
        {"name": "vllm:generation_tokens_total", "value": gen},
        {"name": "vllm:prefix_cache_hits_total", "value": hits},
        {"name": "vllm:prefix_cache_queries_total", "value": queries},
        {"name": "vllm:num_requests_running", "value": 2.0},
        {"name": "vllm:time_to_first_token_seconds_sum", "value": ttft_sum},
        {"name": "vllm:time_to_first_token_seconds_count", "value": count},
    ]
    for le, v in ttft_le.items():
        rows.append(
            {
                "name": "vllm:time_to_first_token_seconds_bucket",
                "value": v,
                "labels": json.dumps({"engine": "0", "le": le, "model_name": "m"}, sort_keys=True),
            }
        )
    for r in rows:
        r.setdefault("labels", lab)
        r["t_ns"] = t_ns
    return rows


def test_server_deltas_are_shown_beside_the_client(tmp_path: Path) -> None:
    results = tmp_path / "r"
    # Two scrapes: 1,000 generation tokens, 600 of 1,000 prompt tokens hit, 10 requests
    # whose TTFT sum grew by 0.5 s (mean 50 ms), all in the (0.025, 0.05] bucket but one.
    before = _samples(0, 100.0, 0.0, 0.0, 0.0, {"0.025": 0.0, "0.05": 0.0, "+Inf": 0.0}, 0.0)
    after = _samples(
        10**9, 1100.0, 600.0, 1000.0, 0.5, {"0.025": 0.0, "0.05": 9.0, "+Inf": 10.0}, 10.0
    )
    write_results(
        results,
        synthetic_results(200, seed=1),
        server_metrics=pa.Table.from_pylist(before + after, schema=SERVER_METRICS_SCHEMA),
    )
    report = build_report(str(results))
    d = report_dict(report)
    assert d["server"]["generation_tokens"] == 1000.0
    assert d["server"]["prefix_cache"]["hit_rate"] == 0.6
    buf = io.StringIO()
    Console(file=buf, width=160).print(render_table(report))
    text = buf.getvalue()
    assert "Server side" in text
    assert "60.0%" in text  # server prefix-cache hit rate
    assert "50.000" in text  # server TTFT mean in ms
    assert "P50 in (25, 50]" in text  # the bucket that holds the server's median TTFT
    assert "1,000 /" in text  # generation tokens, server beside client
