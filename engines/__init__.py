"""The targets and their wire: API dialects and the SSE parser, vLLM deployment profiles and
launcher, the /metrics scraper, and the simulated engine.

Never imports ``replay``.
"""

from __future__ import annotations

if __name__ != "agent_replay.engines":  # the folder on sys.path would be a second copy
    raise ImportError(f"import agent_replay.engines, not {__name__}")

from agent_replay.engines.sse import SSEEvent, SSEParser, encode_event

__all__ = ["SSEEvent", "SSEParser", "encode_event"]
