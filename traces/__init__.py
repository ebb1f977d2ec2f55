"""The trace model: schema, Parquet reader/writer/validator, importers, synthesizer.

Pure data, no network. Imports neither ``replay`` nor ``engines``.
"""

from __future__ import annotations

if __name__ != "agent_replay.traces":  # the folder on sys.path would be a second copy
    raise ImportError(f"import agent_replay.traces, not {__name__}")

from agent_replay.errors import (
    AgentReplayError,
    InputError,
    OutputExistsError,
    TraceError,
)
from agent_replay.traces.io import iter_batches, read_meta, read_trace, trace_files, write_trace
from agent_replay.traces.schema import SCHEMA_VERSION, TRACE_SCHEMA, TraceMeta

__all__ = [
    "SCHEMA_VERSION",
    "TRACE_SCHEMA",
    "AgentReplayError",
    "InputError",
    "OutputExistsError",
    "TraceError",
    "TraceMeta",
    "iter_batches",
    "read_meta",
    "read_trace",
    "trace_files",
    "write_trace",
]
