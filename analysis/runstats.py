"""Run-level statistics, accumulated over record batches in bounded memory.

Per-request metrics of ``ok`` non-warmup rows are kept as columns (a few numbers per row;
a million rows is ~100 MB) and summarized exactly; per-chunk samples (ITL, chunk gap) are
folded into HdrHistograms batch by batch, so chunk lists never have to fit in memory at once.
Warmup rows are counted and otherwise ignored.

Rows with inexact tokens per chunk (error_kind ``inexact``: the server sent neither token
ids nor continuous usage) count everywhere a time or the final usage is enough (TTFT, E2E,
chunk gap, schedule lag, request counts, throughput, goodput's TTFT/E2E objectives) and
nowhere a per-token figure is needed: ITL, TPOT, request and session TPS (so the headline
P90 TPS), tokens per chunk. ``RunStats.inexact`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.analysis import outcomes
from agent_replay.analysis.definitions import METRICS as METRIC_DEFS
from agent_replay.analysis.definitions import REQUEST_METRICS as REQUEST_DEFS
from agent_replay.analysis.definitions import Inputs, total_tokens_per_s_per_gpu
from agent_replay.analysis.fold import fold_chunks
from agent_replay.analysis.hist import Hist, Summary, percentile_summary
from agent_replay.analysis.metrics import (
    NS,
    _col,
    _f64,
    _i64,
    exact_rows,
    lists,
    request_metrics,
    served_output_tokens,
    stats_rows,
)
from agent_replay.results_schema import REQUEST_SCHEMA, ErrorKind

PER_TOKEN_METRICS = (
    "ITL",
    "TPOT",
    "request TPS",
    "session TPS",
    "P90 TPS headline",
    "tokens per chunk",
)
"""What rows with inexact tokens per chunk are left out of (in the report's words)."""
LATENCY_METRICS = tuple(d.key for d in METRIC_DEFS)
COLUMNS = (
    "session_id",
    "clone",
    "warmup",
    "status",
    "error_kind",
    "intended_ns",
    "sent_ns",
    "connect_ns",
    "first_token_ns",
    "end_ns",
    "chunk_ns",
    "chunk_tokens",
    "parent_end_ns",
    "think_ns",
    "expected_input_tokens",
    "expected_output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "implied_cached_tokens",
    "request_index",
    "depends_on",
    "agent_id",
)
"""The request columns the analysis reads."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request objectives: an upper bound in ns on per-request metrics of the
    definitions table (``analysis.definitions``, ``per == "request"``). TTFT, TPOT and E2E
    have fields of their own; ``more`` holds any other metric's (key, bound)."""

    ttft_ns: float | None = None
    tpot_ns: float | None = None
    e2e_ns: float | None = None
    more: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, bounds: Mapping[str, float]) -> Slo:
        """An Slo from metric key -> bound in ns (an unknown key is a ``ValueError``)."""
        unknown = set(bounds) - {d.key for d in REQUEST_DEFS}
        if unknown:
            raise ValueError(f"not per-request metrics: {sorted(unknown)}")
        rest = tuple(
            sorted((k, float(v)) for k, v in bounds.items() if k not in ("ttft", "tpot", "e2e"))
        )
        return cls(bounds.get("ttft"), bounds.get("tpot"), bounds.get("e2e"), rest)

    def bounds(self) -> dict[str, float]:
        """Metric key -> bound in ns, for every objective set (the table's order)."""
        given = {"ttft": self.ttft_ns, "tpot": self.tpot_ns, "e2e": self.e2e_ns, **dict(self.more)}
        return {d.key: float(v) for d in REQUEST_DEFS if (v := given.get(d.key)) is not None}

    @property
    def any(self) -> bool:
        return bool(self.bounds())


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens."""

    input_miss: float
    input_hit: float
    output: float


@dataclass(slots=True)
class RunStats:
    """Everything the report shows, as plain values."""

    requests: dict[str, int]
    errors: dict[str, int]
    latency: dict[str, Summary]
    tps: Summary
    duration_ns: int
    tokens: dict[str, int]
    tokens_per_chunk: dict[int, int]
    fidelity: dict[str, Any]
    sessions: pa.Table
    per_request: pa.Table
    goodput: dict[str, Any] | None = None
    economics: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    inexact: dict[str, int] = field(default_factory=lambda: {"requests": 0, "without_usage": 0})
    """Counted ``ok`` rows whose tokens per chunk are not exact, and how many of them had no
    usage (their output length is unknown: counted as content chunks, a lower bound)."""


class Accumulator:
    """Feed REQUEST_SCHEMA batches with ``add``; ``finish`` returns the RunStats."""

    def __init__(self) -> None:
        self.itl = Hist()
        self.chunk_gap = Hist()
        self.tpc = np.zeros(0, dtype=np.int64)
        self.parts: list[pa.Table] = []
        self.errors: dict[str, int] = {}
        self.warmup = 0
        self.failed = 0
        self.rows = 0
        self.inexact = 0
        self.inexact_without_usage = 0

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.rows += batch.num_rows
        ok, counted = stats_rows(batch)
        self.warmup += int((~counted).sum())
        bad = counted & ~ok
        if bad.any():
            self.failed += int(bad.sum())
            kinds = pc.fill_null(_col(batch, "error_kind"), ErrorKind.UNKNOWN).filter(pa.array(bad))
            for item in pc.value_counts(kinds).to_pylist():
                self.errors[item["values"]] = self.errors.get(item["values"], 0) + item["counts"]
        exact = exact_rows(batch)
        inexact = ok & ~exact
        if inexact.any():
            self.inexact += int(inexact.sum())
            no_usage = np.asarray(
                _col(batch, "completion_tokens").is_null().to_numpy(zero_copy_only=False),
                dtype=bool,
            )
            self.inexact_without_usage += int((inexact & no_usage).sum())
        c, k = lists(batch, "chunk_ns"), lists(batch, "chunk_tokens")
        m = request_metrics(batch, c, k)
        counts = fold_chunks(c, k, ok, self.itl, self.chunk_gap, exact=exact)
        if counts.size:
            if counts.size > self.tpc.size:
                counts[: self.tpc.size] += self.tpc
                self.tpc = counts
            else:
                self.tpc[: counts.size] += counts
        sel = pa.array(counted)
        cols = {
            "session_id": _col(batch, "session_id").filter(sel),
            "clone": _col(batch, "clone").filter(sel),
            "ok": ok[counted],
            "exact": exact[counted],
            "intended_ns": _i64(batch, "intended_ns")[counted],
            "end_ns": _f64(batch, "end_ns")[counted],
            "think_ns": _f64(batch, "think_ns")[counted],
            "parent_end_ns": _f64(batch, "parent_end_ns")[counted],
            "request_index": _i64(batch, "request_index")[counted],
            "depends_on": _depends_on(batch).filter(sel),
            "agent_id": _optional_str(batch, "agent_id").filter(sel),
            "error_kind": _col(batch, "error_kind").filter(sel),
            "sent_ns": _f64(batch, "sent_ns")[counted],
            "output_tokens": m.output_tokens[counted],
            "decode_tokens": m.decode_tokens[counted],
            "expected_input_tokens": _i64(batch, "expected_input_tokens")[counted],
            "expected_output_tokens": _i64(batch, "expected_output_tokens")[counted],
            "prompt_tokens": _f64(batch, "prompt_tokens")[counted],
            "completion_tokens": _f64(batch, "completion_tokens")[counted],
            "cached_tokens": _f64(batch, "cached_tokens")[counted],
            "implied_cached_tokens": _f64(batch, "implied_cached_tokens")[counted],
        }
        cols["decode"] = m.decode[counted]
        cols["tps"] = np.where(exact, m.tps, np.nan)[counted]
        inputs = Inputs(batch, c, k, m)
        for d in REQUEST_DEFS:  # every per-request entry of the definitions table
            assert d.formula is not None
            v = d.formula(inputs)
            if d.rows == "ok_exact":  # per-token: undefined where tokens per chunk are not known
                v = np.where(exact, v, np.nan)
            cols[d.key] = v[counted]
        self.parts.append(pa.table(cols))

    def finish(
        self, slo: Slo | None = None, prices: Prices | None = None, gpus: int | None = None
    ) -> RunStats:
        t = pa.concat_tables(self.parts) if self.parts else _empty_table()
        ok = t.column("ok").to_numpy(zero_copy_only=False).astype(bool)

        def arr(name: str) -> np.ndarray:
            return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

        hists = {"itl": self.itl, "chunk_gap": self.chunk_gap}
        latency = _latency(arr, ok, hists)
        tps = _tps_summary(arr("tps")[ok], latency["tpot"])

        end = arr("end_ns")
        start_ns, stop_ns = _measured_window(arr("intended_ns"), end)
        duration = max(0, int(stop_ns - start_ns))

        exact_all = t.column("exact").to_numpy(zero_copy_only=False).astype(bool)
        out_tok = served_output_tokens(arr("completion_tokens"), arr("output_tokens"), exact_all)[
            ok
        ]
        tokens = _token_totals(arr, ok, out_tok)
        n_ok = int(ok.sum())
        failed, cancelled = outcomes.split(self.errors)  # the stop's cancellations are apart
        requests = {
            "total": self.rows,
            "counted": t.num_rows,
            "ok": n_ok,
            "failed": failed,
            "cancelled": cancelled,
            "warmup": self.warmup,
        }
        stats = RunStats(
            requests=requests,
            errors=dict(sorted(self.errors.items(), key=lambda kv: -kv[1])),
            latency=latency,
            tps=tps,
            duration_ns=duration,
            tokens=tokens,
            tokens_per_chunk={i: int(n) for i, n in enumerate(self.tpc.tolist()) if n},
            fidelity=_fidelity(t, ok, arr),
            sessions=_sessions(t),
            per_request=t,
            inexact={"requests": self.inexact, "without_usage": self.inexact_without_usage},
        )
        stats.extra["window_ns"] = (start_ns, stop_ns)  # the measured window, run clock
        stats.extra["hists"] = hists  # the per-token distributions (the HTML report's CDFs)
        window = _send_window(arr("sent_ns")[ok], end[ok])
        stats.extra["send_window_ns"] = window  # first send to last end of the ok requests
        stats.extra["throughput"] = _throughput(tokens, n_ok, duration, gpus, window)
        if slo is not None and slo.any:
            exact = t.column("exact").to_numpy(zero_copy_only=False).astype(bool)
            values = {k: arr(k)[ok] for k in slo.bounds()}
            stats.goodput = goodput(
                values, out_tok, slo, duration, self.rows - self.warmup, exact[ok]
            )
        if prices is not None and duration:
            stats.economics = economics(tokens, duration, prices, gpus or 1)
        return stats


def _latency(
    arr: Callable[[str], np.ndarray], ok: np.ndarray, hists: Mapping[str, Hist]
) -> dict[str, Summary]:
    """Every metric's percentiles by the one percentile rule: exact nearest rank over its
    rows (all, or the ok ones), or the histogram's."""
    latency: dict[str, Summary] = {}
    for d in METRIC_DEFS:
        if d.per == "request":
            latency[d.key] = percentile_summary(
                arr(d.key) if d.rows == "all" else arr(d.key)[ok], method=d.percentile_method
            )
        else:
            latency[d.key] = hists[d.key].summary()
    return latency


