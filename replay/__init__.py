"""The runtime and the CLI: the recording proxy; plan, scheduler, session driver, streaming
clients, workers, result writer."""

from __future__ import annotations

if __name__ != "agent_replay.replay":  # the folder on sys.path would be a second copy
    raise ImportError(f"import agent_replay.replay, not {__name__}")
