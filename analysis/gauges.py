"""The server gauges the dashboard shows (running, waiting, KV cache, preemptions): their
names, their sums over a /metrics text's label sets, and ``SharedGauges``, the shared memory
through which the run's /metrics scraper hands each scrape's values to the dashboard. Apart
from the dashboard, so that the scraper's process imports none of the rendering."""

from __future__ import annotations

import math
import multiprocessing as mp
import urllib.request
from collections.abc import Iterable, Mapping

GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "KV cache",
    "vllm:num_preemptions": "preemptions",
}


def gauge_sums(samples: Iterable[tuple[str, float]]) -> dict[str, float]:
    """The dashboard's gauges from ``(sample name, value)`` pairs, summed over label sets
    (a counter's ``_total`` sample counts under its family's name)."""
    out: dict[str, float] = {}
    for name, value in samples:
        name = name.removesuffix("_total") if name not in GAUGES else name
        if name in GAUGES:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def scrape_gauges(url: str, timeout: float = 0.5) -> dict[str, float]:
    """Sum the dashboard's gauges over label sets from a Prometheus /metrics endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode("utf-8", "replace")
    return gauge_sums(
        (s.name, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
    )


class SharedGauges:
    """The dashboard's server gauges in shared memory, written by a process that scrapes the
    server's /metrics anyway (the run's scraper): the dashboard then shows its values instead
    of scraping the server a second time. Pass it to both processes when starting them."""

    NAMES = tuple(GAUGES)

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._values = ctx.Array("d", [math.nan] * len(self.NAMES))
        self._seq = ctx.Value("q", 0)

    def write(self, gauges: Mapping[str, float]) -> None:
        with self._values.get_lock():
            for i, name in enumerate(self.NAMES):
                self._values[i] = gauges.get(name, math.nan)
        with self._seq.get_lock():
            self._seq.value += 1

    def read(self) -> tuple[int, dict[str, float]]:
        """(how many writes so far, the gauges of the newest one that the server had)."""
        with self._values.get_lock():
            vals = self._values[:]
        return self._seq.value, {
            n: v for n, v in zip(self.NAMES, vals, strict=True) if not math.isnan(v)
        }
