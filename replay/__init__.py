"""The runtime and the CLI: the recording proxy; plan, scheduler, session driver, streaming
clients, workers, result writer."""

from __future__ import annotations

