"""Live statistics of a run, for the dashboard, computed away from the measuring loop.

``LiveStats`` is pure (no clock, no I/O). ``observe_request`` appends a few integers and a
reference to the request's chunk arrays (no per-chunk Python work for ``array.array`` or numpy
arrays); the metric arithmetic runs vectorized over what is pending once ``FLUSH_CHUNKS``
chunks have accumulated and when a snapshot is taken (``encode``). Snapshots are compact bytes
(JSON with HdrHistogram V2 payloads) that merge exactly across workers.

Where it runs: a local run's dashboard process reads the workers' part files as they appear
(``PartsFeed``, ``observe_table``) while the run sends it only progress and loop-lag samples;
a Ray actor reads its own part files on its method thread. Nothing here runs in a measuring
process's hot path: feeding it from a thread of a worker process cost the loop the GIL (with
2 and 4 workers at 61k chunks/s each, schedule-lag p99 was 2.3-3.6 ms with it, 0.5-0.75 ms
without).

Histograms (integer ns): ``ttft``, ``tpot``, ``itl`` (per token), ``chunk_gap``, ``e2e``,
``schedule_lag`` and ``loop_lag`` (the load generator's own lag, from ``observe_lag``).
Request TPS is derived from TPOT (P90 TPS = 1 / P90 TPOT, docs/metrics.md). Requests with
inexact tokens per chunk (error_kind ``inexact``) are counted in ``inexact`` and feed TTFT,
E2E, chunk gap and throughput (from their usage's ``completion_tokens`` when the row has
it), never TPOT, ITL or tokens per chunk.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq  # at import, not at the first part file (mid-run)

from agent_replay.analysis.counters import Counters, add, keyed, keyed_lists, largest
from agent_replay.analysis.definitions import LIVE, METRICS, Inputs
from agent_replay.analysis.fold import fold_chunks
from agent_replay.analysis.hist import Hist
from agent_replay.analysis.metrics import Lists, request_metrics
from agent_replay.results_schema import INEXACT, ErrorKind

PART_COLUMNS = (
    "status",
    "error_kind",
    "warmup",
    "intended_ns",
    "sent_ns",
    "connect_ns",
    "first_token_ns",
    "end_ns",
    "chunk_ns",
    "chunk_tokens",
    "completion_tokens",
)
"""The results columns ``observe_table`` reads."""
HIST_NAMES = (*LIVE, "loop_lag")
"""The definitions table's ``live`` entries (``analysis.definitions``) and the loop lag."""
LIVE_REQUEST = tuple(m for m in METRICS if m.live and m.per == "request" and m.rows != "all")
"""The live per-request entries over ok rows, computed by their own formulas; the ``all``-rows
one (schedule lag) comes from ``observe_lag``, the per-token ones from ``fold_chunks``."""
FLUSH_CHUNKS = 8_192
"""Pending chunks that trigger a flush (~100 requests; bounds the work of one flush)."""
SNAPSHOT_VERSION = 1


