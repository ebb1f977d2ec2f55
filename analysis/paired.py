"""Paired comparisons: the same requests, replayed against two targets, compared twin by twin.

Two runs of one plan (the same trace, by content hash, and the same load-shaping options)
send the same requests: a request is known by its identity (session, clone, request index),
and its prompt lengths and output length are the same on both sides (the prompt salt changes
the tokens, not their count). ``pair_runs`` joins the ok requests of two runs on that
identity; a statistic of the comparison (P90 TPS, TTFT P90, ...) is then computed on the
same set of requests on both sides, so which requests happened to land in a run no longer
counts as a difference between the targets.

The interval is a cluster bootstrap over sessions: a resample draws as many sessions as the
pairs hold, with replacement, and keeps every pair of each drawn session on both sides at
once (a session's requests share a context and a schedule, so they are not independent).
The statistic of a resample is the log ratio of the two sides' percentiles over the
resampled pairs (a weighted percentile, by the rule the definitions table gives the metric:
nearest rank, or linear interpolation for the AgentX figures); the interval is the 2.5th to
97.5th percentile of the resampled log ratios around the observed one, stretched by
sqrt(C / (C - S)) for C sessions in S strata (the bootstrap's variance of a mean of C
clusters is (C - 1) / C of the unbiased one), and the p-value twice the smaller share of
resampled log ratios on either side of zero. Replicate run pairs (``compare A1,A2,A3
B1,B2,B3``) are strata: the statistic is the mean over the run pairs of each one's log
ratio, the ratio of the arms' geometric means of per-run percentiles that ``compare`` shows
side by side (one definition for both), and each resample draws sessions within each run
pair. A percentile pooled over the run pairs would not be that figure, and would take its
tail from the noisiest run pair, whose twins differ most.

What it covers: the variation of which requests (sessions) were played, and per-request
noise. What it does not: a shift that hits every request of one run and not its twin (host
contention during one run, a server's slow hour). Runs made at the same time on one host
(``run --targets A,B``, ``replay.lanes``) share the host's noise, so with host contention
the paired verdict stands for them, with the wider of the session bootstrap and a bootstrap
of contiguous time blocks of the pairs (``by="block"``, which takes in the noise that drifts
within a run). Runs made one after the other with host contention are not paired:
``paired_comparison`` says so and ``compare`` falls back to its unpaired design.

The statistics are the definitions table's tested figures that are a percentile of a
per-request metric (``analysis.definitions.FIGURES``): a speed (1 / a time's percentile) or a
headline percentile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from agent_replay.analysis.compare import Delta, differences
from agent_replay.analysis.definitions import BY_KEY, FIGURES, METRICS, SPEEDS, Figure, Speed
from agent_replay.analysis.hist import min_count_for, rank
from agent_replay.analysis.replicates import Interval
from agent_replay.analysis.report import Report
from agent_replay.runmeta import RunMeta

CONFIDENCE = 0.95
MIN_CLUSTERS = 4
"""Fewest sessions (or time blocks) a paired interval is drawn from: fewer resample to a
handful of distinct values."""
BLOCKS = 10
"""Time blocks of each run pair for ``block_intervals`` (contiguous in intended send time)."""
IDENTITY = ("session_id", "clone", "request_index")
"""What makes a request the same request in two runs of one plan."""
_CHUNK = 2_000_000
"""Most resample x pair cells held at once (memory bound of the vectorized bootstrap)."""


@dataclass(frozen=True, slots=True)
class PairedStat:
    """One tested statistic: a percentile of a per-request metric, or a speed read from one."""

    key: str
    label: str
    metric: str
    p: float
    method: str
    speed: bool
    higher_is_better: bool


def _paired_stat(
    f: Figure, speeds: dict[str, Speed], headline: dict[str, tuple[str, float]]
) -> PairedStat | None:
    """The paired statistic of one tested figure: a speed, a headline percentile, or none."""
    label = f.test_label or f.label
    if f.key in speeds:
        src = speeds[f.key].source
        return PairedStat(
            f.key, label, src, speeds[f.key].percentile, BY_KEY[src].percentile_method, True, True
        )
    if f.key in headline:
        src, p = headline[f.key]
        return PairedStat(
            f.key, label, src, p, BY_KEY[src].percentile_method, False, f.higher_is_better
        )
    return None


def _paired_stats() -> tuple[PairedStat, ...]:
    speeds = {sp.key: sp for sp in SPEEDS}
    headline = {
        f"{m.key}_p{p:g}_ms": (m.key, p) for m in METRICS if m.per == "request" for p in m.headline
    }
    stats = (_paired_stat(f, speeds, headline) for f in FIGURES if f.tested)
    return tuple(x for x in stats if x is not None)


PAIRED_STATS: tuple[PairedStat, ...] = _paired_stats()
"""The statistics a paired comparison tests, from the definitions table."""


def not_pairable(
    a: RunMeta | Mapping[str, object], b: RunMeta | Mapping[str, object]
) -> str | None:
    """Why two runs cannot be paired request by request (None: they can): they must have
    replayed the same plan, the same trace by content and the same load-shaping options."""
    ma, mb = RunMeta.of(a), RunMeta.of(b)
    if not ma.trace.sha256 or ma.trace.sha256 != mb.trace.sha256:
        return "not the same trace (by content hash)"
    diff = [d for d in differences(ma, mb) if not d.startswith("model ")]
    if diff:
        return "not the same plan: " + "; ".join(diff)
    return None


@dataclass(frozen=True, slots=True)
class Pairs:
    """The ok requests two runs share, one row per identity, with each side's metrics."""

    session: np.ndarray  # int cluster id (session and clone)
    intended: np.ndarray  # base side's intended send time (ns), for time blocks
    a: dict[str, np.ndarray]
    b: dict[str, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.session.size)


