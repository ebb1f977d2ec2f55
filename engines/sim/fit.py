"""Fit the simulated engine's performance model to real runs (``agent-replay engines sim-fit``).

Inputs are results folders of real replays: the per-request rows (send time, first token,
every chunk's receive time and token count, prompt and prefix-hit tokens) and the server's
/metrics series (spec-decode counters). The model is the one of docs/sim-engine.md, a few
terms per phase:

- decode step: ``T = decode_base_ns + decode_per_seq_ns * B * (1 + k) + decode_per_ctx_token_ns * C``
  fitted by least squares on *clean* inter-chunk gaps: gaps during which no request of the
  run was in its prefill (between its send and its first token), so that the step held
  decodes only. B = requests decoding over the gap, C = their prompt tokens (generated
  tokens are left out of C: they are a few percent of an agent's context).
  With speculative decoding a chunk carries one step's tokens; without it a chunk of n > 1
  tokens is n steps merged by one network read and its gap is left out.
- prefill inside the step: ``prefill_base_ns * chunks + prefill_per_ctx_token_ns * context
  + new / prefill_tokens_per_s``, fitted on *prefill* gaps: a decoding request's gap that
  held exactly one other request's whole prefill, less T(B, C).
- the front end: ``frontend_base_ns + frontend_per_prompt_token_ns * prompt``, fitted on
  what the TTFT of a request whose prefill overlapped no other's leaves after its steps
  (T(B, C) and the in-step prefill each, plus half a step of wait when the engine was
  busy). With too few prefill gaps (one user: nothing decodes beside a prefill) the new
  tokens' cost and the context term are fitted here instead, and the in-step base is 0.
  ``new`` = prompt - prefix hit (``engines.sim.predict.prefix_hits``: the recorded hit, else
  the session's previous prompt; a session's first request without either is cached whole
  or cold by ``engines.sim.predict.cache_split`` over those requests of all the runs, a
  value the profile keeps for its predictions).
- speculative decoding: per-position conditional acceptance from the deltas of
  ``vllm:spec_decode_num_accepted_tokens_per_pos`` over ``vllm:spec_decode_num_drafts``.

Each term's interval is a 95% bootstrap over runs (runs resampled with replacement, the
pooled least squares refitted), so it shows how much the fit moves from run to run, not the
(far too narrow) per-sample standard error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from agent_replay.engines.sim.predict import cache_split, prefix_hits, unrecorded_starts
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.engines.sim.server_cache import earlier_runs, served_prompts
from agent_replay.errors import InputError

BOOTSTRAP = 400
SEED = 7
DECODE_TERMS = ("decode_base_ns", "decode_per_seq_ns", "decode_per_ctx_token_ns")
DECODE_UNITS = ("ns", "ns per sequence-token", "ns per context token")
STEP_PREFILL_TERMS = ("prefill_base_ns", "prefill_per_ctx_token_ns", "prefill_ns_per_token")
STEP_PREFILL_UNITS = ("ns per prefill chunk", "ns per context token of a chunk", "ns per new token")
FRONTEND_TERMS = ("frontend_base_ns", "frontend_per_prompt_token_ns")
FRONTEND_UNITS = ("ns", "ns per prompt token")
MIN_PREFILL_GAPS = 30


def chunk_context(
    cached: np.ndarray, new: np.ndarray, budget: int, full_chunk: int = 0
) -> np.ndarray:
    """Sum over a prefill's chunks of the context at each chunk's end: chunk j (of
    ceil(new / budget)) ends at cached + min(j * budget, new); a chunk of q < ``full_chunk``
    tokens counts q / ``full_chunk`` of it (``SimProfile.chunk_context``)."""
    steps = np.maximum(1, np.ceil(new / budget)).astype(np.int64)
    full = steps - 1  # chunks of exactly ``budget`` tokens before the last
    before = full * cached + budget * full * (full + 1) / 2
    last = new - full * budget
    weight = np.minimum(1.0, last / full_chunk) if full_chunk > 0 else 1.0
    if full_chunk > budget:
        before = before * budget / full_chunk
    return before + (cached + new) * weight


@dataclass(frozen=True)
class Run:
    """One results folder: its rows as arrays (successful streamed requests only)."""

    folder: str
    meta: dict[str, Any]
    sent: np.ndarray
    first: np.ndarray
    end: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    completion: np.ndarray
    chunk_ns: list[np.ndarray]
    chunk_tokens: list[np.ndarray]
    spec: tuple[float, list[float]] | None
    """(drafts, accepted per position) counted over the run, when the server had speculation."""

    @property
    def new(self) -> np.ndarray:
        return self.prompt - self.cached


def read_rows(folder: str | Path) -> tuple[dict[str, Any], Any]:
    """A results folder's run.json and request rows (a pyarrow table); InputError naming the
    folder when unusable."""
    folder = Path(folder)
    meta_path = folder / "run.json"
    if not meta_path.is_file():
        raise InputError(f"{folder}: not a results folder (no run.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{meta_path}: invalid JSON: {exc}") from exc
    req_dir = folder / "requests"
    if not req_dir.is_dir():
        raise InputError(f"{folder}: no requests/ folder")
    cols = [
        "session_id",
        "clone",
        "request_index",
        "status",
        "sent_ns",
        "connect_ns",
        "first_token_ns",
        "end_ns",
        "prompt_tokens",
        "cached_tokens",
        "implied_cached_tokens",
        "completion_tokens",
        "chunk_ns",
        "chunk_tokens",
    ]
    try:
        return meta, pq.read_table(req_dir, columns=cols)
    except Exception as exc:  # pyarrow raises several types for a broken file
        raise InputError(f"{req_dir}: cannot read the request rows: {exc}") from exc


def read_run(folder: str | Path, cached_below_ns_per_token: float | None = None) -> Run:
    """A results folder's rows and counters (``prefix_hits`` with what the server served
    before the run, ``server_cache.served_prompts``, else the cache split given)."""
    meta, table = read_rows(folder)
    all_rows = table.to_pylist()
    rows = table.to_pydict()
    hits = prefix_hits(all_rows, cached_below_ns_per_token, served_prompts(folder))
    keep = [
        i
        for i, s in enumerate(rows["status"])
        if s == "ok"
        and rows["first_token_ns"][i] is not None
        and rows["chunk_ns"][i]
        and rows["prompt_tokens"][i] is not None
        and rows["sent_ns"][i] is not None
    ]

    def arr(name: str, idx: list[int] = keep) -> np.ndarray:
        return np.array([rows[name][i] or 0 for i in idx], dtype=np.int64)

    cached = np.array([hits[i] for i in keep], dtype=np.int64)
    return Run(
        folder=str(folder),
        meta=meta,
        sent=arr("sent_ns") + arr("connect_ns"),
        first=arr("first_token_ns"),
        end=arr("end_ns"),
        prompt=arr("prompt_tokens"),
        cached=cached,
        completion=arr("completion_tokens"),
        chunk_ns=[np.array(rows["chunk_ns"][i], dtype=np.int64) for i in keep],
        chunk_tokens=[np.array(rows["chunk_tokens"][i], dtype=np.int64) for i in keep],
        spec=_spec_counts(Path(folder) / "server_metrics.parquet"),
    )


def fit_cache_split(folders: list[str | Path]) -> float | None:
    """``predict.cache_split`` over the first requests without a recorded hit of the runs
    whose server's earlier runs are unknown (``server_cache.earlier_runs``)."""
    return cache_split(
        [
            v
            for f in folders
            if earlier_runs(f) is None
            for v in unrecorded_starts(read_rows(f)[1].to_pylist())
        ]
    )