def _token_totals(
    arr: Callable[[str], np.ndarray], ok: np.ndarray, out_tok: np.ndarray
) -> dict[str, int]:
    """Output and input tokens of the ok requests, the input split into cached and computed
    (a prompt without usage counts as the trace's input)."""
    prompt = np.where(
        np.isnan(arr("prompt_tokens")), arr("expected_input_tokens"), arr("prompt_tokens")
    )[ok]
    cached = np.nan_to_num(arr("cached_tokens"))[ok]
    return {
        "output": int(out_tok.sum()),
        "input": int(prompt.sum()),
        "input_cached": int(cached.sum()),
        "input_computed": int(prompt.sum() - cached.sum()),
    }


def _measured_window(intended: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """First intended send to last end (an empty run: 0.0 to its start)."""
    start_ns = float(np.nanmin(intended)) if intended.size else 0.0
    stop_ns = float(np.nanmax(end)) if np.isfinite(end).any() else start_ns
    return start_ns, stop_ns


def _send_window(sent: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """First send to last end (0.0 where unknown)."""
    return (
        float(np.nanmin(sent)) if np.isfinite(sent).any() else 0.0,
        float(np.nanmax(end)) if np.isfinite(end).any() else 0.0,
    )


def _throughput(
    tokens: Mapping[str, int],
    n_ok: int,
    duration: int,
    gpus: int | None,
    window: tuple[float, float],
) -> dict[str, Any]:
    """Tokens and requests per second over the measured window (None when it is empty), per
    GPU when the count is known; AgentX's total tokens/s per GPU over the send window."""
    secs = duration / NS if duration else float("nan")

    def rate(n: float) -> float | None:
        return n / secs if duration else None

    out: dict[str, Any] = {
        "output_tokens_per_s": rate(tokens["output"]),
        "input_tokens_per_s": rate(tokens["input"]),
        "input_cached_tokens_per_s": rate(tokens["input_cached"]),
        "input_computed_tokens_per_s": rate(tokens["input_computed"]),
        "requests_per_s": rate(n_ok),
        "gpus": gpus,
    }
    out["total_tokens_per_s_per_gpu"] = total_tokens_per_s_per_gpu(
        tokens["input"], tokens["output"], *window, gpus
    )
    if gpus and duration:
        out["output_tokens_per_s_per_gpu"] = tokens["output"] / secs / gpus
        out["input_tokens_per_s_per_gpu"] = tokens["input"] / secs / gpus
    return out


def tps_from_tpot(tpot: Summary) -> Summary:
    """Request TPS read from TPOT's percentiles alone (the live statistics keep only TPOT's
    histogram): the same values as the report's, without max and mean."""
    values = {p: (None if v is None or v <= 0 else NS / v) for p, v in tpot.values.items()}
    return Summary(tpot.count, values, None, None, dict(tpot.reliable), tpot.exact)


def _tps_summary(tps: np.ndarray, tpot: Summary | None = None) -> Summary:
    """Request TPS, read as a tail: the value at "P90" is the speed 90% of requests reach or
    beat, defined as 1 / (P90 of TPOT) (docs/metrics.md) and computed from ``tpot`` (the TPOT
    percentiles of the same requests); never as a low percentile of ``tps``, which picks a
    different rank whenever 0.1 n is a whole number."""
    if tpot is None:
        tpot = percentile_summary(1e9 / tps[tps > 0])
    values = {p: (None if v is None or v <= 0 else NS / v) for p, v in tpot.values.items()}
    clean = tps[~np.isnan(tps)]
    return Summary(
        tpot.count,
        values,
        float(clean.max()) if clean.size else None,
        float(clean.mean()) if clean.size else None,
        dict(tpot.reliable),
        True,
    )


def goodput(
    values: Mapping[str, np.ndarray],
    out_tokens: np.ndarray,
    slo: Slo,
    duration_ns: int,
    attempted: int,
    exact: np.ndarray | None = None,
) -> dict[str, Any]:
    """Requests (of the ok ones, ``values``: each objective's metric per ok request, in ns)
    meeting every objective of ``slo``; failed requests never count as good. A per-token
    metric (rows ``ok_exact``: TPOT) that is undefined for a request (one output chunk)
    is met; any other undefined value is not. A request whose tokens per chunk are not exact
    (``exact`` False) has unknown per-token metrics: with such an objective it does not count
    as good, and ``tpot_unknown`` says how many such requests there were."""
    n = len(out_tokens)
    good = np.ones(n, dtype=bool)
    unknown = 0
    for key, bound in slo.bounds().items():
        v = values[key]
        if _REQUEST_ROWS[key] == "ok_exact":
            good &= np.isnan(v) | (v <= bound)
            if exact is not None:
                unknown = int((~exact).sum())
                good &= exact
        else:
            good &= ~np.isnan(v) & (v <= bound)
    n_good = int(good.sum())
    secs = duration_ns / NS if duration_ns else None
    b = slo.bounds()
    return {
        "slo": {
            "ttft_ms": _ms(slo.ttft_ns),
            "tpot_ms": _ms(slo.tpot_ns),
            "e2e_ms": _ms(slo.e2e_ns),
            **{f"{k}_ms": _ms(v) for k, v in b.items() if k not in ("ttft", "tpot", "e2e")},
        },
        "good_requests": n_good,
        "attempted_requests": attempted,
        "fraction": n_good / attempted if attempted else None,
        "requests_per_s": n_good / secs if secs else None,
        "output_tokens_per_s": float(out_tokens[good].sum()) / secs if secs else None,
        "tpot_unknown": unknown,
    }


_REQUEST_ROWS = {d.key: d.rows for d in REQUEST_DEFS}


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def economics(
    tokens: Mapping[str, int], duration_ns: int, prices: Prices, gpus: int
) -> dict[str, Any]:
    """Revenue per GPU-hour at the given prices (USD per million tokens), with the arithmetic.

    revenue/hour = 3600 x (hit tokens/s x hit price + miss tokens/s x miss price
    + output tokens/s x output price) / 1e6; per GPU-hour = that / GPUs."""
    secs = duration_ns / NS
    rates = {
        "input_hit": tokens["input_cached"] / secs,
        "input_miss": tokens["input_computed"] / secs,
        "output": tokens["output"] / secs,
    }
    price = {
        "input_hit": prices.input_hit,
        "input_miss": prices.input_miss,
        "output": prices.output,
    }
    parts = {k: rates[k] * 3600 * price[k] / 1e6 for k in rates}
    per_hour = sum(parts.values())
    lines = [
        f"{k:10s}: {rates[k]:,.1f} tok/s x 3600 s x ${price[k]:g}/M = ${parts[k]:,.2f}/h"
        for k in rates
    ]
    lines.append(
        f"total     : ${per_hour:,.2f}/h / {gpus} GPU = ${per_hour / gpus:,.2f} per GPU-hour"
    )
    return {
        "prices_per_million": price,
        "tokens_per_s": rates,
        "usd_per_hour": parts,
        "usd_per_hour_total": per_hour,
        "gpus": gpus,
        "usd_per_gpu_hour": per_hour / gpus,
        "arithmetic": lines,
    }


def _fidelity(t: pa.Table, ok: np.ndarray, arr: Any) -> dict[str, Any]:
    """How faithfully the replay reproduced the trace. Token counts served vs the trace
    count every attempted (non-warmup) request on both sides: a failed request adds its
    trace tokens and whatever it was served (docs/metrics.md), so failures lower the ratios.
    Cache and think-time figures cover ok rows."""
    exp_in_all = arr("expected_input_tokens")
    prompt_all = arr("prompt_tokens")
    completion = arr("completion_tokens")
    # output length: the usage, else the chunks' tokens where those are exact; a row with
    # neither (inexact, no usage) has no known length and is left out of the comparison
    exact = t.column("exact").to_numpy(zero_copy_only=False).astype(bool)
    known = ~np.isnan(completion) | exact
    exp_out_all = arr("expected_output_tokens")
    out_all = served_output_tokens(completion, arr("output_tokens"), exact)
    exp_out, out = exp_out_all[known], out_all[known]
    mism = (out_all != exp_out_all)[known & ok]
    exp_in = exp_in_all[ok]
    prompt = prompt_all[ok]
    cached = arr("cached_tokens")[ok]
    implied = arr("implied_cached_tokens")[ok]
    have_prompt = ~np.isnan(prompt)
    have_cached = ~np.isnan(cached) & have_prompt
    have_implied = ~np.isnan(implied)
    sent, parent_end, think = arr("sent_ns"), arr("parent_end_ns"), arr("think_ns")
    has_parent = ~np.isnan(parent_end) & ~np.isnan(sent)
    think_err = (sent - parent_end - think)[has_parent & ~np.isnan(think)]
    early = early_sends(t)

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    served_in = float(np.nansum(prompt_all))
    trace_in = float(exp_in_all.sum())
    return {
        "prompt_tokens_served": int(served_in),
        "prompt_tokens_trace": int(trace_in),
        "prompt_ratio": ratio(served_in, trace_in),
        "prompt_mismatches": int((prompt[have_prompt] != exp_in[have_prompt]).sum()),
        "output_tokens_served": int(out.sum()),
        "output_tokens_trace": int(exp_out.sum()),
        "output_ratio": ratio(float(out.sum()), float(exp_out.sum())),
        "output_mismatches": int(mism.sum()),
        "prefix_hit_rate_server": ratio(
            float(cached[have_cached].sum()), float(prompt[have_cached].sum())
        ),
        "prefix_hit_rate_implied": ratio(
            float(implied[have_implied].sum()), float(exp_in[have_implied].sum())
        ),
        "requests_with_server_cache_info": int(have_cached.sum()),
        "sent_before_parent_end": int((sent[has_parent] < parent_end[has_parent]).sum())
        if early is None
        else int(early.sum()),
        "think_time_error": percentile_summary(np.abs(think_err)),
    }


def _optional_str(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    if name in batch.schema.names:
        return _col(batch, name).cast(pa.string())
    return pa.nulls(batch.num_rows, pa.string())


def _depends_on(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    if "depends_on" in batch.schema.names:
        col = batch.column("depends_on")
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pa.nulls(batch.num_rows, pa.list_(pa.int32()))


def early_sends(t: pa.Table) -> np.ndarray | None:
    """Per row: sent before the latest end, in this run, of its dependencies (the rows of
    the same session and clone whose ``request_index`` its ``depends_on`` lists; those not in
    ``t`` are left out). In every timing mode: absolute timing does not wait, so there this
    counts how often the trace's order was broken. None when ``t`` has no ``depends_on``
    (results from before agent trees)."""
    if "depends_on" not in t.column_names or t.num_rows == 0:
        return None
    deps = t.column("depends_on").combine_chunks()
    if deps.null_count == len(deps):
        return None
    sess_col = t.column("session_id").combine_chunks()
    if pa.types.is_dictionary(sess_col.type):
        sess_col = sess_col.cast(sess_col.type.value_type)
    sess = np.asarray(sess_col.dictionary_encode().indices, dtype=np.int64)
    clone = np.asarray(t.column("clone").to_numpy(zero_copy_only=False), dtype=np.int64)
    req = np.asarray(t.column("request_index").to_numpy(zero_copy_only=False), dtype=np.int64)
    end = np.asarray(t.column("end_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    sent = np.asarray(t.column("sent_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    rows = np.asarray(pc.list_parent_indices(deps), dtype=np.int64)
    dep_req = np.asarray(pc.list_flatten(deps).to_numpy(zero_copy_only=False), dtype=np.int64)
    span_r = int(max(req.max(initial=0), dep_req.max(initial=0))) + 1
    span_c = int(clone.max(initial=0)) + 1
    key = (sess * span_c + clone) * span_r + req
    order = np.argsort(key, kind="stable")
    want = (sess[rows] * span_c + clone[rows]) * span_r + dep_req
    pos = np.minimum(np.searchsorted(key[order], want), len(key) - 1)
    found = key[order][pos] == want
    latest = np.full(t.num_rows, -np.inf)
    np.fmax.at(latest, rows[found], end[order][pos[found]])
    return ~np.isnan(sent) & (sent < latest)


def _sessions(t: pa.Table) -> pa.Table:
    """Per (session_id, clone): requests, session TPS = sum(N - k_1) / sum(decode time) over
    its ok requests with exact tokens per chunk (NaN when it has none),
    wall time (first intended send to last byte), time waiting on the engine (sum of
    intended send to last byte), think time (sum of intended think)."""
    if t.num_rows == 0:
        return pa.table({"session_id": pa.array([], pa.string())})
    ok = t.column("ok").to_numpy(zero_copy_only=False).astype(bool)
    decode = np.nan_to_num(
        np.asarray(t.column("decode").to_numpy(zero_copy_only=False), dtype=np.float64)
    )
    dec_tok = np.asarray(t.column("decode_tokens").to_numpy(zero_copy_only=False), dtype=np.float64)
    end = np.asarray(t.column("end_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    intended = np.asarray(t.column("intended_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    exact = t.column("exact").to_numpy(zero_copy_only=False).astype(bool)
    useful = ok & exact & (dec_tok >= 1)
    g = (
        pa.table(
            {
                "session_id": t.column("session_id"),
                "clone": t.column("clone"),
                "ok": pa.array(ok.astype(np.int64)),
                "failed": pa.array((~ok).astype(np.int64)),
                "decode_ns": pa.array(np.where(useful, decode, 0.0)),
                "decode_tokens": pa.array(np.where(useful, dec_tok, 0.0)),
                "start_ns": pa.array(intended),
                "end_ns": pa.array(end, mask=np.isnan(end)),
                "wait_ns": pa.array(np.nan_to_num(end - intended)),
                "think_ns": pa.array(
                    np.nan_to_num(
                        np.asarray(
                            t.column("think_ns").to_numpy(zero_copy_only=False), dtype=np.float64
                        )
                    )
                ),
            }
        )
        .group_by(["session_id", "clone"])
        .aggregate(
            [
                ("ok", "sum"),
                ("failed", "sum"),
                ("decode_ns", "sum"),
                ("decode_tokens", "sum"),
                ("start_ns", "min"),
                ("end_ns", "max"),
                ("wait_ns", "sum"),
                ("think_ns", "sum"),
            ]
        )
    )
    dns = np.asarray(g.column("decode_ns_sum").to_numpy(), dtype=np.float64)
    dtk = np.asarray(g.column("decode_tokens_sum").to_numpy(), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tps = np.where(dns > 0, dtk * NS / dns, np.nan)
    wall = pc.subtract(g.column("end_ns_max"), g.column("start_ns_min"))
    return pa.table(
        {
            "session_id": g.column("session_id"),
            "clone": g.column("clone"),
            "requests_ok": g.column("ok_sum"),
            "requests_failed": g.column("failed_sum"),
            "session_tps": pa.array(tps),
            "wall_ns": wall,
            "wait_ns": g.column("wait_ns_sum"),
            "think_ns": g.column("think_ns_sum"),
        }
    ).sort_by([("session_id", "ascending"), ("clone", "ascending")])


def _empty_table() -> pa.Table:
    acc = Accumulator()
    acc.add(REQUEST_SCHEMA.empty_table())
    return acc.parts[0]


def accumulate(batches: Iterable[pa.RecordBatch | pa.Table]) -> Accumulator:
    acc = Accumulator()
    for b in batches:
        acc.add(b)
    return acc
