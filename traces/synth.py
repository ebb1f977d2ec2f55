"""The synthesizer: agent-like sessions for load beyond what was recorded.

A session is a chain of turns. Turn 0's prompt is a shared system prompt plus a first
user message; every later prompt extends the previous one by the previous output and a
new part (tool results, user text), so hash ids share the session's prefix exactly like
a real agent conversation. Think time separates a turn's end from the next arrival; turn
ends are nominal (``end_ns`` from a simple prefill + decode model) since the real ones
depend on the server a replay targets.

Distributions are either built-in lognormals or empirical ones fitted to any trace
(``fit``). Everything is vectorized numpy: a million requests take seconds. Seeded with
``numpy.random.default_rng(seed)``, so a seed gives the same trace on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from agent_replay.traces.io import conform
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.stats import session_codes

PARTIAL_ID_BASE = 1 << 62
"""Ids of partial last blocks (unique per request) live above this; full blocks below."""


@dataclass
class Dist:
    """Either a lognormal (median, sigma) clipped to [lo, hi], or empirical samples."""

    median: float = 1.0
    sigma: float = 0.0
    lo: float = 0.0
    hi: float = float("inf")
    samples: np.ndarray | None = None

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.samples is not None and self.samples.size:
            v = rng.choice(self.samples, size=n).astype(np.float64)
        else:
            v = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(v, self.lo, self.hi)


@dataclass
class SynthModel:
    turns: Dist = field(default_factory=lambda: Dist(8, 0.7, 1, 60))
    first_input: Dist = field(default_factory=lambda: Dist(1500, 0.5, 16, 32_000))
    growth: Dist = field(default_factory=lambda: Dist(300, 1.0, 0, 16_000))
    output: Dist = field(default_factory=lambda: Dist(150, 0.8, 1, 4_000))
    think_s: Dist = field(default_factory=lambda: Dist(1.5, 1.2, 0.0, 600))
    system_prompt_tokens: int = 0
    """Tokens of a system prompt every session starts with (shared across sessions)."""
    max_input: int = 128_000
    session_rate: float = 1.0
    """New sessions per second (Poisson)."""
    prefill_tok_s: float = 10_000.0
    decode_tok_s: float = 50.0


@dataclass(frozen=True)
class SynthConfig:
    sessions: int = 8
    seed: int = 0
    block_size: int = 64
    rate: float | None = None
    """Sessions per second; default: the model's."""
    duration_s: float | None = None
    """Drop requests arriving after this many seconds."""
    model_name: str | None = None


def fit(table: pa.Table) -> SynthModel:
    """Empirical distributions from a trace: turns per session, first prompt, per-turn
    growth (prompt minus the parent's prompt and output), outputs, think times and the
    session start rate."""
    codes, n_sess = session_codes(table)
    ins = table.column("input_tokens").to_numpy().astype(np.float64)
    outs = table.column("output_tokens").to_numpy().astype(np.float64)
    req = table.column("request_index").to_numpy()
    parent = table.column("parent_index").to_numpy()
    arrival = table.column("arrival_ns").to_numpy()
    m = SynthModel()
    m.turns = Dist(samples=np.bincount(codes, minlength=n_sess).astype(np.float64), lo=1)
    first = req == 0
    m.first_input = Dist(samples=ins[first] if first.any() else ins, lo=1)
    m.output = Dist(samples=outs, lo=1)
    # growth: a row's input minus its parent's input and output
    key = (codes.astype(np.int64) << 32) | req.astype(np.int64)
    order = np.argsort(key)
    has_p = np.flatnonzero(parent >= 0)
    if has_p.size:
        pos = np.searchsorted(key[order], (codes[has_p].astype(np.int64) << 32) | parent[has_p])
        pos = np.minimum(pos, len(order) - 1)
        prow = order[pos]
        g = ins[has_p] - ins[prow] - outs[prow]
        m.growth = Dist(samples=np.clip(g, 0, None), lo=0)
    think = table.column("think_ns")
    if think.null_count < table.num_rows:
        m.think_s = Dist(samples=think.drop_null().to_numpy() / 1e9, lo=0)
    m.max_input = int(ins.max()) if ins.size else m.max_input
    starts = np.zeros(n_sess)
    np.minimum.at(starts, codes, 0)
    first_arr = np.full(n_sess, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_arr, codes, arrival)
    span = (first_arr.max() - first_arr.min()) / 1e9 if n_sess > 1 else 0.0
    if span > 0:
        m.session_rate = (n_sess - 1) / span
    return m