def cache_config(folder: str | Path) -> dict[str, int]:
    """The server's KV cache from ``vllm:cache_config_info`` (``num_gpu_blocks``,
    ``block_size``) in the run's /metrics series; empty when it was not scraped."""
    path = Path(folder) / "server_metrics.parquet"
    if not path.is_file():
        return {}
    t = pq.read_table(path, columns=["name", "labels"]).to_pydict()
    for name, labels in zip(t["name"], t["labels"], strict=True):
        if name == "vllm:cache_config_info":
            lab = json.loads(labels)
            try:
                return {
                    "num_gpu_blocks": int(lab["num_gpu_blocks"]),
                    "block_size": int(lab["block_size"]),
                }
            except (KeyError, ValueError):
                return {}
    return {}


def _spec_counts(path: Path) -> tuple[float, list[float]] | None:
    """Drafts and accepted tokens per position counted over the run (last - first scrape)."""
    if not path.is_file():
        return None
    t = pq.read_table(path, columns=["t_ns", "name", "labels", "value"]).to_pydict()
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for t_ns, name, labels, value in zip(
        t["t_ns"], t["name"], t["labels"], t["value"], strict=True
    ):
        if name.startswith("vllm:spec_decode_num_"):
            pos = json.loads(labels).get("position", "")
            series.setdefault((name, pos), []).append((t_ns, value))
    if not series:
        return None

    def delta(name: str, pos: str = "") -> float:
        pts = sorted(series.get((name, pos), []))
        return pts[-1][1] - pts[0][1] if pts else 0.0

    drafts = delta("vllm:spec_decode_num_drafts_total")
    if drafts <= 0:
        return None
    accepted = []
    i = 0
    while ("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i)) in series:
        accepted.append(delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i)))
        i += 1
    return drafts, accepted


