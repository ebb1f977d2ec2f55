"""The replay plan: which requests go out, grouped in sessions, with their offsets, think
times, prompt blocks and output lengths. Pure: a trace table in, plain objects out.

Rules (docs/replay.md has the long form):

* Offsets are from the trace's first arrival, divided by ``speedup``; so are think times.
* Sessions are trees (trace schema v2): a request waits for every request in its
  ``depends_on`` (v1 traces: its parent). ``deps`` holds their positions in the session;
  ``children`` the requests whose latest-positioned dependency this one is (the driver
  starts preparing those while this one is in flight).
* Think time of a request = its ``think_ns``; when null, its arrival minus the latest end
  (arrival + ``end_ns``; 0 when unknown) of its dependencies, floored at 0. ``max_think_s``
  caps it (recorded tool timeouts of minutes are not load).
* ``rebase_sessions`` starts every session at offset 0 (sessions recorded hours apart then
  run together).
* ``sessions_multiplier`` N > 1 adds N-1 clones of every session. A clone has disjoint
  prompt blocks (the clone index is part of every block's key) and its start is shifted
  by a deterministic amount in [0, mean gap between session starts), so the load is N
  times the trace's with the same shape.
* ``keep_overlaps``: a request with dependencies also waits for every request of its
  session that ended before it started in the recording (the recorded order is kept
  under ``speedup``).
* ``max_sessions`` keeps the first sessions by start (after cloning); ``duration_s`` drops
  sessions that start after it (the driver also stops sending at the deadline).
* Every request gets enough prefix-block hash ids for its prompt. Rows without hash ids
  get fresh per-request blocks, except that a request with a parent and a recorded
  ``cached_tokens`` reuses its parent's first ``cached_tokens // block_size`` blocks, which
  is the sharing the trace implies. Synthesized ids are negative, recorded ids are kept.
* ``implied_cached`` = the prefix an unbounded block cache would hit: leading blocks whose
  hash was seen in an earlier request (by offset), counted in full 16-token server blocks
  (``traces.stats.implied_hits``, which ``traces inspect`` uses too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from agent_replay.errors import InputError, TraceError
from agent_replay.traces.stats import implied_hits
from agent_replay.traces.tree import MAIN, tree_columns

TIMING_MODES = ("session", "absolute", "max-rate", "agentx")
ARRIVALS = ("poisson", "constant")


@dataclass(frozen=True)
class PlanOptions:
    speedup: float = 1.0
    sessions_multiplier: int = 1
    max_sessions: int | None = None
    duration_s: float | None = None
    default_api: str = "completions"
    api_override: str | None = None
    rate: float | None = None
    """Sessions per second (after ``speedup``): session starts become an arrival process
    (``arrivals``) instead of the trace's; see ``arrival_offsets``."""
    arrival: str = "poisson"
    concurrent_sessions: int | None = None
    """Replay exactly this many sessions (cloned as needed), all started within
    ``ramp_s``; see ``concurrent_starts``."""
    ramp_s: float = 1.0
    arrival_seed: int = 0
    max_think_s: float | None = None
    rebase_sessions: bool = False
    keep_overlaps: bool = False
    """A request with dependencies also waits for every request of its session that had
    ended before it started in the recording: ``speedup`` then shrinks think times without
    letting requests overlap that never overlapped (``speedup_warning``)."""

    def check(self) -> None:
        self._check_load()
        self._check_scale()

    def _check_load(self) -> None:
        """The load axis: a rate or a number of concurrent sessions, not both."""
        if self.rate is not None and not self.rate > 0:
            raise InputError(f"--rate must be > 0 sessions/s, got {self.rate}")
        if self.arrival not in ARRIVALS:
            raise InputError(
                f"--arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}"
            )
        if self.concurrent_sessions is not None and self.concurrent_sessions < 1:
            raise InputError(f"--concurrent-sessions must be >= 1, got {self.concurrent_sessions}")
        if self.rate is not None and self.concurrent_sessions is not None:
            raise InputError("--rate and --concurrent-sessions are two load axes; give one")
        if self.ramp_s < 0:
            raise InputError(f"ramp must be >= 0 s, got {self.ramp_s}")

    def _check_scale(self) -> None:
        """Time compression, cloning and the cuts of the trace."""
        if not self.speedup > 0:
            raise InputError(f"--speedup must be > 0, got {self.speedup}")
        if self.sessions_multiplier < 1:
            raise InputError(f"--sessions-multiplier must be >= 1, got {self.sessions_multiplier}")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise InputError(f"--max-sessions must be >= 1, got {self.max_sessions}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InputError(f"--duration-s must be > 0, got {self.duration_s}")
        if self.max_think_s is not None and not self.max_think_s >= 0:
            raise InputError(f"--max-think-s must be >= 0, got {self.max_think_s}")


@dataclass(slots=True)
class PlannedRequest:
    session_id: str
    clone: int
    request_index: int
    parent_index: int  # request_index of the parent in the trace, -1: none
    parent: int  # position of the parent in the session's list, -1: none
    offset_ns: int  # original arrival from trace start, after speedup and clone shift
    think_ns: int  # after speedup
    input_tokens: int
    output_tokens: int
    hash_ids: list[int]
    api: str
    model: str | None
    content: str | None
    cached_tokens: int | None
    implied_cached: int = 0
    children: list[int] = field(default_factory=list)
    agent_id: str = MAIN
    deps: list[int] = field(default_factory=list)  # positions of the dependencies
    depends_on: list[int] = field(default_factory=list)  # their request_index values
    service_ns: int | None = None
    """Recorded arrival to last byte (the trace's ``end_ns``), after ``speedup``; None: unknown."""
    shared_blocks: int = 0
    """Leading prompt blocks before the first user turn (the tools + system prefix, from the
    trace's ``prefix_tokens``): what a cache-bust marker at the first user turn leaves
    shared between copies of a session (``replay.agentx``)."""
    prompt_clone: int | None = None
    """The clone whose blocks the prompt is made of (None: ``clone``)."""

    @property
    def blocks_clone(self) -> int:
        return self.clone if self.prompt_clone is None else self.prompt_clone


@dataclass(slots=True)
class PlannedSession:
    session_id: str
    clone: int
    start_ns: int
    requests: list[PlannedRequest]

    @property
    def key(self) -> str:
        return self.session_id if self.clone == 0 else f"{self.session_id}#{self.clone}"


@dataclass(slots=True)
class Plan:
    sessions: list[PlannedSession]
    block_size: int

    @property
    def n_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)

    def shard(self, index: int, n: int) -> Plan:
        """Shard ``index`` of ``n``: every n-th session in start order (``sessions`` is sorted
        by start time, then key), from the ``index``-th. Each shard gets an even share of
        the arrivals over the whole run; a hash of the key would give each a random subset,
        whose arrivals clump (a worker near its capacity then lags where one fed evenly
        does not). The same trace and options give the same shards in every process."""
        if n <= 1:
            return self
        return Plan(self.sessions[index::n], self.block_size)


