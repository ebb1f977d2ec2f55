"""``python -m agent_replay``: the ``agent-replay`` command line."""

from __future__ import annotations

from agent_replay.replay.cli import entry

entry()