# ---- observations ------------------------------------------------------------------------


def _active(
    starts_sorted: np.ndarray, ends_sorted: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """How many intervals [start, end] hold all of [a, b] (start <= a and end >= b), for
    intervals with start <= end: #(start <= a) - #(end < b)."""
    return np.searchsorted(starts_sorted, a, "right") - np.searchsorted(ends_sorted, b, "left")


def gap_samples(run: Run, k: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's inter-chunk gaps, in two kinds.

    Decode gaps (rows gap_ns, B, C): no request of the run was in its prefill (sent, no
    first token yet) during the gap, so the step held decodes only.
    Prefill gaps (rows gap_ns, B, C, prompt, new): exactly one request was in its prefill,
    its first token came at the gap's end and its new tokens fit one step's budget, so the
    step held the B decodes and that whole prefill.

    B = requests decoding over the gap, C = their prompt tokens (generated tokens are left
    out of C: they are a few percent of an agent's context)."""
    order_f = np.argsort(run.first, kind="stable")
    fs = run.first[order_f]
    order_e = np.argsort(run.end, kind="stable")
    es = run.end[order_e]
    ctx_by_end = np.concatenate([[0], np.cumsum(run.prompt[order_e])])
    ctx_by_first = np.concatenate([[0], np.cumsum(run.prompt[order_f])])
    ss = np.sort(run.sent)
    prompt_f, new_f = run.prompt[order_f], run.new[order_f]
    dec, pre = [], []
    for c, n in zip(run.chunk_ns, run.chunk_tokens, strict=True):
        if len(c) < 2:
            continue
        t0, t1 = c[:-1], c[1:]
        gap = t1 - t0
        eps = gap // 4
        a, b = t0 + eps, t1 - eps
        # prefills open in the window: sent by its end, first token after its start
        open_ = np.searchsorted(ss, t1, "right") - np.searchsorted(fs, a, "right")
        ok = (gap > 0) & (n[1:] <= 1 + k)
        if k == 0:
            ok &= n[1:] == 1
        batch = _active(fs, es, a, b)
        ctx = (
            ctx_by_first[np.searchsorted(fs, a, "right")]
            - ctx_by_end[np.searchsorted(es, b, "left")]
        )
        ok &= batch >= 1
        d = ok & (open_ == 0)
        dec.append(np.stack([gap[d], batch[d], ctx[d]], axis=1))
        # the one open prefill ended at this chunk: its first token within eps of t1
        lo = np.searchsorted(fs, a, "right")
        hi = np.searchsorted(fs, t1 + eps, "right")
        one = ok & (open_ == 1) & (hi - lo == 1)
        j = np.minimum(lo, len(fs) - 1)
        one &= new_f[j] + batch * (1 + k) <= budget
        pre.append(
            np.stack([gap[one], batch[one], ctx[one], prompt_f[j][one], new_f[j][one]], axis=1)
        )
    return (
        np.concatenate(dec) if dec else np.zeros((0, 3)),
        np.concatenate(pre) if pre else np.zeros((0, 5)),
    )


def prefill_samples(run: Run) -> np.ndarray:
    """Requests whose prefill overlapped no other's: rows (ttft_ns, prompt, new, B, C) with
    B, C the batch decoding when the request was sent."""
    n = len(run.sent)
    if n == 0:
        return np.zeros((0, 5))
    order = np.argsort(run.sent, kind="stable")
    out = []
    fs = np.sort(run.first)
    es = np.sort(run.end)
    order_e = np.argsort(run.end, kind="stable")
    order_f = np.argsort(run.first, kind="stable")
    ctx_by_end = np.concatenate([[0], np.cumsum(run.prompt[order_e])])
    ctx_by_first = np.concatenate([[0], np.cumsum(run.prompt[order_f])])
    for pos, i in enumerate(order):
        s, f = run.sent[i], run.first[i]
        prev_first = run.first[order[pos - 1]] if pos > 0 else -1
        next_sent = run.sent[order[pos + 1]] if pos + 1 < n else f + 1
        if prev_first > s or next_sent < f:
            continue
        batch = int(_active(fs, es, np.array([s]), np.array([f]))[0])
        ctx = int(
            ctx_by_first[np.searchsorted(fs, s, "right")]
            - ctx_by_end[np.searchsorted(es, f, "left")]
        )
        out.append((f - s, run.prompt[i], run.new[i], batch, ctx))
    return np.array(out, dtype=np.float64).reshape(-1, 5)


# ---- least squares with a bootstrap over runs --------------------------------------------


def _nonneg_lstsq(xtx: np.ndarray, xty: np.ndarray, free: tuple[int, ...] = ()) -> np.ndarray:
    """Least squares from the normal equations, terms outside ``free`` kept >= 0 (a negative
    one is dropped and the rest refitted)."""
    p = len(xty)
    use = list(range(p))
    while True:
        sub = np.ix_(use, use)
        try:
            beta_u = np.linalg.solve(xtx[sub] + 1e-9 * np.eye(len(use)), xty[use])
        except np.linalg.LinAlgError:
            beta_u = np.linalg.lstsq(xtx[sub], xty[use], rcond=None)[0]
        beta = np.zeros(p)
        beta[use] = beta_u
        neg = [j for j in use if j not in free and beta[j] < 0]
        if not neg:
            return beta
        use.remove(min(neg, key=lambda j: beta[j]))


@dataclass(frozen=True)
class Term:
    name: str
    value: float
    low: float
    high: float
    unit: str
    samples: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": _round(self.value),
            "low": _round(self.low),
            "high": _round(self.high),
            "unit": self.unit,
            "samples": self.samples,
        }


def _round(x: float) -> float:
    return float(f"{x:.4g}") if math.isfinite(x) else x


def _fit_terms(
    parts: list[tuple[np.ndarray, np.ndarray]],
    names: tuple[str, ...],
    units: tuple[str, ...],
    *,
    scale: np.ndarray | None = None,
) -> list[Term]:
    """Pooled least squares over runs' (X, y), with a bootstrap over runs for intervals.
    ``scale`` normalises the columns for conditioning."""
    p = len(names)
    sc = np.ones(p) if scale is None else scale
    eqs = [((x / sc).T @ (x / sc), (x / sc).T @ y) for x, y in parts if len(y)]
    if not eqs:
        raise InputError("no usable samples for " + ", ".join(names))
    samples = sum(len(y) for _, y in parts)
    beta = _nonneg_lstsq(sum(a for a, _ in eqs), sum(b for _, b in eqs)) / sc
    rng = np.random.default_rng(SEED)
    boots = []
    for _ in range(BOOTSTRAP if len(eqs) > 1 else 0):
        pick = rng.integers(0, len(eqs), len(eqs))
        boots.append(_nonneg_lstsq(sum(eqs[j][0] for j in pick), sum(eqs[j][1] for j in pick)) / sc)
    terms = []
    for j, name in enumerate(names):
        if boots:
            lo, hi = np.percentile([b[j] for b in boots], [2.5, 97.5])
        else:
            lo = hi = float("nan")
        terms.append(Term(name, float(beta[j]), float(lo), float(hi), units[j], samples))
    return terms


# ---- the fit -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    profile: SimProfile
    terms: dict[str, Term]


def server_flags(command: dict[str, Any] | None) -> dict[str, Any]:
    """The vLLM settings the model reads (``num_speculative_tokens``, ``max_num_seqs``,
    ``max_num_batched_tokens``) from a launch record (``*.command.json``: ``commands[].argv``),
    plus the whole argv under ``argv``."""
    flags: dict[str, Any] = {}
    argv: list[str] = []
    for cmd in (command or {}).get("commands") or []:
        argv += [str(a) for a in cmd.get("argv", [])]
    if argv:
        flags["argv"] = argv
    for i, a in enumerate(argv[:-1]):
        if a == "--speculative-config":
            with_json = json.loads(argv[i + 1])
            flags["num_speculative_tokens"] = int(with_json.get("num_speculative_tokens", 0))
        elif a in ("--max-num-seqs", "--max-num-batched-tokens"):
            flags[a[2:].replace("-", "_")] = int(argv[i + 1])
    return flags


def read_command(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the launch record: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def _fit_decode(samples: list[tuple[np.ndarray, np.ndarray]], k: int) -> list[Term]:
    """T(B, C) on the decode gaps."""
    dparts = []
    for dec, _ in samples:
        x = np.stack([np.ones(len(dec)), dec[:, 1] * (1 + k), dec[:, 2]], axis=1)
        dparts.append((x, dec[:, 0]))
    return _fit_terms(dparts, DECODE_TERMS, DECODE_UNITS, scale=np.array([1.0, 10.0, 1e4]))


def relative(x: np.ndarray, y: np.ndarray, ttft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a least-squares problem weighted so that it minimises the error relative to
    each sample's measured TTFT (TTFTs span 50 ms to 3 s; the error targets are relative),
    in units of a 100 ms TTFT to keep the normal equations' scale."""
    weight = 1e8 / np.maximum(ttft, 1.0)
    return x * weight[:, None], y * weight


def _fit_prefill(
    runs: list[Run],
    samples: list[tuple[np.ndarray, np.ndarray]],
    d: dict[str, float],
    k: int,
    budget: int,
    full_chunk: int = 0,
) -> list[Term]:
    """The in-step prefill terms on the prefill gaps (when there are enough), then the front
    end on what the TTFT of lone prefills leaves."""

    def step_ns(batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        return (
            d["decode_base_ns"]
            + d["decode_per_seq_ns"] * batch * (1 + k)
            + d["decode_per_ctx_token_ns"] * ctx
        )

    sparts = []
    for _, pre in samples:
        x = np.stack([np.ones(len(pre)), pre[:, 3], pre[:, 4]], axis=1)
        sparts.append((x, pre[:, 0] - step_ns(pre[:, 1], pre[:, 2])))
    sterms: list[Term] = []
    if sum(len(y) for _, y in sparts) >= MIN_PREFILL_GAPS:
        sterms = _fit_terms(
            sparts, STEP_PREFILL_TERMS, STEP_PREFILL_UNITS, scale=np.array([1.0, 1e4, 1e4])
        )
    s_ = {t.name: t.value for t in sterms}
    fparts = []
    for r in runs:
        p = prefill_samples(r)
        steps = np.maximum(1, np.ceil(p[:, 2] / budget))
        # a busy engine finishes the step in progress first: half a step on average
        wait = np.where(p[:, 3] > 0, 0.5, 0.0)
        y = p[:, 0] - (steps + wait) * step_ns(p[:, 3], p[:, 4])
        if sterms:
            y = y - (
                steps * s_["prefill_base_ns"]
                + s_["prefill_per_ctx_token_ns"]
                * chunk_context(p[:, 1] - p[:, 2], p[:, 2], budget, full_chunk)
                + s_["prefill_ns_per_token"] * p[:, 2]
            )
            x = np.stack([np.ones(len(p)), p[:, 1]], axis=1)
        else:  # no prefill gaps (one user): new tokens are identified by the TTFT alone
            x = np.stack(
                [
                    np.ones(len(p)),
                    p[:, 1],
                    p[:, 2],
                    chunk_context(p[:, 1] - p[:, 2], p[:, 2], budget, full_chunk),
                ],
                axis=1,
            )
        fparts.append(relative(x, y, p[:, 0]))
    if sterms:
        return sterms + _fit_terms(
            fparts, FRONTEND_TERMS, FRONTEND_UNITS, scale=np.array([1.0, 1e4])
        )
    return _fit_terms(
        fparts,
        (*FRONTEND_TERMS, "prefill_ns_per_token", "prefill_per_ctx_token_ns"),
        (*FRONTEND_UNITS, "ns per new token", "ns per context token of a chunk"),
        scale=np.array([1.0, 1e4, 1e4, 1e5]),
    )


def _fit_record(
    terms: dict[str, Term], runs: list[Run], flags: dict[str, Any], split: float | None
) -> dict[str, Any]:
    """The profile's ``extra.fit``: every term with its interval, what the fit saw, and the
    cache split (``fit_cache_split``) when the runs had one."""
    out: dict[str, Any] = {
        "terms": {n: t.as_dict() for n, t in terms.items()},
        "fitted_on": fitted_on(runs, flags),
        "interval": f"95% bootstrap over runs ({BOOTSTRAP} resamples, seed {SEED})",
    }
    if split is not None:
        out["cached_below_ns_per_token"] = _round(split)
    return out


def _values(terms: list[Term]) -> dict[str, float]:
    return {t.name: t.value for t in terms}


def _flags(runs: list[Run], command: dict[str, Any] | None) -> dict[str, Any]:
    """The launch flags the model reads, the KV cache of the first run, and the number of
    speculative tokens (from the counters when the flags lack it)."""
    flags = server_flags(command)
    cache = cache_config(runs[0].folder)
    if cache:
        flags["cache_config"] = cache
    spec_runs = [r.spec for r in runs if r.spec is not None]
    if not flags.get("num_speculative_tokens") and spec_runs and spec_runs[0][1]:
        flags["num_speculative_tokens"] = len(spec_runs[0][1])
    return flags


def _build_profile(
    base: SimProfile,
    name: str,
    notes: str,
    v: dict[str, float],
    acceptance: tuple[float, ...],
    flags: dict[str, Any],
    runs: list[Run],
    fit_extra: dict[str, Any],
) -> SimProfile:
    """The profile of the fitted terms ``v``, the launch flags and the first run's target."""
    per_token = v["prefill_ns_per_token"]
    cache = flags.get("cache_config") or {}
    target = runs[0].meta.get("target") or {}
    return base.replace(
        name=name,
        notes=notes
        or "Fitted to real runs by agent-replay engines sim-fit; "
        "every term's value and 95% interval (bootstrap over runs) are in extra.fit.terms.",
        decode_base_ns=round(v["decode_base_ns"]),
        decode_per_seq_ns=round(v["decode_per_seq_ns"]),
        decode_per_ctx_token_ns=float(v["decode_per_ctx_token_ns"]),
        prefill_tokens_per_s=1e9 / per_token if per_token > 0 else 1e12,
        prefill_base_ns=round(v.get("prefill_base_ns", 0.0)),
        prefill_per_ctx_token_ns=float(v.get("prefill_per_ctx_token_ns", 0.0)),
        prefill_ctx_full_chunk=int(v.get("prefill_ctx_full_chunk", 0)),
        frontend_base_ns=round(v["frontend_base_ns"]),
        frontend_per_prompt_token_ns=float(v["frontend_per_prompt_token_ns"]),
        frontend_batch_overlap=float(v.get("frontend_batch_overlap", 0.0)),
        num_speculative_tokens=len(acceptance),
        spec_acceptance=acceptance,
        max_num_seqs=int(flags.get("max_num_seqs", base.max_num_seqs)),
        max_num_batched_tokens=int(
            flags.get("max_num_batched_tokens", base.max_num_batched_tokens)
        ),
        model_name=str(target.get("model") or base.model_name),
        max_model_len=int(target.get("max_model_len") or base.max_model_len),
        **(
            {
                "kv_cache_blocks": cache["num_gpu_blocks"],
                "block_size": cache["block_size"],
                "prefix_cache_blocks": cache["num_gpu_blocks"],
            }
            if cache
            else {}
        ),
        extra={**base.extra, "fit": fit_extra},
    )


def fit_runs(
    folders: list[str | Path],
    *,
    name: str = "fitted",
    base: SimProfile | None = None,
    command: dict[str, Any] | None = None,
    notes: str = "",
    prefill_ctx_full_chunk: int = 0,
    frontend_batch_overlap: float = 0.0,
) -> Fit:
    """Fit the model to the runs in ``folders`` (one deployment: same model, GPU, flags;
    ``command`` is its launch record, whose flags the model reads)."""
    if not folders:
        raise InputError("sim-fit: no results folders given")
    split = fit_cache_split(folders)
    runs = [read_run(f, split) for f in folders]
    flags = _flags(runs, command)
    k = int(flags.get("num_speculative_tokens", 0))
    base = base or SimProfile()
    budget = int(flags.get("max_num_batched_tokens", base.max_num_batched_tokens))
    samples = [gap_samples(r, k, budget) for r in runs]
    dterms = _fit_decode(samples, k)
    pterms = _fit_prefill(runs, samples, _values(dterms), k, budget, prefill_ctx_full_chunk)
    aterms = _fit_acceptance([r.spec for r in runs if r.spec is not None], k) if k else []
    terms = {t.name: t for t in dterms + pterms + aterms}
    profile = _build_profile(
        base,
        name,
        notes,
        {
            **_values(dterms + pterms),
            "prefill_ctx_full_chunk": prefill_ctx_full_chunk,
            "frontend_batch_overlap": frontend_batch_overlap,
        },
        tuple(_values(aterms).values()),
        flags,
        runs,
        _fit_record(terms, runs, flags, split),
    )
    return Fit(profile, terms)


def _fit_acceptance(spec_runs: list[tuple[float, list[float]]], k: int) -> list[Term]:
    """a_i = accepted at position i / accepted at position i-1 (drafts for i = 0), pooled."""
    if not spec_runs:
        raise InputError("sim-fit: speculative decoding is on but no run has spec-decode counters")

    def rates(sel: list[tuple[float, list[float]]]) -> list[float]:
        drafts = sum(s[0] for s in sel)
        acc = [sum(s[1][i] if i < len(s[1]) else 0.0 for s in sel) for i in range(k)]
        prev = [drafts, *acc[:-1]]
        return [min(1.0, a / p) if p > 0 else 0.0 for a, p in zip(acc, prev, strict=True)]

    value = rates(spec_runs)
    rng = np.random.default_rng(SEED)
    boots = [
        rates([spec_runs[j] for j in rng.integers(0, len(spec_runs), len(spec_runs))])
        for _ in range(BOOTSTRAP if len(spec_runs) > 1 else 0)
    ]
    out = []
    for i in range(k):
        lo, hi = (
            np.percentile([b[i] for b in boots], [2.5, 97.5])
            if boots
            else (float("nan"), float("nan"))
        )
        out.append(
            Term(
                f"spec_acceptance[{i}]",
                value[i],
                float(lo),
                float(hi),
                "probability",
                int(sum(s[0] for s in spec_runs)),
            )
        )
    return out


def fitted_on(runs: list[Run], flags: dict[str, Any]) -> dict[str, Any]:
    """What the fit saw: model, GPUs, vLLM version, server flags and each run folder."""
    m = runs[0].meta
    prov = m.get("provenance") or {}
    gpus = sorted(
        {
            g.get("name", "")
            for r in runs
            for g in ((r.meta.get("gpu_telemetry") or {}).get("gpus") or prov.get("gpus") or [])
        }
    )
    return {
        "model": (m.get("target") or {}).get("model"),
        "gpus": gpus,
        "vllm": (prov.get("dependencies") or {}).get("vllm"),
        "flags": flags,
        "runs": [
            {"folder": r.folder, "run_id": r.meta.get("run_id"), "requests": len(r.sent)}
            for r in runs
        ],
    }


def write_profile(fit: Fit, out: str | Path, *, force: bool = False) -> None:
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"{out}: exists (pass --force to overwrite)")
    out.write_text(json.dumps(fit.profile.to_dict(), indent=1) + "\n")


def describe(fit: Fit) -> str:
    """One line per term: value and interval."""
    lines = []
    for t in fit.terms.values():
        lines.append(
            f"{t.name:32} {t.value:14.4g}  [{t.low:.4g}, {t.high:.4g}] {t.unit} "
            f"({t.samples} samples)"
        )
    return "\n".join(lines)
