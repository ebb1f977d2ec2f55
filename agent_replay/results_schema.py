"""The results dataset written by ``agent-replay run``: one row per request.

Layout of a results folder::

    RESULTS/run.json                     run metadata (agent_replay.runmeta.RunMeta)
    RESULTS/requests/part-*.parquet      one row per request, REQUEST_SCHEMA
    RESULTS/server_metrics.parquet       /metrics samples, SERVER_METRICS_SCHEMA (optional)
    RESULTS/gpu_telemetry.parquet        GPU samples, GPU_TELEMETRY_SCHEMA (optional)

Every ``*_ns`` time is an integer nanosecond offset on one monotonic clock from the run's
start (``run.json`` holds the wall-clock anchor); ``think_ns`` and ``connect_ns`` are
durations. Names follow docs/metrics.md: S = intended_ns, f = first_token_ns, c_j = chunk_ns[j],
k_j = chunk_tokens[j], e = end_ns, and the actual send time s = sent_ns + connect_ns: the
moment the request's bytes were handed to its connection. ``sent_ns`` (s0) is when the
client started the request (the schedule lag is s0 - S); ``connect_ns`` is the time it then
spent opening a new connection (and, with the fast client, waiting for its turn to write
after it), null when it reused a kept-alive one (s = s0). TTFT and E2E
count from s, so our own wait for a TCP handshake is not the server's latency; the latency
from the intended send time (f - S) includes everything. ``chunk_ns`` holds only chunks
that carry at least one output token.

Files written before ``connect_ns`` existed (results schema 1) read with it null.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

import pyarrow as pa

RESULTS_SCHEMA_VERSION = 2

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("request_index", pa.int32(), nullable=False),
        pa.field("parent_index", pa.int32(), nullable=False),
        pa.field("clone", pa.int32(), nullable=False),  # --sessions-multiplier copy, 0 = original
        pa.field("worker", pa.int32(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("api", pa.string(), nullable=False),
        pa.field("warmup", pa.bool_(), nullable=False),  # inside --warmup: kept, not in stats
        pa.field("intended_ns", pa.int64(), nullable=False),  # S
        pa.field("sent_ns", pa.int64()),  # s0: the client started the request
        # s - s0: opening a new connection for it (null: a kept-alive one was reused)
        pa.field("connect_ns", pa.int64()),
        pa.field("headers_ns", pa.int64()),  # response headers received
        pa.field("first_token_ns", pa.int64()),  # f
        pa.field("end_ns", pa.int64()),  # e, last byte
        pa.field("chunk_ns", pa.list_(pa.int64())),  # c_1..c_m
        pa.field("chunk_tokens", pa.list_(pa.int32())),  # k_1..k_m
        # when the latest dependency completed in this run (a chain: the parent); null when
        # the request did not wait (absolute timing, roots)
        pa.field("parent_end_ns", pa.int64()),
        pa.field("think_ns", pa.int64()),  # intended think time (after --speedup)
        pa.field("expected_input_tokens", pa.int32(), nullable=False),
        pa.field("expected_output_tokens", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int32()),  # from the server's usage
        pa.field("completion_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
        pa.field("implied_cached_tokens", pa.int32()),  # hit an unbounded prefix cache would get
        pa.field("status", pa.string(), nullable=False),  # "ok" | "error"
        # failed: connect | http | timeout | stream | json | empty | cancelled; ok rows: null,
        # mismatch (counts differ from the trace) or inexact (tokens per chunk not known)
        pa.field("error_kind", pa.string()),
        pa.field("http_status", pa.int32()),
        pa.field("error", pa.string()),
        # agent trees (trace schema v2): the request's stream and the request_index values
        # of its dependencies (same session and clone)
        pa.field("agent_id", pa.string()),
        pa.field("depends_on", pa.list_(pa.int32())),
    ]
)

OPTIONAL_COLUMNS = frozenset({"connect_ns", "agent_id", "depends_on"})
"""Columns added after schema 1: a part file without them reads them as nulls."""

ErrorKindName = Literal[
    "connect", "http", "timeout", "stream", "json", "empty", "cancelled", "mismatch", "inexact"
]


class ErrorKind:
    """The ``error_kind`` values by name, the one place they are spelled. A failed row has
    one of CONNECT .. CANCELLED; an ``ok`` row has null, MISMATCH (token counts differ from
    the trace) or INEXACT (see below). UNKNOWN is never written: counts use it for a failed
    row whose kind is null."""

    CONNECT: Final = "connect"
    HTTP: Final = "http"
    TIMEOUT: Final = "timeout"
    STREAM: Final = "stream"
    JSON: Final = "json"
    EMPTY: Final = "empty"  # a whole answer (HTTP 200, end marker) without the tokens asked for
    CANCELLED: Final = "cancelled"
    MISMATCH: Final = "mismatch"
    INEXACT: Final = "inexact"
    UNKNOWN: Final = "unknown"


ERROR_KINDS: tuple[ErrorKindName, ...] = get_args(ErrorKindName)

INEXACT: Final = ErrorKind.INEXACT
"""error_kind of an ``ok`` row whose tokens per chunk are not exact (the server sent neither
token ids nor continuous usage): its times are exact, its chunk_tokens (one per content
event) are not, so per-token metrics leave it out."""

SERVER_METRICS_SCHEMA = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),  # scrape time, same clock as requests
        pa.field(
            "name", pa.string(), nullable=False
        ),  # sample name, e.g. vllm:num_requests_running
        pa.field("labels", pa.string(), nullable=False),  # JSON object of labels, sorted keys
        pa.field("value", pa.float64(), nullable=False),
    ]
)

GPU_TELEMETRY_SCHEMA = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),  # sample time, same clock as requests
        pa.field("gpu", pa.int32(), nullable=False),  # NVML index / the exporter's gpu label
        pa.field("uuid", pa.string()),
        # Null where the source does not have the field (NVML has no sm_active/dram_active).
        pa.field(
            "gpu_util_pct", pa.float64()
        ),  # time a kernel ran (NVML util.gpu, DCGM_FI_DEV_GPU_UTIL)
        pa.field("sm_active_pct", pa.float64()),  # cycles an SM had a warp (DCGM_FI_PROF_SM_ACTIVE)
        pa.field("mem_util_pct", pa.float64()),  # time memory was read/written (NVML util.memory)
        pa.field(
            "dram_active_pct", pa.float64()
        ),  # memory bandwidth in use (DCGM_FI_PROF_DRAM_ACTIVE)
        pa.field("mem_used_bytes", pa.int64()),
        pa.field("mem_total_bytes", pa.int64()),
        pa.field("power_w", pa.float64()),  # the driver's power reading
        pa.field("energy_mj", pa.int64()),  # energy counter (since driver load), millijoules
        pa.field("temp_c", pa.float64()),
        pa.field("sm_clock_mhz", pa.float64()),
        pa.field("mem_clock_mhz", pa.float64()),
    ]
)
"""One row per GPU per sample (``engines.telemetry``); ``t_ns`` is an offset from the run's
t0 like every time in requests/."""