def _segment_cumsum_exclusive(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """Per segment, the sum of the earlier values of that segment."""
    c = np.cumsum(values) - values
    return c - np.repeat(c[starts], lengths)


def synthesize(model: SynthModel, cfg: SynthConfig) -> tuple[pa.Table, TraceMeta]:
    rng = np.random.default_rng(cfg.seed)
    bs = cfg.block_size
    n_s = cfg.sessions
    rate = cfg.rate or model.session_rate
    starts_s = np.cumsum(rng.exponential(1.0 / rate, n_s)) - rng.exponential(1.0 / rate)
    starts_s = np.maximum(starts_s - starts_s.min(), 0.0) if n_s else starts_s
    turns = np.maximum(model.turns.draw(rng, n_s).round().astype(np.int64), 1)
    n = int(turns.sum())
    sess = np.repeat(np.arange(n_s, dtype=np.int64), turns)
    seg_start = np.concatenate(([0], np.cumsum(turns)[:-1])).astype(np.int64)
    idx = np.arange(n, dtype=np.int64) - np.repeat(seg_start, turns)

    out = model.output.draw(rng, n).round().astype(np.int64)
    growth = model.growth.draw(rng, n).round().astype(np.int64)
    first = np.maximum(
        model.first_input.draw(rng, n_s).round().astype(np.int64), model.system_prompt_tokens + 1
    )
    add = np.where(idx == 0, np.repeat(first, turns), growth)
    prev_out = np.concatenate(([0], out[:-1]))
    add = add + np.where(idx == 0, 0, prev_out)
    ins = np.cumsum(add) - np.repeat((np.cumsum(add) - add)[seg_start], turns)
    think = (model.think_s.draw(rng, n) * 1e9).astype(np.int64)
    think[idx == 0] = 0
    service = ((ins / model.prefill_tok_s + out / model.decode_tok_s) * 1e9).astype(np.int64)
    prev_service = np.concatenate(([0], service[:-1]))
    step = np.where(idx == 0, 0, prev_service + think)
    arrival = (
        np.repeat((starts_s * 1e9).astype(np.int64), turns)
        + _segment_cumsum_exclusive(step, seg_start, turns)
        + step
    )

    keep = ins <= model.max_input
    if cfg.duration_s is not None:
        keep &= arrival <= int(cfg.duration_s * 1e9)
    # a session stops at its first dropped turn (its later turns would have no parent)
    dropped_before = _segment_cumsum_exclusive((~keep).astype(np.int64), seg_start, turns)
    keep &= dropped_before == 0

    # hash ids: full block k of session s -> a stable id; shared system-prompt blocks are
    # the same in every session; a partial last block gets an id of its own
    sys_blocks = model.system_prompt_tokens // bs
    full = ins // bs
    n_blocks = -(-ins // bs)
    lengths = np.where(keep, n_blocks, 0)
    total = int(lengths.sum())
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    offs = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    k = np.arange(total, dtype=np.int64) - np.repeat(offs, lengths)
    salt = np.int64(cfg.seed % 1000) << np.int64(50)
    ids = np.where(k < sys_blocks, k, salt + (sess[row_of] << 24) + k + 1_000_000)
    ids = np.where(k >= full[row_of], PARTIAL_ID_BASE + salt + row_of, ids)

    sel = np.flatnonzero(keep)
    new_offsets = np.concatenate(([0], np.cumsum(lengths[sel]))).astype(np.int32)
    if total >= 2**31:
        raise ValueError("too many hash ids for one table; synthesize in parts")
    hash_col = pa.ListArray.from_arrays(pa.array(new_offsets), pa.array(ids, pa.int64()))
    sess_dict = pa.array([f"syn-{i}" for i in range(n_s)], pa.string())
    m = len(sel)
    table = pa.table(
        {
            "session_id": pa.DictionaryArray.from_arrays(
                pa.array(sess[sel], pa.int32()), sess_dict
            ),
            "request_index": pa.array(idx[sel], pa.int32()),
            "parent_index": pa.array(np.where(idx[sel] == 0, -1, idx[sel] - 1), pa.int32()),
            "arrival_ns": pa.array(arrival[sel], pa.int64()),
            "think_ns": pa.array(think[sel], pa.int64(), mask=idx[sel] == 0),
            "input_tokens": pa.array(ins[sel], pa.int32()),
            "output_tokens": pa.array(out[sel], pa.int32()),
            "hash_ids": hash_col,
            "api": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(m, np.int32)), pa.array(["completions"])
            ),
            "model": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(m, np.int32), mask=np.full(m, cfg.model_name is None)),
                pa.array([cfg.model_name or ""]),
            ),
            "end_ns": pa.array(service[sel], pa.int64()),
        }
    )
    order = np.argsort(arrival[sel], kind="stable")
    table = conform(table.take(pa.array(order)))
    meta = TraceMeta(
        block_size=bs,
        source="synthetic",
        extra={
            "synth": {"seed": cfg.seed, "sessions": n_s, "rate": rate, "duration_s": cfg.duration_s}
        },
    )
    return table, meta