def _ok(t: pa.Table) -> pa.Table:
    return t.filter(t.column("ok"))


def pair_tables(a: pa.Table, b: pa.Table, metrics: Sequence[str] | None = None) -> Pairs:
    """Join two runs' per-request tables (``RunStats.per_request``) on the request identity,
    ok rows on both sides. A repeated identity (it should not happen) keeps its first row."""
    metrics = sorted({s.metric for s in PAIRED_STATS}) if metrics is None else list(metrics)
    cols = [*IDENTITY, "intended_ns", *metrics]
    ta, tb = _ok(a).select(cols), _ok(b).select(cols)
    ta = ta.append_column("_row_a", pa.array(np.arange(ta.num_rows)))
    tb = tb.append_column("_row_b", pa.array(np.arange(tb.num_rows)))
    j = ta.select([*IDENTITY, "_row_a"]).join(
        tb.select([*IDENTITY, "_row_b"]), list(IDENTITY), join_type="inner"
    )
    ra = j.column("_row_a").to_numpy()
    rb = j.column("_row_b").to_numpy()
    # one row per identity, in a fixed order (the join's order is not specified)
    order = np.lexsort((rb, ra))
    ra, rb = ra[order], rb[order]
    _, first = np.unique(ra, return_index=True)
    ra, rb = ra[first], rb[first]
    _, first_b = np.unique(rb, return_index=True)
    ra, rb = ra[first_b], rb[first_b]
    keys = [
        f"{s}\x00{c}"
        for s, c in zip(
            ta.column("session_id").take(pa.array(ra)).to_pylist(),
            ta.column("clone").take(pa.array(ra)).to_pylist(),
            strict=True,
        )
    ]
    _, session = np.unique(np.asarray(keys, dtype=object), return_inverse=True)

    def side(t: pa.Table, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {
            m: np.asarray(t.column(m).to_numpy(zero_copy_only=False), dtype=np.float64)[rows]
            for m in metrics
        }

    intended = np.asarray(ta.column("intended_ns").to_numpy(), dtype=np.float64)[ra]
    return Pairs(session.astype(np.int64), intended, side(ta, ra), side(tb, rb))


def weighted_percentile(
    sorted_x: np.ndarray, weights: np.ndarray, p: float, method: str = "nearest"
) -> np.ndarray:
    """The ``p`` percentile of each row's weighted sample: ``sorted_x`` ascending, ``weights``
    (resamples x values) integer counts, a value of weight k counting as k samples. Nearest
    rank (``analysis.hist.rank``) or linear interpolation (numpy's ``linear``) over the
    expanded sample, without expanding it."""
    cum = np.cumsum(weights, axis=1)
    total = cum[:, -1].astype(np.int64)
    last = sorted_x.size - 1

    def at(j: np.ndarray) -> np.ndarray:
        # the value at 0-based position j of the expanded sample: the first whose cumulative
        # weight exceeds j
        return sorted_x[np.minimum((cum <= j[:, None]).sum(axis=1), last)]

    if method == "linear":
        h = (total - 1) * (p / 100.0)
        j0 = np.floor(h).astype(np.int64)
        j1 = np.minimum(j0 + 1, total - 1)
        v0, v1 = at(j0), at(j1)
        return v0 + (h - j0) * (v1 - v0)
    milli = round(min(max(p, 0.0), 100.0) * 1000)
    r = np.maximum(1, -(-milli * total // 100_000))
    return at(r - 1)


def point(x: np.ndarray, p: float, method: str) -> float:
    """The ``p`` percentile of ``x`` by the definitions table's rule (as ``analysis.hist``)."""
    if method == "linear":
        return float(np.percentile(x, p, method="linear"))
    return float(np.partition(x, rank(p, x.size) - 1)[rank(p, x.size) - 1])


@dataclass(frozen=True, slots=True)
class PairedInterval:
    """A paired comparison of one statistic: each side's value over the shared requests
    (tok/s for a speed, ms otherwise), the change (B / A - 1; for a speed, the ratio of
    speeds - 1), its interval and p-value; ``note`` says why there is no interval."""

    stat: PairedStat
    base: float | None
    value: float | None
    change: float | None
    low: float | None
    high: float | None
    p: float | None
    pairs: int
    clusters: int
    note: str | None = None


def _log_ratio(qa: np.ndarray | float, qb: np.ndarray | float, speed: bool) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(np.divide(qa, qb)) if speed else np.log(np.divide(qb, qa)))


def _block_ids(s: Pairs) -> np.ndarray:
    """Each pair's time block: ``BLOCKS`` contiguous blocks of equal count in intended send
    time."""
    order = np.argsort(np.argsort(s.intended, kind="stable"), kind="stable")
    nb = max(1, min(BLOCKS, s.n))
    return (order * nb // max(1, s.n)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Resampling:
    """The clusters of each stratum and their bootstrap draws: ``counts[s][r, c]`` is how
    many times resample ``r`` draws cluster ``c`` of stratum ``s``."""

    cluster: list[np.ndarray]
    counts: list[np.ndarray]
    stretch: float
    unit: str


def _draws(rng: np.random.Generator, k: int, resamples: int) -> np.ndarray:
    """How many times each resample draws each of ``k`` clusters (k draws in all)."""
    if not k:
        return np.zeros((resamples, 0), dtype=np.int64)
    return rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)


def _resampling(
    strata: Sequence[Pairs], by: str, resamples: int, rng: np.random.Generator
) -> _Resampling:
    cluster = [_block_ids(s) if by == "block" else s.session for s in strata]
    sizes = [int(c.max(initial=-1)) + 1 for c in cluster]
    n_clusters, n_strata = sum(sizes), sum(1 for k in sizes if k)
    stretch = np.sqrt(n_clusters / (n_clusters - n_strata)) if n_clusters > n_strata else np.inf
    return _Resampling(
        cluster,
        [_draws(rng, k, resamples) for k in sizes],
        float(stretch),
        "time blocks" if by == "block" else "sessions",
    )


@dataclass(frozen=True, slots=True)
class _Side:
    """One stratum's finite pairs of one metric."""

    a: np.ndarray
    b: np.ndarray
    cluster: np.ndarray
    counts: np.ndarray


def _sides(strata: Sequence[Pairs], rs: _Resampling, metric: str) -> list[_Side]:
    out = []
    for s, cl, counts in zip(strata, rs.cluster, rs.counts, strict=True):
        keep = np.isfinite(s.a[metric]) & np.isfinite(s.b[metric])
        out.append(_Side(s.a[metric][keep], s.b[metric][keep], cl[keep], counts))
    return out


def _resampled_log_ratio(x: _Side, st: PairedStat) -> np.ndarray:
    """The stratum's log ratio in every resample (its clusters drawn with replacement)."""
    resamples, n = x.counts.shape[0], x.a.size
    oa, ob = np.argsort(x.a, kind="stable"), np.argsort(x.b, kind="stable")
    sa, sb = x.a[oa], x.b[ob]
    logs = np.empty(resamples)
    step = max(1, _CHUNK // max(1, n))
    for r0 in range(0, resamples, step):
        w = x.counts[r0 : r0 + step][:, x.cluster]
        logs[r0 : r0 + step] = _log_ratio(
            weighted_percentile(sa, w[:, oa], st.p, st.method),
            weighted_percentile(sb, w[:, ob], st.p, st.method),
            st.speed,
        )
    return logs


def _shown(q: np.ndarray, speed: bool) -> float:
    """The geometric mean of the strata's percentiles (ns), as shown: tok/s or ms."""
    g = float(q[0]) if q.size == 1 else float(np.exp(np.mean(np.log(q))))
    return 1e9 / g if speed else g / 1e6


def _missing(st: PairedStat, sides: Sequence[_Side], unit: str, min_clusters: int) -> str | None:
    """Why a statistic gets no interval (None: it gets one)."""
    need = min_count_for(st.p)
    fewest = min(x.a.size for x in sides)
    k = [int(np.unique(x.cluster).size) for x in sides]
    if fewest >= need and sum(k) >= min_clusters and min(k) >= min(2, min_clusters):
        return None
    each = " in each run pair" if len(sides) > 1 else ""
    return (
        f"no interval: {fewest} pairs in {sum(k)} {unit}, it needs {need} pairs{each} in "
        f"{min_clusters} {unit}"
    )


def _percentiles(st: PairedStat, sides: Sequence[_Side]) -> tuple[np.ndarray, np.ndarray] | str:
    """Each stratum's percentile on either side (ns), or why there is no ratio."""
    if any(x.a.size == 0 for x in sides):
        return "no pairs"
    qa = np.array([point(x.a, st.p, st.method) for x in sides])
    qb = np.array([point(x.b, st.p, st.method) for x in sides])
    if not (np.all(qa > 0) and np.all(qb > 0)):
        return "a percentile <= 0: no ratio"
    return qa, qb


def _one_stat(
    st: PairedStat, sides: Sequence[_Side], rs: _Resampling, min_clusters: int
) -> PairedInterval:
    """One statistic: the mean over the strata of each one's log ratio, and its interval."""
    n = sum(x.a.size for x in sides)
    k = sum(int(np.unique(x.cluster).size) for x in sides)
    q = _percentiles(st, sides)
    if isinstance(q, str):
        return PairedInterval(st, None, None, None, None, None, None, n, k, q)
    qa, qb = q
    est = float(np.mean(_log_ratio(qa, qb, st.speed)))
    base, value, change = _shown(qa, st.speed), _shown(qb, st.speed), float(np.expm1(est))
    why = _missing(st, sides, rs.unit, min_clusters)
    if why is not None:
        return PairedInterval(st, base, value, change, None, None, None, n, k, why)
    logs = np.mean([_resampled_log_ratio(x, st) for x in sides], axis=0)
    logs = est + (logs[np.isfinite(logs)] - est) * rs.stretch
    lo, hi = np.expm1(np.percentile(logs, [(1 - CONFIDENCE) / 2 * 100, (1 + CONFIDENCE) / 2 * 100]))
    p = min(1.0, 2 * min(float(np.mean(logs <= 0)), float(np.mean(logs >= 0))))
    return PairedInterval(st, base, value, change, float(lo), float(hi), p, n, k)


def paired_intervals(
    strata: Sequence[Pairs],
    *,
    resamples: int = 1000,
    seed: int = 0,
    by: str = "session",
    stats: Sequence[PairedStat] = PAIRED_STATS,
    min_clusters: int = MIN_CLUSTERS,
) -> list[PairedInterval]:
    """Every statistic of ``stats`` compared over the pairs of ``strata`` (one ``Pairs`` per
    run pair): the mean over the run pairs of each one's log ratio, with a cluster bootstrap
    over sessions (``by="session"``) or over time blocks (``by="block"``) within each run
    pair (see the module docstring)."""
    if not strata:
        return [
            PairedInterval(st, None, None, None, None, None, None, 0, 0, "no pairs") for st in stats
        ]
    rs = _resampling(strata, by, resamples, np.random.default_rng(seed))
    return [_one_stat(st, _sides(strata, rs, st.metric), rs, min_clusters) for st in stats]


def widest(x: Sequence[PairedInterval], y: Sequence[PairedInterval]) -> list[PairedInterval]:
    """Statistic by statistic, the union of two intervals of the same comparison and the
    larger p-value: what stays true under either resampling."""
    out = []
    for u, v in zip(x, y, strict=True):
        if u.low is None or v.low is None or u.high is None or v.high is None:
            out.append(u if u.low is None else v)
            continue
        out.append(
            PairedInterval(
                u.stat,
                u.base,
                u.value,
                u.change,
                min(u.low, v.low),
                max(u.high, v.high),
                max(u.p or 0.0, v.p or 0.0),
                u.pairs,
                u.clusters,
                u.note,
            )
        )
    return out


# ---- the comparisons ``compare`` makes from these

SEQUENTIAL = (
    "not paired: host contention in runs made one after the other (one run's noise "
    "is not its twin's); run both targets at once for a paired verdict: agent-replay "
    "run TRACE --targets A,B"
)
"""Why runs under host contention are not paired."""
OVERLAP = 0.8
"""Share of the shorter run's wall time two runs must share to count as made at once."""


def simultaneous(a: RunMeta | Mapping[str, object], b: RunMeta | Mapping[str, object]) -> bool:
    """Whether two runs ran at the same time on the same host: their wall-clock windows
    (run.json's clock anchor and wall time) share ``OVERLAP`` of the shorter one."""
    ma, mb = RunMeta.of(a), RunMeta.of(b)
    if ma.environment.get("host") != mb.environment.get("host"):
        return False
    spans = []
    for m in (ma, mb):
        if m.clock.t0_wall_ns is None or m.summary is None or not m.summary.wall_s > 0:
            return False
        spans.append((m.clock.t0_wall_ns / 1e9, m.clock.t0_wall_ns / 1e9 + m.summary.wall_s))
    shared = min(spans[0][1], spans[1][1]) - max(spans[0][0], spans[1][0])
    return shared >= OVERLAP * min(e - s for s, e in spans)


def pair_runs(runs: Sequence[tuple[Report, Report]]) -> list[Pairs] | str:
    """The pairs of each (base, other) run pair, or why they cannot be paired."""
    out = []
    for a, b in runs:
        why = not_pairable(a.meta, b.meta)
        if why is not None:
            return why
        p = pair_tables(a.stats.per_request, b.stats.per_request)
        if p.n == 0:
            return "no ok request in common"
        out.append(p)
    return out


@dataclass(frozen=True, slots=True)
class PairedComparison:
    intervals: list[PairedInterval]
    design: str
    """How the rows were computed, in words (shown beside them)."""


def _design(strata: Sequence[Pairs]) -> str:
    """The paired design in words: how many requests, sessions and run pairs."""
    n = sum(s.n for s in strata)
    sessions = sum(int(s.session.max()) + 1 for s in strata)
    of = f" of {len(strata)} run pairs" if len(strata) > 1 else ""
    return f"paired: {n:,} requests in {sessions} sessions{of}, cluster bootstrap over sessions"


def paired_comparison(
    runs: Sequence[tuple[Report, Report]],
    contended: Sequence[tuple[bool, bool]],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> PairedComparison | str:
    """The paired comparison of (base, other) run pairs, or why there is none (a line).

    With host contention in any run (its self-check), the pairs are compared only where every
    pair ran at the same time on one host (``simultaneous``): the noise fell on both sides,
    and the interval is the wider of the session and the time-block bootstrap (``widest``).
    Runs made one after the other under contention are not paired: one run's noise is not
    its twin's, and pairing would call it a difference between the targets."""
    strata = pair_runs(runs)
    if isinstance(strata, str):
        return strata
    busy = any(a or b for a, b in contended)
    if busy and not all(simultaneous(a.meta, b.meta) for a, b in runs):
        return SEQUENTIAL
    design = _design(strata)
    by_session = paired_intervals(strata, resamples=resamples, seed=seed)
    if not busy:
        return PairedComparison(by_session, design)
    by_block = paired_intervals(strata, resamples=resamples, seed=seed + 1, by="block")
    return PairedComparison(
        widest(by_session, by_block),
        design + ", widened to the time-block bootstrap for host contention",
    )


def as_delta(x: PairedInterval, design: str) -> Delta:
    """One row of ``compare``'s table."""
    return Delta(
        x.stat.key,
        x.stat.label,
        x.base,
        x.value,
        x.change,
        x.low,
        x.high,
        x.stat.higher_is_better,
        x.note,
        x.p,
        design=design,
    )


def as_interval(x: PairedInterval, design: str) -> Interval:
    """One replicate-arm test (``analysis.replicates``)."""
    if x.change is None:
        return Interval(None, None, None, x.pairs, x.note or "none")
    return Interval(
        x.change, x.low, x.high, x.pairs, (x.note or design) if x.low is None else design, x.p
    )
