"""Export a trace so that other tools can replay it: Mooncake-style JSONL
(``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` per line, in arrival
order; import through ``traces.importers.mooncake``), or weka traces with their agent trees
(``to_weka``; import through ``traces.importers.weka``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from agent_replay.errors import OutputExistsError
from agent_replay.traces.hashing import extend_hashes
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.tree import MAIN


def to_mooncake_lines(table: pa.Table, meta: TraceMeta) -> list[bytes]:
    """One JSON line per request. Rows without hashes get fresh, unshared ids."""
    order = np.argsort(table.column("arrival_ns").to_numpy(), kind="stable")
    t = table.take(pa.array(order))
    arrival = t.column("arrival_ns").to_pylist()
    ins = t.column("input_tokens").to_pylist()
    outs = t.column("output_tokens").to_pylist()
    hashes = t.column("hash_ids").to_pylist()
    lines = []
    for i, (a, n_in, n_out, h) in enumerate(zip(arrival, ins, outs, hashes, strict=True)):
        ids = h if h is not None else extend_hashes([], -(-n_in // meta.block_size), f"row{i}")
        lines.append(
            orjson.dumps(
                {
                    "timestamp": a // 1_000_000,
                    "input_length": n_in,
                    "output_length": n_out,
                    "hash_ids": ids,
                }
            )
            + b"\n"
        )
    return lines


def write_mooncake(
    table: pa.Table, meta: TraceMeta, path: str | os.PathLike[str], *, force: bool = False
) -> Path:
    """Write atomically; refuses to overwrite unless ``force``."""
    dest = Path(path)
    if dest.exists() and not force:
        raise OutputExistsError(str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.writelines(to_mooncake_lines(table, meta))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


_JSON_SAFE = 1 << 53


def to_weka(table: pa.Table, meta: TraceMeta) -> list[dict[str, object]]:
    """One weka trace (WEKA convention, see ``traces.importers.weka``) per session: the main
    agent's calls in ``requests``, each subagent inline in its spawner's list, placed by its
    first call's arrival (its spawn), with inner ``t`` relative to it. ``hash_ids`` are the
    full blocks (``floor(in / block_size)``, the format hashes no partial block); a session
    whose ids are below 1 or not exact in JSON numbers gets them renumbered from 1 in
    order of first use; ``"convention": "WEKA"`` says which of the two conventions this
    is. ``think_time`` is the gap since the latest dependency's end."""
    from agent_replay.traces.tree import tree_columns

    t = tree_columns(table)
    cols = {
        name: t.column(name).to_pylist()
        for name in (
            "session_id",
            "request_index",
            "arrival_ns",
            "think_ns",
            "input_tokens",
            "output_tokens",
            "hash_ids",
            "model",
            "ttft_ns",
            "end_ns",
            "agent_id",
            "depends_on",
        )
    }
    bs = meta.block_size
    by_session: dict[str, list[int]] = {}
    for i, s in enumerate(cols["session_id"]):
        by_session.setdefault(str(s), []).append(i)
    return [_weka_session(sid, rows, cols, bs) for sid, rows in by_session.items()]


def trace_offset(ids: list[int]) -> int:
    """The ``k << TRACE_ID_SHIFT`` a weka import added to the ids of its k-th trace, when
    every id carries the same one (0: none, or ids of another origin)."""
    from agent_replay.traces.importers.weka import TRACE_ID_SHIFT

    if not ids or min(ids) < 1 or max(ids) >= _JSON_SAFE:
        return 0
    high = {h >> TRACE_ID_SHIFT for h in ids}
    if len(high) != 1:
        return 0
    offset = high.pop() << TRACE_ID_SHIFT
    return offset if min(ids) > offset else 0


def _weka_remap(ids_all: list[int]) -> dict[int, int] | None:
    """How a session's hash ids are written: back to a weka import's own ids (a re-import
    offsets them again), renumbered from 1 in order of first use when some are below 1 or
    not exact in JSON numbers (WEKA ids count from 1), else as they are (None)."""
    offset = trace_offset(ids_all)
    if offset:
        return {h: h - offset for h in ids_all}
    if not any(h < 1 or h >= _JSON_SAFE for h in ids_all):
        return None
    remap: dict[int, int] = {}
    for h in ids_all:
        remap.setdefault(h, len(remap) + 1)
    return remap


