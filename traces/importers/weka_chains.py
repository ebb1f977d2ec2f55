"""Flattened agents in a weka trace: runs of calls recorded in one stream (a trace's
top-level ``requests`` or one subagent's) that belong to another agent, found by their hash
ids as AIPerf 0.13.0's weka loader finds them (``weka_agent_chains.detect_agent_chains``
with its default settings), so that a replay splits them off as AIPerf's does.

The rule, on one stream's calls in ``(t, index)`` order:

* Preamble: when the earliest call shares no leading hash id with any other call and is
  either small (``out`` <= 64) or shares no hash id at all with them, it is set aside and
  rejoins the main chain afterwards (a title-generation call must not found the main chain).
* Phase 1, greedy: a call without hash ids stays on the main chain (chain 0). A call
  extends the chain whose last hashed call (its tail) is a whole prefix of its hash ids,
  has ended by its ``t`` (1 us slack) and ran on the same model; the deepest such tail
  wins, ties to the older chain. Otherwise it founds a new chain, forked from the tail with
  the longest common prefix (ties: the longer tail, then the older chain); a call sharing
  no prefix with any tail forks from nothing (depth 0), except while no chain has a hashed
  call yet, when it joins chain 0.
* Phase 2, seams: for each tail that forks were taken from, in index order, while it is
  still its chain's last hashed call, the fork of the same model, depth > 0, starting at or
  after the tail's end, and not both more than 3,600 s after that end and sharing under half
  of the tail's blocks, with the deepest prefix (ties: the earlier start, then the older
  chain) is the same agent continuing after a context edit: its calls join the tail's chain;
  the other forks of that tail are then measured against the chain's new tail (when they
  share a prefix with it) and get their own turn at being elected.
* The main chain is the one holding the earliest call; every other chain that was not
  joined onto another is a flattened agent, numbered by its first call's ``(t, index)``.

A flattened agent is replayed as a subagent of its stream's agent: spawned off the
stream's last main-chain call before its first call and joined by the first later one
whose ``t`` is at or after its end (the latest end of its calls).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent_replay.traces.tree import MAIN

EPS_S = 1e-6
TITLE_MAX_OUT = 64
SEAM_MAX_GAP_S = 3600.0
SEAM_MIN_OVERLAP = 0.5


@dataclass(frozen=True, slots=True)
class ChainCall:
    """One call of a stream: its position in the stream, start and end (seconds, on one
    clock), model, hash ids and token counts."""

    index: int
    t: float
    end: float
    model: str
    hash_ids: tuple[int, ...]
    n_in: int
    n_out: int


@dataclass(slots=True)
class _Chain:
    calls: list[ChainCall] = field(default_factory=list)
    fork_parent: int | None = None
    fork_tail: int | None = None
    depth: int = 0
    fork_t: float = 0.0
    forked: bool = False
    spliced_into: int | None = None
    tail: ChainCall | None = None


def flat_agent_id(owner: str | None, n: int) -> str:
    """The agent id of the ``n``-th flattened agent of the top level (``owner`` None) or of
    subagent ``owner``: AIPerf's session-id suffix (``trace::fa:000``,
    ``trace::sa:<owner>:fa:000``)."""
    return f"fa:{n:03d}" if owner is None else f"{owner}:fa:{n:03d}"


def flat_owner(agent_id: str) -> str | None:
    """The stream whose calls a flattened agent was split off: ``MAIN`` for ``fa:NNN``,
    ``<subagent>`` for ``<subagent>:fa:NNN``; None for any other agent id (the inverse of
    ``flat_agent_id``)."""
    head, sep, num = agent_id.rpartition("fa:")
    if not sep or len(num) < 3 or not num.isdigit():
        return None
    if head == "":
        return MAIN
    return head[:-1] if head.endswith(":") and len(head) > 1 else None


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _preamble(calls: list[ChainCall]) -> tuple[list[ChainCall], list[ChainCall]]:
    if len(calls) < 2:
        return [], calls
    first, rest = calls[0], calls[1:]
    if not first.hash_ids:
        return [], calls
    if any(_lcp(first.hash_ids, o.hash_ids) > 0 for o in rest if o.hash_ids):
        return [], calls
    if first.n_out > TITLE_MAX_OUT:
        seen = {h for o in rest for h in o.hash_ids}
        if not seen.isdisjoint(first.hash_ids):
            return [], calls
    return [first], rest


def _extension(chains: list[_Chain], c: ChainCall) -> int | None:
    best, best_len = None, -1
    for i, ch in enumerate(chains):
        tl = ch.tail
        if tl is None or len(tl.hash_ids) > len(c.hash_ids) or len(tl.hash_ids) <= best_len:
            continue
        if tl.model != c.model or tl.end > c.t + EPS_S:
            continue
        if c.hash_ids[: len(tl.hash_ids)] == tl.hash_ids:
            best, best_len = i, len(tl.hash_ids)
    return best


def _deepest(chains: list[_Chain], h: tuple[int, ...]) -> tuple[int | None, int]:
    best, key = None, (0, 0)
    for i, ch in enumerate(chains):
        if ch.tail is None:
            continue
        d = _lcp(ch.tail.hash_ids, h)
        if d and (d, len(ch.tail.hash_ids)) > key:
            best, key = i, (d, len(ch.tail.hash_ids))
    return best, key[0]


def _last_hashed(ch: _Chain) -> int | None:
    return next((c.index for c in reversed(ch.calls) if c.hash_ids), None)


@dataclass(slots=True)
class _Chains:
    """The chains of one stream as phase 1 builds them: which chain holds each call, and
    the forks taken from each tail (by the tail's index)."""

    chains: list[_Chain] = field(default_factory=list)
    chain_of: dict[int, int] = field(default_factory=dict)
    forks_by_tail: dict[int, list[int]] = field(default_factory=dict)

    def append(self, i: int, c: ChainCall) -> None:
        self.chains[i].calls.append(c)
        self.chain_of[c.index] = i
        if c.hash_ids:
            self.chains[i].tail = c

    def resolve(self, i: int) -> int:
        """The chain that chain ``i`` was spliced into, at the end of the splices."""
        while (into := self.chains[i].spliced_into) is not None:
            i = into
        return i

    def place(self, c: ChainCall) -> None:
        """Phase 1 for one call: extend a chain, fork a new one, or join the main chain."""
        if not c.hash_ids or not self.chains:
            if not self.chains:
                self.chains.append(_Chain())
            self.append(0, c)
            return
        target = _extension(self.chains, c)
        if target is not None:
            self.append(target, c)
            return
        parent, depth = _deepest(self.chains, c.hash_ids)
        if parent is None and all(ch.tail is None for ch in self.chains):
            self.append(0, c)
            return
        self._fork(c, parent, depth)

    def _fork(self, c: ChainCall, parent: int | None, depth: int) -> None:
        tail = self.chains[parent].tail if parent is not None else None
        self.chains.append(
            _Chain(
                fork_parent=parent,
                fork_tail=None if tail is None else tail.index,
                depth=depth,
                fork_t=c.t,
                forked=True,
            )
        )
        new = len(self.chains) - 1
        self.append(new, c)
        if tail is not None and depth > 0:
            self.forks_by_tail.setdefault(tail.index, []).append(new)

    def splice(self, elected: int, owner: int) -> None:
        """Chain ``elected`` continues chain ``owner``: its calls join it."""
        self.chains[owner].calls.extend(self.chains[elected].calls)
        for c in self.chains[elected].calls:
            self.chain_of[c.index] = owner
        self.chains[elected].spliced_into = owner


def detect(calls: list[ChainCall]) -> tuple[list[int], list[list[int]]]:
    """(main chain, flattened agents) of one stream, each as its calls' ``index`` values in
    ``(t, index)`` order; the agents in AIPerf's numbering (``fa:000`` first). No agents:
    the main chain is every call."""
    ordered = sorted(calls, key=lambda c: (c.t, c.index))
    everything = [c.index for c in ordered]
    if len(ordered) < 2:
        return everything, []
    pre, rest = _preamble(ordered)
    state = _Chains()
    for c in rest:
        state.place(c)
    if not state.chains:
        return everything, []
    _seams(state, {c.index: c for c in rest})
    return _split(state, pre, rest[0]) or (everything, [])


def _split(
    state: _Chains, pre: list[ChainCall], first: ChainCall
) -> tuple[list[int], list[list[int]]] | None:
    """(main chain with the preamble, flattened agents in AIPerf's numbering) after the
    seams; None when no chain other than the one holding ``first`` is left."""
    chains = state.chains
    main = state.resolve(state.chain_of[first.index])
    workers = [i for i, ch in enumerate(chains) if ch.spliced_into is None and i != main]
    if not workers:
        return None
    workers.sort(key=lambda i: (chains[i].calls[0].t, chains[i].calls[0].index))
    main_calls = sorted(pre + chains[main].calls, key=lambda c: (c.t, c.index))
    return [c.index for c in main_calls], [[c.index for c in chains[i].calls] for i in workers]


def _elect(chains: list[_Chain], registered: list[int], tail: ChainCall) -> int | None:
    blocks = len(tail.hash_ids)

    def blocked(i: int) -> bool:
        if blocks == 0:
            return False
        gap = chains[i].calls[0].t - tail.end
        return gap > SEAM_MAX_GAP_S and chains[i].depth / blocks < SEAM_MIN_OVERLAP

    cands = [
        i
        for i in registered
        if chains[i].forked
        and chains[i].depth > 0
        and tail.end <= chains[i].calls[0].t + EPS_S
        and chains[i].calls[0].model == tail.model
        and not blocked(i)
    ]
    if not cands:
        return None
    return max(cands, key=lambda i: (chains[i].depth, -chains[i].fork_t, -i))


def _rekey(
    state: _Chains, registered: list[int], elected: int, owner: int, new_tail: ChainCall
) -> bool:
    """Measure the other forks of a tail that was just continued against its chain's new
    tail (those sharing a prefix with it are registered there); whether any was."""
    rekeyed = False
    for i in registered:
        ch = state.chains[i]
        if i == elected or ch.spliced_into is not None or not ch.forked:
            continue
        d = _lcp(new_tail.hash_ids, ch.calls[0].hash_ids)
        if d <= 0:
            continue
        ch.fork_tail, ch.depth, ch.fork_parent = new_tail.index, d, owner
        state.forks_by_tail.setdefault(new_tail.index, []).append(i)
        rekeyed = True
    return rekeyed


def _seams(state: _Chains, by_index: dict[int, ChainCall]) -> None:
    chains, forks_by_tail = state.chains, state.forks_by_tail
    keys = sorted(forks_by_tail)
    heapq.heapify(keys)
    done: set[int] = set()
    while keys:
        tail_ix = heapq.heappop(keys)
        if tail_ix in done:
            continue
        done.add(tail_ix)
        owner = state.resolve(state.chain_of[tail_ix])
        if _last_hashed(chains[owner]) != tail_ix:
            continue
        registered = [i for i in forks_by_tail[tail_ix] if chains[i].spliced_into is None]
        elected = _elect(chains, registered, by_index[tail_ix])
        if elected is None:
            continue
        state.splice(elected, owner)
        new_tail = _last_hashed(chains[owner])
        if new_tail is not None and _rekey(state, registered, elected, owner, by_index[new_tail]):
            done.discard(new_tail)
            heapq.heappush(keys, new_tail)


def _latest_done(
    idx: list[int], i: int, starts: Sequence[float], ends: Sequence[float]
) -> int | None:
    """Among calls ``idx``, the one with the latest end of those that started before call
    ``i`` and ended at or before its start."""
    done = [j for j in idx if starts[j] < starts[i] and ends[j] <= starts[i]]
    return max(done, key=lambda j: (ends[j], starts[j], j)) if done else None


def _not_superseded(
    frontier: list[int], starts: Sequence[float], ends: Sequence[float]
) -> list[int]:
    """The waits of ``frontier`` that no other of them started after, sorted."""
    return sorted(
        j
        for j in frontier
        if not any(starts[j] < starts[k] and ends[j] <= starts[k] for k in frontier if k != j)
    )


def interval_waits(
    streams: Sequence[str], starts: Sequence[float], ends: Sequence[float]
) -> list[list[int]]:
    """AIPerf's recorded-interval waits among the streams of one scope (a trace's main
    stream and its flattened agents, or a subagent and its own): call ``i`` also waits, for
    every other stream, for that stream's call with the latest end among those that started
    before ``i`` and ended at or before ``i``'s start, unless another of these waits started
    after that one ended. Positions in the given lists; ``ends`` absolute (start + duration,
    a missing duration counting as 0)."""
    by: dict[str, list[int]] = {}
    for i, s in enumerate(streams):
        by.setdefault(s, []).append(i)
    out: list[list[int]] = []
    for i, s in enumerate(streams):
        latest = (_latest_done(idx, i, starts, ends) for other, idx in by.items() if other != s)
        out.append(_not_superseded([j for j in latest if j is not None], starts, ends))
    return out
