"""The part of a trace a run replays, read within the reader's limits: with
``--max-sessions N``, only the rows of the sessions that can be among the first N are read
(``traces.select.first_sessions``), and with ``--duration``, only those of the sessions
that start within it (``traces.select.sessions_starting_before``), so a large trace cut
to a few sessions or seconds costs what those cost (without clones: their start shifts
depend on every session)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from agent_replay.replay.config import RunConfig
from agent_replay.traces.io import read_trace_rows
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.select import SessionScan


def read_replayed(config: RunConfig) -> tuple[pa.Table, TraceMeta, np.ndarray]:
    """The rows the run's plan is built from, its metadata, and each row's number in the
    trace (for messages about rows)."""
    scan, codes = replayed_sessions(config)
    if scan is None or codes is None:
        return read_trace_rows(config.trace)
    return read_trace_rows(config.trace, picked=scan.rows(codes))


def _every_session(config: RunConfig, by_duration: bool) -> bool:
    """Whether the run may send any session of the trace: cloned or rebased sessions, or
    neither a session count nor a duration to cut at."""
    cloned = config.sessions_multiplier > 1 or config.concurrent_sessions is not None
    return config.rebase_sessions or cloned or not (config.max_sessions is not None or by_duration)


def replayed_sessions(config: RunConfig) -> tuple[SessionScan | None, np.ndarray | None]:
    """The sessions a run can send (a superset, as codes of the scan that found them), or
    None for all of them. Clone start shifts and counts depend on every session of the
    trace, rebased sessions all start at 0, and ``--rate`` gives sessions new starts: then
    every session is read for a duration. ``agentx`` timing recycles every session whatever
    the duration."""
    opts = config.plan_options()
    by_duration = opts.duration_s is not None and config.rate is None
    if _every_session(config, by_duration):
        return None, None
    scan = SessionScan(config.trace, skip_failed=not config.include_failed)
    picked = None if config.max_sessions is None else scan.first(config.max_sessions)
    if by_duration:
        assert opts.duration_s is not None
        early = scan.before(opts.duration_s, opts.speedup)
        if early is not None:
            picked = early if picked is None else np.intersect1d(picked, early)
    return scan, picked
