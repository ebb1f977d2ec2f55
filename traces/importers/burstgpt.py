"""BurstGPT CSV (HPMLL/BurstGPT): ``Timestamp`` (seconds from trace start), ``Model``,
``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``; the newer release
adds ``Session ID`` and ``Elapsed time`` (seconds).

With ``Session ID`` the rows of a session become one chain in time order, and the think
time before a request is its arrival minus the previous request's arrival plus elapsed
time (when ``Elapsed time`` is present, clamped at 0). Without it every row is a session.
No prefix hashes.
"""

from __future__ import annotations

from pathlib import Path

from agent_replay.traces.builder import Request, build_table, concat
from agent_replay.traces.importers._common import ImportOptions, ImportResult, fail, read_csv
from agent_replay.traces.schema import TraceMeta

NAME = "burstgpt"
REQUIRED = ("Timestamp", "Request tokens", "Response tokens")


def sniff(path: Path, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").lstrip("\ufeff")
    cols = {c.strip() for c in first.split(",")}
    return set(REQUIRED) <= cols


def _num(cell: str, path: Path, line: int, name: str) -> float:
    try:
        v = float(cell)
    except ValueError as exc:
        raise fail(path, line, f"field {name!r} must be a number, got {cell!r}") from exc
    if v < 0 or v != v:
        raise fail(path, line, f"field {name!r} must be >= 0, got {cell!r}")
    return v


def _load_one(path: Path, tag: str) -> tuple[list[Request], bool]:
    header, rows = read_csv(path)
    col = {name: i for i, name in enumerate(header)}
    missing = [c for c in REQUIRED if c not in col]
    if missing:
        raise fail(path, 1, f"CSV header lacks column {missing[0]!r}")
    has_session = "Session ID" in col
    reqs: list[Request] = []
    for line, cells in rows:
        if len(cells) != len(header):
            raise fail(path, line, f"expected {len(header)} fields, got {len(cells)}")
        reqs.append(_request(cells, col, path, line, tag))
    if not reqs:
        raise fail(path, None, "no requests in file")
    if has_session:
        _chain_sessions(reqs)
    return reqs, has_session


def _request(cells: list[str], col: dict[str, int], path: Path, line: int, tag: str) -> Request:
    """One CSV row: its own session unless the file has session ids."""
    t = _num(cells[col["Timestamp"]], path, line, "Timestamp")
    n_in = int(_num(cells[col["Request tokens"]], path, line, "Request tokens"))
    n_out = int(_num(cells[col["Response tokens"]], path, line, "Response tokens"))
    session = f"{tag}{cells[col['Session ID']].strip()}" if "Session ID" in col else f"{tag}{line}"
    r = Request(
        session=session,
        key=line,
        arrival_abs_ns=round(t * 1e9),
        input_tokens=n_in,
        output_tokens=n_out,
        model=cells[col["Model"]].strip() or None if "Model" in col else None,
    )
    if "Elapsed time" in col:
        r.end_ns = round(_num(cells[col["Elapsed time"]], path, line, "Elapsed time") * 1e9)
    return r


def _chain_sessions(reqs: list[Request]) -> None:
    """Each request's parent is its session's previous one by arrival; think time from
    that one's end when known."""
    last: dict[str, Request] = {}
    for r in sorted(reqs, key=lambda r: r.arrival_abs_ns):
        prev = last.get(r.session)
        if prev is not None:
            r.parent_key = prev.key
            if prev.end_ns is not None:
                r.think_ns = max(0, r.arrival_abs_ns - prev.arrival_abs_ns - prev.end_ns)
        last[r.session] = r


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    reqs: list[Request] = []
    sessions = True
    for p in paths:
        part, has = _load_one(p, f"{p.stem}-" if len(paths) > 1 else "bg-")
        reqs += part
        sessions = sessions and has
    table, _ = build_table(reqs)
    meta = TraceMeta(
        block_size=opts.block_size or 16,
        source=f"imported:{NAME}",
        extra={"imported_from": [p.name for p in paths]},
    )
    notes = [
        "sessions from 'Session ID'" if sessions else "no 'Session ID': one session per request",
        "no prefix hashes",
    ]
    return ImportResult(concat([table]), meta, NAME, notes)
