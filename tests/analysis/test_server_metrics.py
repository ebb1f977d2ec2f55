from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_replay.analysis.server_metrics import bucket_quantile, summarize
from agent_replay.engines.metrics_scrape import parse_metrics, rows_to_table

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_cpu_metrics_llama_ngram.txt"


def _zeroed(text: str) -> str:
    """The same series with every value 0: a baseline scrape of a fresh server."""
    return re.sub(r"^([^#\s][^ ]*(?:\{[^}]*\})?) \S+$", r"\1 0.0", text, flags=re.M)


def test_real_vllm_capture_against_zero_baseline() -> None:
    text = FIXTURE.read_text()
    table = rows_to_table(parse_metrics(_zeroed(text), 0) + parse_metrics(text, 2_000_000_000))
    s = summarize(table)
    assert s["scrapes"] == 2 and s["duration_s"] == 2.0 and s["engines"] == 1
    assert s["prefix_cache"] == {"queries": 1440.0, "hits": 768.0, "hit_rate": 768 / 1440}
    assert s["prompt_tokens"] == 1440.0 and s["generation_tokens"] == 140.0
    assert s["preemptions"] == 0.0
    assert s["requests_finished"]["length"] == 6.0 and s["requests_finished"]["stop"] == 0.0
    spec = s["spec_decode"]
    assert spec["drafts"] == 34 and spec["draft_tokens"] == 90 and spec["accepted_tokens"] == 84
    assert spec["acceptance_length"] == pytest.approx(1 + 84 / 34)
    assert spec["acceptance_rate"] == pytest.approx(84 / 90)
    assert spec["per_position_acceptance"] == pytest.approx([32 / 34, 26 / 34, 26 / 34])
    ttft = s["histograms"]["ttft"]
    assert ttft["count"] == 6
    # buckets: <=0.01: 1, <=0.02: 4, <=0.04: 5, ..., <=2.5: 6
    assert ttft["p50"] == pytest.approx({"lo": 0.01, "hi": 0.02, "est": 0.01 + 0.01 * 2 / 3})
    assert ttft["p90"] == pytest.approx({"lo": 1.0, "hi": 2.5, "est": 1.0 + 1.5 * 0.4})
    tpot = s["histograms"]["tpot"]
    assert tpot["count"] == 6 and tpot["p99"]["lo"] == 0.0 and tpot["p99"]["hi"] == 0.01
    assert s["kv_cache_usage"] == {"mean": 0.0, "max": 0.0, "samples": 2}


DP_T0 = """
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_running{engine="1",model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.3
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.05
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0
"""


def _next(text: str, changes: dict[str, float]) -> str:
    out = []
    for line in text.splitlines():
        for key, value in changes.items():
            if line.startswith(key + " "):
                line = f"{key} {value}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_data_parallel_engines_are_summed() -> None:
    t1 = _next(
        DP_T0,
        {
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"}': 300,  # +200
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"}': 250,  # +200
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"}': 110,  # +100
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"}': 200,  # +200
            'vllm:num_requests_running{engine="0",model_name="m"}': 5,
            'vllm:num_requests_running{engine="1",model_name="m"}': 4,
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"}': 0.5,
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"}': 0.9,
            # engine 0: +3 requests at 0.5 s; engine 1: +1 at 0.05 s and +1 at 5 s
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"}': 4,
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"}': 4,
            'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"}': 4,
            'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"}': 1.55,
            'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"}': 1,
            'vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="m"}': 1,
            'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"}': 2,
            'vllm:time_to_first_token_seconds_count{engine="1",model_name="m"}': 2,
            'vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"}': 5.05,
        },
    )
    s = summarize(rows_to_table(parse_metrics(DP_T0, 0) + parse_metrics(t1, 10**9)))
    assert s["engines"] == 2
    assert s["prefix_cache"] == {"queries": 400.0, "hits": 300.0, "hit_rate": 0.75}
    assert s["running"] == {"mean": (3 + 9) / 2, "max": 9.0, "samples": 2}
    assert s["kv_cache_usage"]["mean"] == pytest.approx((0.2 + 0.7) / 2)
    assert s["kv_cache_usage"]["max"] == pytest.approx(0.9)
    h = s["histograms"]["ttft"]
    assert h["count"] == 5 and h["sum"] == pytest.approx(6.55)
    assert h["buckets"] == [[0.1, 1.0], [1.0, 4.0], [None, 5.0]]
    assert h["p50"] == pytest.approx({"lo": 0.1, "hi": 1.0, "est": 0.1 + 0.9 * 1.5 / 3})
    assert h["p99"] == {"lo": 1.0, "hi": None, "est": 1.0}
    assert s["spec_decode"] is None
    assert s["histograms"]["tpot"] is None


def test_counter_restart_counts_the_new_value() -> None:
    def scrape(v: float, t: int) -> list[tuple[int, str, str, float]]:
        return parse_metrics(f'vllm:prompt_tokens_total{{engine="0"}} {v}\n', t)

    s = summarize(rows_to_table(scrape(100, 0) + scrape(150, 1) + scrape(20, 2) + scrape(30, 3)))
    assert s["prompt_tokens"] == 50 + 20 + 10


def test_bucket_quantile_edges() -> None:
    assert bucket_quantile([1.0, float("inf")], [0.0, 0.0], 0.5) is None
    assert bucket_quantile([1.0, 2.0], [4.0, 4.0], 1.0) == {"lo": 0.0, "hi": 1.0, "est": 1.0}
    assert summarize(rows_to_table([])) == {"scrapes": 0}
