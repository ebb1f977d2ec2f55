"""/metrics in Prometheus text with vLLM's names, labels (model_name, engine) and semantics.

Rendered by prometheus_client from a registry of this server's own, through a collector
that reads the engine core's counters and histograms at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent_replay.engines.sim.core import EngineCore
from agent_replay.engines.sim.stats import Hist

_HELP = {
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
}


class SimCollector(Collector):
    def __init__(self, core: EngineCore, model_name: str, engine: str) -> None:
        self.core = core
        self.labels = {"model_name": model_name, "engine": engine}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(f"vllm:{name}", doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(f"vllm:{name}", doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def _hist(self, name: str, h: Hist) -> HistogramMetricFamily:
        m = HistogramMetricFamily(f"vllm:{name}", _HELP[name], labels=list(self.labels))
        cum = h.cumulative()
        buckets = [(_le(b), float(c)) for b, c in zip(h.bounds, cum[:-1], strict=True)]
        buckets.append(("+Inf", float(cum[-1])))
        m.add_metric(list(self.labels.values()), buckets, h.sum)
        return m

    def collect(self) -> Iterator[Metric]:
        core = self.core
        s = core.stats
        lv = list(self.labels.values())
        running = len(core.running)
        waiting = len(core.waiting)
        yield self._gauge(
            "num_requests_running", "Number of requests in model execution batches.", running
        )
        yield self._gauge(
            "num_requests_waiting", "Number of requests waiting to be processed.", waiting
        )
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason.",
            labels=[*self.labels, "reason"],
        )
        by_reason.add_metric([*lv, "capacity"], waiting)
        by_reason.add_metric([*lv, "deferred"], 0)
        yield by_reason
        yield self._gauge(
            "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.kv_usage()
        )
        yield self._counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        )
        yield self._counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits,
        )
        yield self._counter(
            "num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions
        )
        yield self._counter("prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        src = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*self.labels, "source"],
        )
        src.add_metric([*lv, "local_compute"], s.prompt_tokens_computed)
        src.add_metric([*lv, "local_cache_hit"], s.prompt_tokens_cached)
        src.add_metric([*lv, "external_kv_transfer"], 0)
        yield src
        yield self._counter(
            "prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            s.prompt_tokens_cached,
        )
        yield self._counter(
            "generation_tokens", "Number of generation tokens processed.", s.generation_tokens
        )
        ok = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self.labels, "finished_reason"],
        )
        for reason, n in s.request_success.items():
            ok.add_metric([*lv, reason], n)
        yield ok
        rej = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        rej.add_metric([self.labels["model_name"], "max_num_queued_reqs"], s.admission_rejections)
        rej.add_metric([self.labels["model_name"], "max_num_queued_tokens"], 0)
        yield rej
        if core.profile.num_speculative_tokens:
            yield self._counter(
                "spec_decode_num_drafts", "Number of spec decoding drafts.", s.spec_num_drafts
            )
            yield self._counter(
                "spec_decode_num_draft_tokens", "Number of draft tokens.", s.spec_num_draft_tokens
            )
            yield self._counter(
                "spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                s.spec_num_accepted_tokens,
            )
            pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels=[*self.labels, "position"],
            )
            for i, n in enumerate(s.spec_accepted_per_pos):
                pos.add_metric([*lv, str(i)], n)
            yield pos
        for name, h in s.hists.items():
            yield self._hist(name, h)


def _le(b: float) -> str:
    return repr(float(b))


def make_registry(core: EngineCore, model_name: str, engine: str = "0") -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SimCollector(core, model_name, engine))
    return reg


def render_metrics(core: EngineCore, model_name: str, engine: str = "0") -> bytes:
    return generate_latest(make_registry(core, model_name, engine))
