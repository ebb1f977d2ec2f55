"""agent-replay: record coding-agent sessions as Parquet traces and replay them, with their
original timing, against LLM serving deployments.

One import root. ``agent_replay.traces`` (the trace model), ``agent_replay.engines`` (the
simulated engine, vLLM launch and profiles, telemetry) and ``agent_replay.analysis``
(metrics, reports, comparisons) stand side by side: besides themselves they import only the
base here, ``agent_replay.errors`` (the exception hierarchy), ``agent_replay.redact`` (the secrets
policy) and ``agent_replay.results_schema`` (the Parquet schemas a run writes).
``agent_replay.replay`` (the runtime and the CLI) imports them all.
"""

from __future__ import annotations

__version__ = "0.1.0"
