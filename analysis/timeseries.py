"""A run over time, as pure functions of per-request intervals: requests in flight and
tokens per second in fixed bins. The PNG plots and the HTML report draw these.

Both are averages over each bin, not samples at its edges: a run of requests shorter than a
bin would otherwise show none in flight while tokens flow. Times are ns on the run's clock;
NaN entries (a request never sent, or without an end) are left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def bin_edges(
    start_ns: float, stop_ns: float, *, max_bins: int = 400, min_width_ns: float = 100e6
) -> np.ndarray:
    """Edges of equal bins over [start, stop]: 1 s wide when that gives at most ``max_bins``,
    else wider, and never narrower than ``min_width_ns`` (a short run gets 0.1 s bins)."""
    span = max(0.0, float(stop_ns) - float(start_ns))
    width = max(min_width_ns, 1e9 if span <= max_bins * 1e9 else span / max_bins)
    if span < 1e9:  # a run shorter than a second: 0.1 s bins instead of one
        width = min_width_ns
    n = max(1, int(np.ceil(span / width)))
    edges = float(start_ns) + width * np.arange(n + 1, dtype=np.float64)
    if span > 0:
        edges[-1] = float(stop_ns)  # the last bin ends with the run (narrower, not diluted)
    return edges


def _ramp(points: np.ndarray, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum over i of weights[i] * max(0, x - points[i]), for each x (sorted prefix sums)."""
    order = np.argsort(points, kind="stable")
    p, w = points[order], weights[order]
    cw = np.concatenate(([0.0], np.cumsum(w)))
    cwp = np.concatenate(([0.0], np.cumsum(w * p)))
    k = np.searchsorted(p, x, side="right")
    return cw[k] * x - cwp[k]


def _covered(
    start: np.ndarray, end: np.ndarray, weight: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per bin, sum over requests of weight x (ns of [start, end] inside the bin), as
    differences of F(x) = sum of weight x clip(x - start, 0, end - start)."""
    o = edges[0]  # times from the first edge: prefix sums of run-clock ns lose precision
    f = _ramp(start - o, weight, edges - o) - _ramp(end - o, weight, edges - o)
    return np.diff(f)


def mean_in_flight(sent_ns: np.ndarray, end_ns: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean number of requests in flight in each bin: the time each request spent between
    its send and its last byte inside the bin, summed, over the bin's width."""
    sent = np.asarray(sent_ns, dtype=np.float64)
    end = np.asarray(end_ns, dtype=np.float64)
    keep = ~np.isnan(sent) & ~np.isnan(end) & (end >= sent)
    sent, end = sent[keep], end[keep]
    return _covered(sent, end, np.ones(sent.size), edges) / np.diff(edges)


def spread_rate(
    start_ns: np.ndarray, end_ns: np.ndarray, amount: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per bin, ``amount`` per second, each request's amount spread evenly over its
    [start, end] (all of it in the bin of ``end`` when start == end)."""
    start = np.asarray(start_ns, dtype=np.float64)
    end = np.asarray(end_ns, dtype=np.float64)
    amt = np.asarray(amount, dtype=np.float64)
    keep = ~np.isnan(start) & ~np.isnan(end) & ~np.isnan(amt) & (end >= start)
    start, end, amt = start[keep], end[keep], amt[keep]
    widths = np.diff(edges)
    total = np.zeros(widths.size)
    point = end == start
    if point.any():
        idx = np.clip(np.searchsorted(edges, end[point], side="right") - 1, 0, widths.size - 1)
        total += np.bincount(idx, weights=amt[point], minlength=widths.size)
    span = ~point
    if span.any():
        s, e = start[span], end[span]
        total += _covered(s, e, amt[span] / (e - s), edges)  # amount per ns x ns covered
    return total / (widths / 1e9)


def _lane_labels(sid: list[str], clone: list[Any], agent: list[Any]) -> list[str]:
    """Each row's lane: ``s``, ``s #clone`` when the run has clones, ``... / agent`` when
    the session has more than one agent."""
    cloned = any(c for c in clone)
    agents: dict[str, set[Any]] = {}
    for s, a in zip(sid, agent, strict=True):
        agents.setdefault(s, set()).add(a)
    keys = []
    for s, c, a in zip(sid, clone, agent, strict=True):
        label = s + (f" #{c}" if cloned else "")
        if len(agents[s]) > 1 and a is not None:
            label += f" / {a}"
        keys.append(label)
    return keys


def lanes(per_request: Any) -> tuple[list[str], np.ndarray]:
    """A timeline lane per (session, clone, agent) of a report's per-request table: the
    lanes' labels and each row's lane index. Clones of a session get lanes of their own
    (``s #clone``, when the run has clones), so do a session's subagents (``s / agent``,
    when it has more than one agent); lanes are in the order of their first intended send."""
    t = per_request
    sid = [str(s) for s in t.column("session_id").to_pylist()]
    clone = t.column("clone").to_pylist()
    agent = t.column("agent_id").to_pylist() if "agent_id" in t.column_names else [None] * len(sid)
    keys = _lane_labels(sid, clone, agent)
    start = np.asarray(t.column("intended_ns").to_numpy(zero_copy_only=False), dtype=np.float64)
    first: dict[str, float] = {}
    for k, v in zip(keys, start, strict=True):
        first[k] = min(first.get(k, np.inf), v)
    order = sorted(first, key=lambda k: (first[k], k))
    index = {k: i for i, k in enumerate(order)}
    return order, np.asarray([index[k] for k in keys], dtype=np.int64)
