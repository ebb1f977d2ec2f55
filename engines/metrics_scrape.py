"""Sample a server's Prometheus ``/metrics`` during a run.

``parse_metrics`` is the pure part: Prometheus text in, rows of
``agent_replay.results_schema.SERVER_METRICS_SCHEMA`` out, parsed with prometheus_client's own
text parser. ``Scraper`` is the I/O shell: it scrapes once at ``start()`` (the baseline),
then every ``interval_s``, and once more at ``stop()``, which returns the samples as an
Arrow table. Times come from the injected ``clock_ns`` (pass the run's clock so scrape
times line up with request times). A failed scrape is counted in ``errors`` and skipped;
it never stops the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable

import aiohttp
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from agent_replay.errors import ProtocolError
from agent_replay.results_schema import SERVER_METRICS_SCHEMA

DEFAULT_PREFIXES = ("vllm:",)


def parse_metrics(
    text: str, t_ns: int, prefixes: Iterable[str] | None = DEFAULT_PREFIXES
) -> list[tuple[int, str, str, float]]:
    """``(t_ns, sample name, labels JSON, value)`` for every sample whose name starts with
    one of ``prefixes`` (``None``: all). ``*_created`` samples (creation timestamps) are
    dropped. Raises ``ProtocolError`` on text the Prometheus parser rejects."""
    keep = tuple(prefixes) if prefixes is not None else None
    rows: list[tuple[int, str, str, float]] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if keep is not None and not name.startswith(keep):
                    continue
                if name.endswith("_created"):
                    continue
                labels = json.dumps(dict(sample.labels), sort_keys=True, separators=(",", ":"))
                rows.append((t_ns, name, labels, float(sample.value)))
    except ValueError as exc:
        raise ProtocolError(f"/metrics: not Prometheus text: {exc}") from None
    return rows


def rows_to_table(rows: list[tuple[int, str, str, float]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, SERVER_METRICS_SCHEMA, strict=True)],
        schema=SERVER_METRICS_SCHEMA,
    )


def metrics_url(base_url: str) -> str:
    """The Prometheus endpoint of a server whose base URL is ``base_url``."""
    return base_url.rstrip("/") + "/metrics"


class Scraper:
    """Scrape ``{base_url}/metrics`` every ``interval_s`` between ``start()`` and ``stop()``."""

    def __init__(
        self,
        base_url: str,
        interval_s: float = 1.0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        *,
        prefixes: Iterable[str] | None = DEFAULT_PREFIXES,
        timeout_s: float = 5.0,
        on_scrape: Callable[[list[tuple[int, str, str, float]]], None] | None = None,
    ) -> None:
        """``on_scrape``: called with the rows of each successful scrape (e.g. to show the
        newest values live)."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.url = metrics_url(base_url)
        self.interval_ns = int(interval_s * 1e9)
        self.clock_ns = clock_ns
        self.prefixes = tuple(prefixes) if prefixes is not None else None
        self.timeout_s = timeout_s
        self.on_scrape = on_scrape
        self.rows: list[tuple[int, str, str, float]] = []
        self.scrapes = 0
        self.errors = 0
        self.last_error: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take the baseline scrape, then keep scraping in the background."""
        if self._session is not None:
            raise RuntimeError("already started")
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await self.scrape_once()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> pa.Table:
        """Stop the loop, take a final scrape and return every sample as a table."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._session is not None:
            await self.scrape_once()
            await self._session.close()
            self._session = None
        return rows_to_table(self.rows)

    async def scrape_once(self) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(self.url) as resp:
                if resp.status != 200:
                    raise ProtocolError(f"{self.url}: HTTP {resp.status}")
                text = await resp.text()
            t_ns = self.clock_ns()
            rows = parse_metrics(text, t_ns, self.prefixes)
            self.rows.extend(rows)
            self.scrapes += 1
            if self.on_scrape is not None:
                self.on_scrape(rows)
            return True
        except (aiohttp.ClientError, asyncio.TimeoutError, ProtocolError, OSError) as exc:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False

    async def _loop(self) -> None:
        next_ns = self.clock_ns() + self.interval_ns
        while True:
            delay = (next_ns - self.clock_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            await self.scrape_once()
            next_ns += self.interval_ns
            now = self.clock_ns()
            if next_ns < now:  # a slow scrape: skip the missed ticks, keep the cadence
                next_ns = now + self.interval_ns