class _WekaSession:
    """One session's rows (``rows``, positions in ``cols``) as a weka trace: each agent's
    calls, and each subagent inline in its spawner's list."""

    def __init__(self, rows: list[int], cols: dict[str, list[Any]], bs: int) -> None:
        self.cols = cols
        self.bs = bs
        rows.sort(key=lambda r: (cols["arrival_ns"][r], cols["request_index"][r]))
        self.row_of = {cols["request_index"][r]: r for r in rows}
        self.remap = _weka_remap(
            [h for r in rows for h in (cols["hash_ids"][r] or ())[: cols["input_tokens"][r] // bs]]
        )
        self.agents: dict[str, list[int]] = {}
        for r in rows:
            self.agents.setdefault(cols["agent_id"][r], []).append(r)
        self.spawner = {a: self._spawner(a, rs) for a, rs in self.agents.items() if a != MAIN}

    def _spawner(self, agent: str, rs: list[int]) -> str:
        """The agent another agent's first call depends on (``MAIN`` when none)."""
        cols, row_of = self.cols, self.row_of
        cross = [
            cols["agent_id"][row_of[d]]
            for d in cols["depends_on"][rs[0]]
            if d in row_of and cols["agent_id"][row_of[d]] != agent
        ]
        return cross[0] if cross else MAIN

    def call(self, r: int, base_ns: int) -> dict[str, object]:
        cols = self.cols
        n_in = cols["input_tokens"][r]
        ids = (cols["hash_ids"][r] or [])[: n_in // self.bs]
        e: dict[str, object] = {
            "t": (cols["arrival_ns"][r] - base_ns) / 1e9,
            "type": "s" if cols["ttft_ns"][r] is not None else "n",
            "model": cols["model"][r] or "",
            "in": n_in,
            "out": cols["output_tokens"][r],
            "hash_ids": [self.remap[h] for h in ids] if self.remap is not None else list(ids),
        }
        for key, col in (("api_time", "end_ns"), ("ttft", "ttft_ns"), ("think_time", "think_ns")):
            if cols[col][r] is not None:
                e[key] = cols[col][r] / 1e9
        return e

    def stream(self, agent: str, base_ns: int) -> list[dict[str, object]]:
        """An agent's calls and its subagents, in order of arrival (a subagent after a
        call at the same time), ``t`` from ``base_ns``."""
        cols = self.cols
        items: list[tuple[int, int, dict[str, object]]] = [
            (cols["arrival_ns"][r], 0, self.call(r, base_ns)) for r in self.agents[agent]
        ]
        for sub in (s for s, sp in self.spawner.items() if sp == agent):
            rs = self.agents[sub]
            spawn = cols["arrival_ns"][rs[0]]
            items.append(
                (
                    spawn,
                    1,
                    {
                        "t": (spawn - base_ns) / 1e9,
                        "type": "subagent",
                        "agent_id": sub,
                        "duration_ms": self._duration_ms(rs, self.agents[agent]),
                        "models": sorted({str(cols["model"][r]) for r in rs if cols["model"][r]}),
                        "requests": self.stream(sub, spawn),
                    },
                )
            )
        items.sort(key=lambda x: (x[0], x[1]))
        return [x[2] for x in items]

    def _duration_ms(self, rs: list[int], parent_rows: list[int]) -> int:
        """The subagent's span, stretched or cut so that the importer's join rule
        (first later spawner call at or after the end) finds the join this trace has."""
        arrival = self.cols["arrival_ns"]
        spawn = arrival[rs[0]]
        end = max(arrival[r] + (self.cols["end_ns"][r] or 0) for r in rs)
        later = self._after(rs[-1], parent_rows)
        last_idx = self.cols["request_index"][rs[-1]]
        join = next(
            (k for k, r in enumerate(later) if last_idx in self.cols["depends_on"][r]), None
        )
        before = later if join is None else later[:join]
        if before:  # outlive the spawner's calls before the join
            end = max(end, arrival[before[-1]] + 1_000_000)
        ms = -(-(end - spawn) // 1_000_000)
        if join is not None:  # and end by the join
            ms = min(ms, (arrival[later[join]] - spawn) // 1_000_000)
        return int(ms)

    def _after(self, last: int, rows: list[int]) -> list[int]:
        """Those of ``rows`` after row ``last`` (by arrival, then request index)."""
        key = self.cols["arrival_ns"], self.cols["request_index"]
        return [r for r in rows if (key[0][r], key[1][r]) > (key[0][last], key[1][last])]


def _weka_session(
    sid: str, rows: list[int], cols: dict[str, list[Any]], bs: int
) -> dict[str, object]:
    s = _WekaSession(rows, cols, bs)
    return {
        "id": sid,
        "models": sorted({str(cols["model"][r]) for r in rows if cols["model"][r]}),
        "block_size": bs,
        "hash_id_scope": "local",
        "convention": "WEKA",
        "requests": s.stream(MAIN, 0) if MAIN in s.agents else [],
    }


def write_weka(
    table: pa.Table, meta: TraceMeta, path: str | os.PathLike[str], *, force: bool = False
) -> Path:
    """Write atomically: one trace object for ``.json`` (one session only), else one per
    line. Refuses to overwrite unless ``force``."""
    from agent_replay.errors import InputError

    dest = Path(path)
    if dest.exists() and not force:
        raise OutputExistsError(str(dest))
    traces = to_weka(table, meta)
    if dest.suffix == ".json" and len(traces) != 1:
        raise InputError(
            f"{dest}: a .json file holds one trace, this one has {len(traces)} "
            "sessions: write .jsonl (one trace per line)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.writelines(orjson.dumps(x) + b"\n" for x in traces)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
