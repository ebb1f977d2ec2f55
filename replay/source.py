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
from agent_replay.traces.select import first_sessions, sessions_starting_before


def read_replayed(config: RunConfig) -> tuple[pa.Table, TraceMeta, np.ndarray]:
    """The rows the run's plan is built from, its metadata, and each row's number in the
    trace (for messages about rows)."""
    return read_trace_rows(config.trace, sessions=replayed_sessions(config))


def replayed_sessions(config: RunConfig) -> set[str] | None:
    """The sessions a run can send (a superset), or None for all of them. Clone start
    shifts and counts depend on every session of the trace, rebased sessions all start
    at 0, and ``--rate`` or ``--concurrent-sessions`` give sessions new starts: then every
    session is read. ``agentx`` timing recycles every session whatever the duration."""
    cloned = config.sessions_multiplier > 1 or config.concurrent_sessions is not None
    if config.rebase_sessions or cloned:
        return None
    skip = not config.include_failed
    picked: set[str] | None = None
    if config.max_sessions is not None:
        picked = first_sessions(config.trace, config.max_sessions, skip_failed=skip)
    opts = config.plan_options()
    if opts.duration_s is not None and config.rate is None:
        early = sessions_starting_before(config.trace, opts.duration_s, opts.speedup,
                                         skip_failed=skip)
        if early is not None:
            picked = early if picked is None else picked & early
    return picked
