"""Recording: a reverse proxy that turns live agent traffic into a trace.

``Recorder(upstream, listen, out_dir, ...)`` runs in the caller's event loop
(``await start()`` / ``await stop()``, ``.url``); ``agent-replay record`` is its CLI.
See docs/recording.md.
"""

from __future__ import annotations

from agent_replay.replay.record.recorder import RecordConfig, Recorder, RecorderStats, parse_listen
from agent_replay.replay.record.sessions import Assignment, SessionTracker

__all__ = [
    "Assignment",
    "RecordConfig",
    "Recorder",
    "RecorderStats",
    "SessionTracker",
    "parse_listen",
]