def set_shared_prefix(plan: Plan, prefix_tokens: dict[tuple[str, str], int]) -> None:
    """Each request's ``shared_blocks`` from the tools + system prefix size of its session
    and agent (``prefix_tokens``: (session id, agent id) -> tokens)."""
    if not prefix_tokens:
        return
    for s in plan.sessions:
        for q in s.requests:
            n = prefix_tokens.get((q.session_id, q.agent_id), 0)
            q.shared_blocks = min(n // plan.block_size, len(q.hash_ids))


def speedup_warning(plan: Plan, opts: PlanOptions) -> str | None:
    """The warning a ``speedup`` of session trees deserves: think times and spawn delays
    shrink, service times do not, so parallel branches overlap where the recording had them
    apart (None when it does not apply)."""
    if opts.speedup == 1.0 or opts.keep_overlaps:
        return None
    if not any(q.agent_id != MAIN for s in plan.sessions for q in s.requests):
        return None
    return (
        f"--speedup {opts.speedup:g} shrinks think times and subagent spawn delays but not "
        "service times: branches of a session tree overlap where the recording had them "
        "apart; --keep-overlaps keeps the recorded order"
    )


def stable_hash(*parts: object) -> int:
    raw = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


_COLUMNS = (
    "session_id",
    "request_index",
    "parent_index",
    "arrival_ns",
    "think_ns",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "hash_ids",
    "api",
    "model",
    "end_ns",
    "content",
    "agent_id",
    "depends_on",
)


def build_plan(table: pa.Table, block_size: int, opts: PlanOptions) -> Plan:
    """The plan for a whole trace (validated beforehand)."""
    opts.check()
    if block_size < 1:
        raise TraceError(f"block size in the trace metadata must be >= 1, got {block_size}")
    n = table.num_rows
    cols = _columns(tree_columns(table), n)
    if n == 0:
        return Plan([], block_size)
    t_first = min(cols["arrival_ns"])
    by_session: dict[str, list[int]] = {}
    for i, sid in enumerate(cols["session_id"]):
        by_session.setdefault(str(sid), []).append(i)
    base: list[PlannedSession] = []
    for sid, rows in by_session.items():
        reqs = _session_requests(sid, rows, cols, t_first, opts)
        _fill_hash_ids(reqs, block_size)
        base.append(PlannedSession(sid, 0, min(q.offset_ns for q in reqs), reqs))
    sessions = _shape_load(base, opts)
    _implied_cached(sessions, block_size)
    return Plan(sessions, block_size)


def _columns(table: pa.Table, n: int) -> dict[str, list[Any]]:
    """The plan's columns as lists; a column the trace lacks is all None."""
    return {
        name: table.column(name).to_pylist() if name in table.column_names else [None] * n
        for name in _COLUMNS
    }


def _session_requests(
    sid: str, rows: list[int], cols: dict[str, list[Any]], t_first: int, opts: PlanOptions
) -> list[PlannedRequest]:
    """A session's requests in request order (``rows``: its rows of the trace), each with
    its children (the requests whose last dependency it is)."""
    rows.sort(key=lambda r: (cols["request_index"][r], cols["arrival_ns"][r]))
    pos_of = {cols["request_index"][r]: p for p, r in enumerate(rows)}
    reqs = [_request(sid, rows, p, pos_of, cols, t_first, opts) for p in range(len(rows))]
    for p, req in enumerate(reqs):
        if req.deps:
            reqs[req.deps[-1]].children.append(p)
    return reqs


def _request(
    sid: str,
    rows: list[int],
    p: int,
    pos_of: dict[Any, int],
    cols: dict[str, list[Any]],
    t_first: int,
    opts: PlanOptions,
) -> PlannedRequest:
    """Request ``p`` of a session (trace row ``rows[p]``), its parent and dependencies as
    positions among the session's earlier requests."""
    r = rows[p]
    parent_index = int(cols["parent_index"][r])
    parent = _parent_position(sid, rows, p, parent_index, pos_of, cols)
    arrival = int(cols["arrival_ns"][r])
    dep_idx = sorted(int(d) for d in cols["depends_on"][r])
    deps = [_dep_position(sid, rows, p, d, pos_of, cols) for d in dep_idx]
    think = _think(cols, rows, r, deps, arrival, opts)
    if opts.keep_overlaps and deps:
        deps = sorted(set(deps) | set(_ended_before(cols, rows, p, arrival)))
    api = opts.api_override or cols["api"][r] or opts.default_api
    return PlannedRequest(
        session_id=sid,
        clone=0,
        request_index=int(cols["request_index"][r]),
        parent_index=parent_index,
        parent=parent,
        offset_ns=arrival - t_first,
        think_ns=int(think),
        input_tokens=int(cols["input_tokens"][r]),
        output_tokens=int(cols["output_tokens"][r]),
        hash_ids=list(cols["hash_ids"][r] or ()),
        api=str(api),
        model=cols["model"][r],
        content=cols["content"][r],
        cached_tokens=cols["cached_tokens"][r],
        agent_id=str(cols["agent_id"][r]),
        deps=deps,
        depends_on=dep_idx,
        service_ns=None if cols["end_ns"][r] is None else int(cols["end_ns"][r]),
    )


def _parent_position(
    sid: str,
    rows: list[int],
    p: int,
    parent_index: int,
    pos_of: dict[Any, int],
    cols: dict[str, list[Any]],
) -> int:
    """The position of the parent (-1: none), which must come before ``p``."""
    parent = pos_of.get(parent_index, -1) if parent_index >= 0 else -1
    if parent >= p:
        r = rows[p]
        raise TraceError(
            f"parent {parent_index} does not come before request "
            f"{cols['request_index'][r]} in session {sid!r}",
            row=r,
            field="parent_index",
        )
    return parent


def _dep_position(
    sid: str, rows: list[int], p: int, d: int, pos_of: dict[Any, int], cols: dict[str, list[Any]]
) -> int:
    """The position of dependency ``d`` (a request index), which must come before ``p``."""
    dp = pos_of.get(d, -1)
    if not 0 <= dp < p:
        r = rows[p]
        raise TraceError(
            f"depends_on {d} does not come before request "
            f"{cols['request_index'][r]} in session {sid!r}",
            row=r,
            field="depends_on",
        )
    return dp


def _think(
    cols: dict[str, list[Any]],
    rows: list[int],
    r: int,
    deps: list[int],
    arrival: int,
    opts: PlanOptions,
) -> int:
    """The trace's think time; when it has none, the gap from the latest dependency's end
    (0 without dependencies); capped at ``max_think_s``."""
    think = cols["think_ns"][r]
    if think is None:
        latest = max(
            (int(cols["arrival_ns"][rows[dp]]) + int(cols["end_ns"][rows[dp]] or 0) for dp in deps),
            default=None,
        )
        think = 0 if latest is None else max(0, arrival - latest)
    if opts.max_think_s is not None:
        think = min(int(think), int(opts.max_think_s * 1e9))
    return int(think)


def _ended_before(cols: dict[str, list[Any]], rows: list[int], p: int, arrival: int) -> list[int]:
    """The earlier requests of the session that had ended by ``arrival`` in the recording."""
    return [
        dp
        for dp in range(p)
        if cols["end_ns"][rows[dp]] is not None
        and int(cols["arrival_ns"][rows[dp]]) + int(cols["end_ns"][rows[dp]]) <= arrival
    ]


def _shape_load(base: list[PlannedSession], opts: PlanOptions) -> list[PlannedSession]:
    """The sessions as the options replay them: rebased, cloned, sped up, restarted on an
    arrival process or a ramp, cut at the duration and the session count; in start order."""
    if opts.rebase_sessions:
        _rebase(base)
    sessions = _clone(base, _multiplier(len(base), opts))
    sessions.sort(key=lambda s: (s.start_ns, s.key))
    if opts.speedup != 1.0:
        _speed_up(sessions, opts.speedup)
    if opts.concurrent_sessions is not None:
        sessions = sessions[: opts.concurrent_sessions]
        restart(sessions, concurrent_starts(len(sessions), opts.ramp_s))
    elif opts.rate is not None:
        restart(
            sessions, arrival_offsets(len(sessions), opts.rate, opts.arrival, opts.arrival_seed)
        )
    if opts.duration_s is not None:
        limit = int(opts.duration_s * 1e9)
        sessions = [s for s in sessions if s.start_ns < limit]
    if opts.max_sessions is not None:
        sessions = sessions[: opts.max_sessions]
    return sessions


def _rebase(sessions: list[PlannedSession]) -> None:
    """Every session starts at 0, its requests' offsets kept relative to its start."""
    for s in sessions:
        for q in s.requests:
            q.offset_ns -= s.start_ns
        s.start_ns = 0


def _multiplier(n_sessions: int, opts: PlanOptions) -> int:
    """The copies of each session: ``sessions_multiplier``, more if ``concurrent_sessions``
    needs them."""
    if opts.concurrent_sessions is None:
        return opts.sessions_multiplier
    return max(opts.sessions_multiplier, -(-opts.concurrent_sessions // max(n_sessions, 1)))


def _speed_up(sessions: list[PlannedSession], speedup: float) -> None:
    """Starts, offsets, think and service times divided by ``speedup``."""
    for s in sessions:
        s.start_ns = int(s.start_ns / speedup)
        for q in s.requests:
            q.offset_ns = int(q.offset_ns / speedup)
            q.think_ns = int(q.think_ns / speedup)
            if q.service_ns is not None:
                q.service_ns = int(q.service_ns / speedup)


def _fill_hash_ids(reqs: Sequence[PlannedRequest], bs: int) -> None:
    for q in reqs:
        need = -(-q.input_tokens // bs)
        ids = q.hash_ids
        if not ids and q.parent >= 0 and q.cached_tokens:
            par = reqs[q.parent]
            shared = min(q.cached_tokens, par.input_tokens, q.input_tokens) // bs
            ids = list(par.hash_ids[:shared])
        ids = list(ids[:need]) if len(ids) >= need else list(ids)
        k = len(ids)
        while len(ids) < need:
            ids.append(-1 - (stable_hash("blk", q.session_id, q.request_index, k) >> 2))
            k += 1
        q.hash_ids = ids


def _clone(base: list[PlannedSession], mult: int) -> list[PlannedSession]:
    if mult <= 1:
        return list(base)
    starts = sorted(s.start_ns for s in base)
    span = starts[-1] - starts[0] if len(starts) > 1 else 0
    gap = max(span // max(len(starts) - 1, 1), 1) if span else 1_000_000_000
    out = list(base)
    for c in range(1, mult):
        for s in base:
            shift = stable_hash("clone", s.session_id, c) % gap
            reqs = [
                PlannedRequest(
                    session_id=q.session_id,
                    clone=c,
                    request_index=q.request_index,
                    parent_index=q.parent_index,
                    parent=q.parent,
                    offset_ns=q.offset_ns + shift,
                    think_ns=q.think_ns,
                    input_tokens=q.input_tokens,
                    output_tokens=q.output_tokens,
                    hash_ids=q.hash_ids,
                    api=q.api,
                    model=q.model,
                    content=q.content,
                    cached_tokens=q.cached_tokens,
                    children=q.children,
                    agent_id=q.agent_id,
                    service_ns=q.service_ns,
                    deps=q.deps,
                    depends_on=q.depends_on,
                )
                for q in s.requests
            ]
            out.append(PlannedSession(s.session_id, c, s.start_ns + shift, reqs))
    return out


def _implied_cached(sessions: Iterable[PlannedSession], bs: int) -> None:
    """Prefix-cache hits an unbounded cache would give, counted as vLLM counts them
    (``traces.stats.implied_hits``: whole 16-token blocks, a trace block seen only as a
    partial last block counting for the server blocks it filled, never the last prompt
    token); clones keep their own hash spaces."""
    order = sorted(
        (q for s in sessions for q in s.requests),
        key=lambda q: (q.offset_ns, q.session_id, q.clone, q.request_index),
    )
    if not order:
        return
    lengths = np.fromiter((len(q.hash_ids) for q in order), np.int64, len(order))
    flat = np.fromiter((h for q in order for h in q.hash_ids), np.int64, int(lengths.sum()))
    inputs = np.fromiter((q.input_tokens for q in order), np.int64, len(order))
    space = np.fromiter((q.clone for q in order), np.int64, len(order))
    hits = implied_hits(lengths, flat, inputs, np.arange(len(order)), bs, space=space)
    for q, hit in zip(order, hits.tolist(), strict=True):
        q.implied_cached = hit


def arrival_offsets(n: int, rate: float, process: str = "poisson", seed: int = 0) -> list[int]:
    """Start offsets (ns) of ``n`` sessions arriving at ``rate`` per second: ``constant``
    every 1/rate s from 0; ``poisson`` with exponential gaps of mean 1/rate (the first at
    0), drawn from ``seed`` so that the same seed gives the same starts everywhere."""
    import numpy as np

    if n <= 0:
        return []
    gap = 1e9 / rate
    if process == "constant":
        return [round(i * gap) for i in range(n)]
    gaps = np.random.default_rng(seed).exponential(gap, n - 1)
    return [0, *np.cumsum(gaps).round().astype(np.int64).tolist()]


def concurrent_starts(n: int, ramp_s: float) -> list[int]:
    """Offsets of ``n`` sessions that all run at once: spread evenly over ``ramp_s``, so
    that their first requests do not land in the same millisecond."""
    step = ramp_s * 1e9 / n if n else 0.0
    return [round(i * step) for i in range(n)]


def restart(sessions: list[PlannedSession], starts: Sequence[int]) -> None:
    """Move each session (in order) to a new start, shifting all its requests' offsets by
    the same amount (think times and parent links are unchanged)."""
    for s, start in zip(sessions, starts, strict=True):
        delta = start - s.start_ns
        s.start_ns = start
        for q in s.requests:
            q.offset_ns += delta
