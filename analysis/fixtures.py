"""Results tables for tests, benchmarks and demos: hand-written rows and synthetic runs.

``rows_to_table`` turns a few dicts (REQUEST_SCHEMA names, missing fields defaulted) into a
table; ``synthetic_results`` makes a seeded, vectorized synthetic run whose per-request speed
is scaled by ``tpot_scale`` (so two runs can differ by a known amount);
``write_results`` lays a table out as a results folder. Synthetic numbers stand for nothing
measured: they only give the analysis code realistic shapes (multi-token chunks, failures,
warmup rows, sessions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agent_replay.results_schema import REQUEST_SCHEMA, RESULTS_SCHEMA_VERSION

_DEFAULTS: dict[str, Any] = {
    "session_id": "s0",
    "request_index": 0,
    "parent_index": -1,
    "clone": 0,
    "worker": 0,
    "request_id": "",
    "api": "completions",
    "warmup": False,
    "intended_ns": 0,
    "expected_input_tokens": 0,
    "expected_output_tokens": 0,
    "status": "ok",
}


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """A REQUEST_SCHEMA table from dicts; required fields not given take neutral defaults."""
    cols: dict[str, list[Any]] = {f.name: [] for f in REQUEST_SCHEMA}
    for i, row in enumerate(rows):
        unknown = set(row) - set(cols)
        if unknown:
            raise KeyError(f"row {i}: unknown fields {sorted(unknown)}")
        for name in cols:
            default = _DEFAULTS.get(name)
            if name == "request_id" and name not in row:
                default = f"r{i}"
            cols[name].append(row.get(name, default))
    return pa.Table.from_pydict(cols, schema=REQUEST_SCHEMA)


def _list_array(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, typ))


def synthetic_batches(
    n: int,
    seed: int,
    tpot_scale: float = 1.0,
    *,
    batch_rows: int = 65_536,
    requests_per_session: int = 20,
    rate_per_s: float = 50.0,
    median_output_tokens: float = 100.0,
    tokens_per_chunk: Sequence[float] = (0.4, 0.3, 0.2, 0.1),
    failed_fraction: float = 0.002,
    warmup_fraction: float = 0.0,
    ttft_median_ms: float = 300.0,
    tpot_median_ms: float = 20.0,
) -> Iterator[pa.RecordBatch]:
    """``n`` synthetic result rows in record batches of ``batch_rows`` (seeded, vectorized).

    ``tokens_per_chunk[i]`` is the probability that a chunk carries i + 1 tokens (speculative
    decoding); ``tpot_scale`` multiplies every request's decode speed (2.0 = half as fast).
    """
    rng = np.random.default_rng(seed)
    p_k = np.asarray(tokens_per_chunk, dtype=np.float64)
    p_k = p_k / p_k.sum()
    mean_k = float(np.dot(np.arange(1, p_k.size + 1), p_k))
    interval_ns = 1e9 / rate_per_s
    n_warm = int(n * warmup_fraction)
    t0 = 0.0
    for start in range(0, n, batch_rows):
        b = min(batch_rows, n - start)
        idx = np.arange(start, start + b)
        intended = (t0 + np.cumsum(rng.exponential(interval_ns, b))).astype(np.int64)
        t0 = float(intended[-1])
        lag = rng.exponential(200_000.0, b).astype(np.int64)
        sent = intended + lag
        ttft = (rng.lognormal(np.log(ttft_median_ms * 1e6), 0.5, b)).astype(np.int64)
        first = sent + ttft
        n_target = np.clip(rng.lognormal(np.log(median_output_tokens), 1.0, b), 1, 4000)
        m = np.maximum(1, np.ceil(n_target / mean_k)).astype(np.int64)
        offsets = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(m, out=offsets[1:])
        total = int(offsets[-1])
        k = (rng.choice(p_k.size, size=total, p=p_k) + 1).astype(np.int64)
        tpot = rng.lognormal(np.log(tpot_median_ms * 1e6 * tpot_scale), 0.3, b)
        row_of = np.repeat(np.arange(b), m)
        step = (k * tpot[row_of] * rng.lognormal(0.0, 0.2, total)).astype(np.int64)
        step[offsets[:-1]] = 0  # c_1 = f
        c = np.cumsum(step)
        row_base = np.concatenate(([0], c[offsets[1:-1] - 1]))
        c = c - np.repeat(row_base, m) + np.repeat(first, m)
        csum = np.concatenate(([0], np.cumsum(k)))
        n_out = csum[offsets[1:]] - csum[offsets[:-1]]
        end = c[offsets[1:] - 1] + 1_000_000
        failed = rng.random(b) < failed_fraction
        status = np.where(failed, "error", "ok")
        kinds = np.array(["http", "timeout", "stream", "connect"])
        error_kind = kinds[rng.integers(0, kinds.size, b)].astype(object)
        error_kind[~failed] = None
        prompt = np.clip(rng.lognormal(np.log(20_000), 0.6, b), 10, 200_000).astype(np.int64)
        implied = (prompt * rng.uniform(0.6, 0.95, b)).astype(np.int64)
        cached = np.minimum(prompt, (implied * rng.uniform(0.85, 1.0, b)).astype(np.int64))
        session = idx // requests_per_session
        req_index = idx % requests_per_session
        think = np.where(req_index > 0, rng.exponential(5e9, b), np.nan)
        c_list = _list_array(offsets, c, pa.int64())
        k_list = _list_array(offsets, k, pa.int32())
        null_lists = pa.array(failed)
        cols: dict[str, Any] = {
            "session_id": pa.array([f"s{x}" for x in session.tolist()], pa.string()),
            "request_index": pa.array(req_index, pa.int32()),
            "parent_index": pa.array(req_index - 1, pa.int32()),
            "clone": pa.array(np.zeros(b, dtype=np.int32)),
            "worker": pa.array((session % 4).astype(np.int32)),
            "request_id": pa.array([f"r{x}" for x in idx.tolist()], pa.string()),
            "api": pa.array(["completions"] * b, pa.string()),
            "warmup": pa.array(idx < n_warm),
            "intended_ns": pa.array(intended),
            "sent_ns": pa.array(sent),
            "connect_ns": pa.nulls(b, pa.int64()),  # every request on a kept-alive connection
            "headers_ns": pa.array(sent + ttft // 2),
            "first_token_ns": pa.array(first, mask=failed),
            "end_ns": pa.array(end, mask=failed),
            "chunk_ns": pc.if_else(null_lists, pa.scalar(None, c_list.type), c_list),
            "chunk_tokens": pc.if_else(null_lists, pa.scalar(None, k_list.type), k_list),
            "parent_end_ns": pa.array(
                np.where(req_index > 0, intended - np.nan_to_num(think), 0).astype(np.int64),
                mask=req_index == 0,
            ),
            "think_ns": pa.array(np.nan_to_num(think).astype(np.int64), mask=req_index == 0),
            "expected_input_tokens": pa.array(prompt.astype(np.int32)),
            "expected_output_tokens": pa.array(n_out.astype(np.int32)),
            "prompt_tokens": pa.array(prompt.astype(np.int32), mask=failed),
            "completion_tokens": pa.array(n_out.astype(np.int32), mask=failed),
            "cached_tokens": pa.array(cached.astype(np.int32), mask=failed),
            "implied_cached_tokens": pa.array(implied.astype(np.int32)),
            "status": pa.array(status, pa.string()),
            "error_kind": pa.array(error_kind, pa.string()),
            "http_status": pa.array(
                np.where(error_kind == "http", 503, 0).astype(np.int32), mask=error_kind != "http"
            ),
            "error": pa.array(
                ["synthetic failure" if x else None for x in failed.tolist()], pa.string()
            ),
            "agent_id": pa.nulls(b, pa.string()),
            "depends_on": pa.nulls(b, pa.list_(pa.int32())),
        }
        yield pa.RecordBatch.from_pydict(cols, schema=REQUEST_SCHEMA)


def synthetic_results(n: int, seed: int, tpot_scale: float = 1.0, **kwargs: Any) -> pa.Table:
    """``n`` synthetic result rows as one table (see ``synthetic_batches``)."""
    return pa.Table.from_batches(
        list(synthetic_batches(n, seed, tpot_scale, **kwargs)), schema=REQUEST_SCHEMA
    )


def write_results(
    results_dir: str | os.PathLike[str],
    data: pa.Table | Iterator[pa.RecordBatch],
    run_meta: Mapping[str, Any] | None = None,
    *,
    server_metrics: pa.Table | None = None,
    part_rows: int | None = None,
    **parquet_options: Any,
) -> Path:
    """Lay ``data`` out as a results folder: run.json + requests/part-*.parquet (one part per
    record batch of an iterator, one part for a table; with ``part_rows``, parts of that many
    rows, as a replay writes them). ``parquet_options`` go to ``pq.write_table``
    (e.g. ``compression="zstd"``)."""
    root = Path(results_dir)
    (root / "requests").mkdir(parents=True, exist_ok=True)
    meta = {"results_schema_version": RESULTS_SCHEMA_VERSION, "source": "synthetic"}
    meta.update(run_meta or {})
    (root / "run.json").write_text(json.dumps(meta, indent=2))
    batches = data.to_batches(max_chunksize=1 << 20) if isinstance(data, pa.Table) else data
    i = 0
    for batch in batches:
        step = part_rows or max(1, batch.num_rows)
        for start in range(0, max(1, batch.num_rows), step):
            part = pa.Table.from_batches([batch.slice(start, step)])
            pq.write_table(part, root / "requests" / f"part-{i:05d}.parquet", **parquet_options)
            i += 1
    if server_metrics is not None:
        pq.write_table(server_metrics, root / "server_metrics.parquet")
    return root