class LiveStats(Counters):
    """Running counters and histograms of one worker (or of several, merged)."""

    MERGES = {
        "ok": add,
        "failed": add,
        "warmup": add,
        "inexact": add,
        "output_tokens": add,
        "early_sends": add,
        "errors": keyed,
        "tokens_per_chunk": keyed,
        "throughput": keyed_lists,
        "done": add,
        "total": add,
        "in_flight": add,
        "active_sessions": add,
        "elapsed_ns": largest,
        "cpu_percent": add,
    }
    """How two workers' stats merge (``analysis.counters``): progress counts add up,
    elapsed is the longest, CPU keeps one entry per worker."""

    def __init__(self, bucket_ns: int = 1_000_000_000) -> None:
        self.bucket_ns = bucket_ns
        self.hists: dict[str, Hist] = {name: Hist() for name in HIST_NAMES}
        self.ok = 0
        self.failed = 0
        self.warmup = 0
        self.inexact = 0  # ok requests whose tokens per chunk are not exact
        self.output_tokens = 0
        self.early_sends = 0
        self.errors: dict[str, int] = {}
        self.tokens_per_chunk: dict[int, int] = {}
        # bucket index (end_ns // bucket_ns) -> [output tokens, completed requests]
        self.throughput: dict[int, list[int]] = {}
        self.done = 0
        self.total = 0
        self.in_flight = 0
        self.active_sessions = 0
        self.elapsed_ns = 0
        self.cpu_percent: list[float] = []
        # pending per-request values of ok rows, flushed vectorized
        self._intended: list[int] = []
        self._sent: list[int] = []
        self._connect: list[int | None] = []
        self._first: list[int | None] = []
        self._end: list[int] = []
        self._c: list[Sequence[int]] = []  # each pending request's chunk_ns
        self._k: list[Sequence[int]] = []  # and chunk_tokens
        self._m: list[int] = []
        self._x: list[bool] = []  # tokens per chunk exact
        self._u: list[int] = []  # output tokens from the usage of an inexact row (-1: none)
        self._pending_chunks = 0

    # -- hot path ----------------------------------------------------------------------
    def observe_request(self, row: Mapping[str, Any]) -> None:
        """Count one finished request (REQUEST_SCHEMA field names, Python values)."""
        if row.get("warmup"):
            self.warmup += 1
            return
        if row.get("status") != "ok":
            self.failed += 1
            kind = row.get("error_kind") or ErrorKind.UNKNOWN
            self.errors[kind] = self.errors.get(kind, 0) + 1
            return
        self.ok += 1
        sent, end = row.get("sent_ns"), row.get("end_ns")
        if sent is None or end is None:
            return
        chunks: Sequence[int] = _seq(row.get("chunk_ns"))
        toks: Sequence[int] = _seq(row.get("chunk_tokens"))
        m = len(chunks)
        if m != len(toks):
            return  # a malformed row: its chunks cannot be attributed
        self._intended.append(row.get("intended_ns") or 0)
        self._sent.append(sent)
        self._connect.append(row.get("connect_ns"))
        self._first.append(row.get("first_token_ns"))
        self._end.append(end)
        if m:  # kept by reference: a finished request's arrays do not change
            self._c.append(chunks)
            self._k.append(toks)
        self._m.append(m)
        if row.get("error_kind") == INEXACT:
            self.inexact += 1
            self._x.append(False)
            usage = row.get("completion_tokens")
            self._u.append(-1 if usage is None else int(usage))
        else:
            self._x.append(True)
            self._u.append(-1)
        self._pending_chunks += m
        if self._pending_chunks > FLUSH_CHUNKS:
            self.flush()

    def observe_table(self, table: Any) -> None:
        """Count every row of a results part file (a ``pyarrow.Table`` with ``PART_COLUMNS``,
        times relative to the run's t0), its schedule lag too (warm-up rows excepted)."""
        cols = {
            name: table.column(name).to_pylist()
            for name in PART_COLUMNS
            if name not in ("chunk_ns", "chunk_tokens")
        }
        lists = {}
        for name in ("chunk_ns", "chunk_tokens"):
            arr = table.column(name).combine_chunks()
            values = arr.flatten().to_numpy(zero_copy_only=False)
            # offsets relative to the flattened values (a sliced array's first offset is not 0)
            off = arr.offsets.to_numpy(zero_copy_only=False)
            lists[name] = (values, off - off[0])
        (cns, coff), (tks, toff) = lists["chunk_ns"], lists["chunk_tokens"]
        for i in range(table.num_rows):
            row = {name: col[i] for name, col in cols.items()}
            row["chunk_ns"] = cns[coff[i] : coff[i + 1]]
            row["chunk_tokens"] = tks[toff[i] : toff[i + 1]]
            self.observe_request(row)
            if row["sent_ns"] is not None and row["intended_ns"] is not None and not row["warmup"]:
                self.observe_lag(row["sent_ns"] - row["intended_ns"], None)

    def observe_lag(self, schedule_lag_ns: int | None, loop_lag_ns: int | None) -> None:
        """The load generator's own lag: how late a send woke up (negative: early, counted
        and recorded as 0) and the event-loop lag probe."""
        if schedule_lag_ns is not None:
            if schedule_lag_ns < 0:
                self.early_sends += 1
                schedule_lag_ns = 0
            self.hists["schedule_lag"].record(schedule_lag_ns)
        if loop_lag_ns is not None:
            self.hists["loop_lag"].record(max(0, loop_lag_ns))

    def observe_loop_lags(self, lags_ns: Sequence[int]) -> None:
        """Many loop-lag probe samples at once (vectorized; negative ones count as 0)."""
        if len(lags_ns):
            self.hists["loop_lag"].record_many(np.maximum(np.asarray(lags_ns, dtype=np.int64), 0))

    def set_progress(
        self,
        done: int,
        total: int,
        in_flight_requests: int,
        active_sessions: int,
        elapsed_ns: int,
        cpu_percent: float,
    ) -> None:
        self.done, self.total = done, total
        self.in_flight, self.active_sessions = in_flight_requests, active_sessions
        self.elapsed_ns = elapsed_ns
        self.cpu_percent = [float(cpu_percent)]

    # -- vectorized part ---------------------------------------------------------------
    def flush(self) -> None:
        """Move pending rows into the histograms and counters."""
        if not self._sent:
            return
        end = np.asarray(self._end, dtype=np.int64)
        m = np.asarray(self._m, dtype=np.int64)
        offsets = np.zeros(m.size + 1, dtype=np.int64)
        np.cumsum(m, out=offsets[1:])
        total = int(offsets[-1])
        c = Lists(_flat(self._c, total), offsets)
        k = Lists(_flat(self._k, total), offsets)
        exact = np.asarray(self._x, dtype=bool)
        usage = np.asarray(self._u, dtype=np.int64)
        batch = pa.RecordBatch.from_pydict(
            {
                "intended_ns": pa.array(self._intended, pa.int64()),
                "sent_ns": pa.array(self._sent, pa.int64()),
                "connect_ns": pa.array(self._connect, pa.int64()),
                "first_token_ns": pa.array(self._first, pa.int64()),
                "end_ns": end,
            }
        )
        self._intended, self._sent, self._connect, self._first, self._end = [], [], [], [], []
        self._c, self._k, self._m, self._x, self._u = [], [], [], [], []
        self._pending_chunks = 0

        # every live per-request metric by its formula in the definitions table, over the
        # rows the table names (TPOT, exact tokens per chunk only), rounded to integer ns
        x = Inputs(batch, c, k, request_metrics(batch, c, k))
        for d in LIVE_REQUEST:
            assert d.formula is not None
            v = d.formula(x)
            keep = ~np.isnan(v)
            if d.rows == "ok_exact":
                keep &= exact
            self.hists[d.key].record_many(np.rint(v[keep]).astype(np.int64))
        n_out = np.asarray(x.m.output_tokens, dtype=np.int64)
        if k.values.size:
            tpc = fold_chunks(
                c,
                k,
                None,
                self.hists["itl"],
                self.hists["chunk_gap"],
                exact=None if exact.all() else exact,
            )
            for tokens, n in enumerate(tpc.tolist()):
                if n:
                    self.tokens_per_chunk[tokens] = self.tokens_per_chunk.get(tokens, 0) + n
        n_out = np.where(usage >= 0, usage, n_out)
        self.output_tokens += int(n_out.sum())
        bucket = end // self.bucket_ns
        keys, inv = np.unique(bucket, return_inverse=True)
        tok = np.bincount(inv, weights=n_out, minlength=keys.size)
        req = np.bincount(inv, minlength=keys.size)
        for key, t, r in zip(keys.tolist(), tok.tolist(), req.tolist(), strict=True):
            slot = self.throughput.setdefault(key, [0, 0])
            slot[0] += int(t)
            slot[1] += int(r)

    # -- merge and wire ----------------------------------------------------------------
    def merge(self, other: LiveStats) -> None:
        """Add ``other`` (another worker's stats) into this one. Progress counts add up;
        elapsed is the longest; CPU keeps one entry per worker."""
        self.flush()
        other.flush()
        if other.bucket_ns != self.bucket_ns:
            raise ValueError("cannot merge live stats with different throughput buckets")
        for name, h in other.hists.items():
            self.hists[name].merge(h)
        self.merge_counts(other)

    def encode(self) -> bytes:
        """A compact snapshot (flushes pending rows first)."""
        self.flush()
        return orjson.dumps(
            {
                "v": SNAPSHOT_VERSION,
                "bucket_ns": self.bucket_ns,
                "hists": {
                    n: [h.encode(), h.dropped]
                    for n, h in self.hists.items()
                    if h.count or h.dropped
                },
                "counts": [self.ok, self.failed, self.warmup, self.output_tokens, self.early_sends],
                "errors": self.errors,
                "inexact": self.inexact,
                "tpc": [[k, n] for k, n in self.tokens_per_chunk.items()],
                "tput": [[b, t, r] for b, (t, r) in self.throughput.items()],
                "progress": [
                    self.done,
                    self.total,
                    self.in_flight,
                    self.active_sessions,
                    self.elapsed_ns,
                ],
                "cpu": self.cpu_percent,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> LiveStats:
        d = orjson.loads(data)
        if d.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported live snapshot version {d.get('v')!r}")
        st = cls(bucket_ns=int(d["bucket_ns"]))
        for name, (enc, dropped) in d["hists"].items():
            st.hists[name] = Hist.decode(enc, int(dropped))
        st.ok, st.failed, st.warmup, st.output_tokens, st.early_sends = d["counts"]
        st.errors = {str(k): int(v) for k, v in d["errors"].items()}
        st.inexact = int(d.get("inexact", 0))
        st.tokens_per_chunk = {int(k): int(n) for k, n in d["tpc"]}
        st.throughput = {int(b): [int(t), int(r)] for b, t, r in d["tput"]}
        st.done, st.total, st.in_flight, st.active_sessions, st.elapsed_ns = d["progress"]
        st.cpu_percent = [float(x) for x in d["cpu"]]
        return st

    # -- read side ---------------------------------------------------------------------
    def throughput_series(
        self, last: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bucket start in ns, output tokens/s, requests/s) per bucket, gaps filled with 0."""
        self.flush()
        if not self.throughput:
            z = np.zeros(0, dtype=np.float64)
            return z, z, z
        lo, hi = min(self.throughput), max(self.throughput)
        if last is not None:
            lo = max(lo, hi - last + 1)
        keys = np.arange(lo, hi + 1)
        tok = np.array([self.throughput.get(int(b), [0, 0])[0] for b in keys], dtype=np.float64)
        req = np.array([self.throughput.get(int(b), [0, 0])[1] for b in keys], dtype=np.float64)
        scale = 1e9 / self.bucket_ns
        return keys * float(self.bucket_ns), tok * scale, req * scale


class PartsFeed:
    """Reads a results folder's part files as they appear (``requests/part-*.parquet``; a
    part is renamed into place only once complete) into a ``LiveStats``: the statistics of
    a run computed in another process than the one measuring it."""

    def __init__(self, folder: str | Path, stats: LiveStats | None = None) -> None:
        self.dir = Path(folder) / "requests"
        self.stats = stats if stats is not None else LiveStats()
        self._seen: set[str] = set()
        self.errors = 0

    def poll(self) -> int:
        """Read the part files not read yet; returns how many. A part that cannot be read
        (removed meanwhile, damaged) is skipped and counted in ``errors``."""
        try:
            names = sorted(
                n
                for n in os.listdir(self.dir)
                if n.startswith("part-") and n.endswith(".parquet") and n not in self._seen
            )
        except OSError:
            return 0
        for name in names:
            self._seen.add(name)
            try:
                table = pq.read_table(self.dir / name, columns=list(PART_COLUMNS))
            except (OSError, ValueError, KeyError):
                self.errors += 1
                continue
            self.stats.observe_table(table)
        return len(names)


def _seq(value: Any) -> Sequence[int]:
    """A row's list cell: None is empty (``or ()`` would reject numpy arrays)."""
    return () if value is None else value


def _flat(parts: list[Sequence[int]], total: int) -> np.ndarray:
    """The concatenation of ``parts`` as int64: one memory copy when they are arrays of one
    machine type (``array.array`` or numpy), one conversion pass otherwise."""
    if not parts:
        return np.zeros(0, dtype=np.int64)
    first = parts[0]
    if isinstance(first, array) and all(
        isinstance(p, array) and p.typecode == first.typecode for p in parts
    ):
        buffers = cast("list[array[int]]", parts)
        return np.frombuffer(b"".join(buffers), dtype=np.dtype(first.typecode)).astype(np.int64)
    if isinstance(first, np.ndarray):
        return np.concatenate([np.asarray(p) for p in parts]).astype(np.int64, copy=False)
    return np.fromiter(chain.from_iterable(parts), dtype=np.int64, count=total)
