"""The part of a trace a run replays, read within the reader's limits: with
``--max-sessions N``, only the rows of the sessions that can be among the first N are read
(``traces.select.first_sessions``), so a large trace cut to a few sessions costs what
those sessions cost (without clones: their start shifts depend on every session)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from agent_replay.replay.config import RunConfig
from agent_replay.traces.io import read_trace_rows
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.select import first_sessions


def read_replayed(config: RunConfig) -> tuple[pa.Table, TraceMeta, np.ndarray]:
    """The rows the run's plan is built from, its metadata, and each row's number in the
    trace (for messages about rows)."""
    sessions = None
    # Clone start shifts and counts depend on every session of the trace, and rebased
    # sessions all start at 0: then the whole trace is read.
    cloned = config.sessions_multiplier > 1 or config.concurrent_sessions is not None
    if config.max_sessions is not None and not config.rebase_sessions and not cloned:
        sessions = first_sessions(config.trace, config.max_sessions,
                                  skip_failed=not config.include_failed)
    return read_trace_rows(config.trace, sessions=sessions)
