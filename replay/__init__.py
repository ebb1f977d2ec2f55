"""The runtime and the CLI: the recording proxy; plan, scheduler, session driver, streaming
clients, workers, result writer."""

from __future__ import annotations

__version__ = "0.1.0"
