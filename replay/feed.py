"""The progress feed of a run: the workers' ``Progress`` messages (and, from the Ray pool,
merged LiveStats snapshots) on their way to the analysis dashboard, which runs in its own
process and reads the request statistics from the part files (or takes the snapshots);
without a dashboard, a plain line every few seconds."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from agent_replay.replay.messages import Progress

Reporter = Callable[[str], None]


def _sum_progress(st: Any, last: Collection[Progress]) -> None:
    """The workers' latest progress into ``st`` (a LiveStats): counts summed, the longest
    elapsed time, each worker's CPU."""
    st.done, st.total = sum(m.done for m in last), sum(m.total for m in last)
    st.in_flight, st.active_sessions = sum(m.in_flight for m in last), sum(m.sessions for m in last)
    st.elapsed_ns = max(m.elapsed_ns for m in last)
    st.cpu_percent = [m.cpu * 100 for m in last]


class ProgressFeed:
    """Progress while the run goes: the analysis dashboard when the run shows progress,
    else a plain line every ``every_s`` seconds to ``out``."""

    def __init__(
        self,
        out: Reporter | None,
        every_s: float = 2.0,
        dashboard: Any = None,
        warn: Reporter | None = None,
    ) -> None:
        self.out = out
        self.warn = warn if warn is not None else out  # warnings, also without progress lines
        self.every_ns = int(every_s * 1e9)
        self.last: dict[int, Progress] = {}
        self._printed = 0
        self._chunks0 = (0, time.monotonic_ns())
        self.dashboard = dashboard
        self._snaps: dict[int, bytes] = {}
        self._own: Any = (
            None  # LiveStats of progress and loop lag, when the dashboard reads the parts
        )
        self._sent_ns = 0
        self._held = 0  # rows the workers could not write yet, as last said

    @classmethod
    def create(
        cls,
        out: Reporter | None,
        total: int,
        title: str,
        gauges_url: str | None,
        results_dir: str | None = None,
        shared_gauges: Any = None,
        gpu_gauges: Any = None,
        planned_ns: int = 0,
        warn: Reporter | None = None,
    ) -> ProgressFeed:
        """With ``results_dir``, the dashboard computes the request statistics from the
        part files there, and ``update`` sends it progress and loop lag only; without it,
        ``live`` sends it complete snapshots (the Ray pool's). ``shared_gauges``: the
        server gauges from the run's scraper (then the dashboard does not scrape itself)."""
        if out is None:
            return cls(None, warn=warn)
        from agent_replay.analysis.dashboard import DashboardProcess

        dash = DashboardProcess(
            total,
            title=title,
            server_gauges_url=gauges_url,
            results_dir=results_dir,
            shared_gauges=shared_gauges,
            gpu_gauges=gpu_gauges,
            planned_ns=planned_ns,
        )
        dash.start()
        prog = cls(out, dashboard=dash, warn=warn)
        if results_dir is not None:
            from agent_replay.analysis.live import LiveStats

            prog._own = LiveStats()
        return prog

    def live(self, shard: int, snapshot: bytes) -> None:
        """A worker's cumulative LiveStats snapshot: merge all workers', show the result."""
        if self.dashboard is None:
            return
        self._snaps[shard] = snapshot
        if len(self._snaps) == 1:
            self.dashboard.update(snapshot)
            return
        from agent_replay.analysis.live import LiveStats

        merged: Any = None
        for raw in self._snaps.values():
            st = LiveStats.decode(raw)
            if merged is None:
                merged = st
            else:
                merged.merge(st)
        self.dashboard.update(merged.encode())

    def _to_dashboard(self, msg: Progress | None, now: int) -> None:
        """Progress summed over the workers, and their loop-lag samples; sent at most every
        0.25 s (with one worker this runs on its measuring loop, so it is kept rare)."""
        st = self._own
        if msg is not None:
            st.observe_loop_lags(msg.loop_lags)
        if now - self._sent_ns < 250_000_000 and msg is not None and msg.done != msg.total:
            return
        self._sent_ns = now
        _sum_progress(st, self.last.values())
        self.dashboard.update(st.encode())

    def _writes(self) -> None:
        """One line when part files start to fail (rows held in memory) and one when every
        held row is written again."""
        held = sum(m.held_rows for m in self.last.values())
        if held and not self._held and self.warn is not None:
            err = next((m.write_error for m in self.last.values() if m.write_error), "write error")
            self.warn(
                f"WARNING: cannot write part files ({err}): "
                f"{held} rows kept in memory and retried; free space in the results folder"
            )
        elif self._held and not held and self.warn is not None:
            self.warn("writing again: every kept row is written")
        self._held = held

    def close(self) -> None:
        if self.dashboard is not None:
            if self._own is not None and self.last:
                self._sent_ns = 0
                self._to_dashboard(None, time.monotonic_ns())
            self.dashboard.stop()
            self.dashboard = None

    def update(self, msg: Progress) -> None:
        self.last[msg.shard] = msg
        now = time.monotonic_ns()
        self._writes()
        if self._own is not None:
            self._to_dashboard(msg, now)
        if self.out is None or self.dashboard is not None or now - self._printed < self.every_ns:
            return
        self._printed = now
        agg = {
            k: sum(getattr(m, k) for m in self.last.values())
            for k in ("total", "done", "errors", "in_flight", "sessions", "chunks", "output_tokens")
        }
        c0, t0 = self._chunks0
        rate = (agg["chunks"] - c0) / max((now - t0) / 1e9, 1e-9)
        self._chunks0 = (agg["chunks"], now)
        elapsed = max(m.elapsed_ns for m in self.last.values()) / 1e9
        self.out(
            f"[{elapsed:7.1f}s] {agg['done']}/{agg['total']} done, {agg['errors']} failed, "
            f"{agg['in_flight']} in flight, {agg['sessions']} sessions, "
            f"{rate:,.0f} chunks/s, {agg['output_tokens']:,} tokens"
        )
