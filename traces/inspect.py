"""Presentation of ``traces inspect`` and ``traces head``: rich renderables built from
``traces.stats`` numbers. No computation beyond formatting."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agent_replay.safetext import text, visible
from agent_replay.traces.schema import TraceMeta
from agent_replay.traces.stats import AgentStream, SessionCache, TraceSummary

BARS = "▁▂▃▄▅▆▇█"


def sparkline(counts: list[int], width: int = 60) -> str:
    """Counts as block characters, summed into at most ``width`` buckets."""
    if not counts:
        return ""
    step = max(1, -(-len(counts) // width))
    buckets = [sum(counts[i : i + step]) for i in range(0, len(counts), step)]
    top = max(buckets) or 1
    return "".join(
        BARS[min(len(BARS) - 1, (b * (len(BARS) - 1) + top - 1) // top)] if b else " "
        for b in buckets
    )


def _dur(ns: float) -> str:
    s = ns / 1e9
    if s < 120:
        return f"{s:.3f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _pct_row(name: str, p: dict[str, float], fmt: str = "{:,.0f}") -> list[str]:
    if not p.get("count"):
        return [name, "0", "-", "-", "-", "-", "-", "-"]
    return [name, f"{int(p['count']):,}"] + [
        fmt.format(p[k]) for k in ("min", "mean", "p50", "p90", "p99", "max")
    ]


_Row = tuple[str, "str | Text"]


def _trace_rows(s: TraceSummary, meta: TraceMeta, path: str) -> list[_Row]:
    """What the trace is: its file, origin, size and arrivals over time."""
    rows: list[_Row] = [
        ("trace", text(path)),
        (
            "source",
            text(
                f"{meta.source} (schema v{meta.schema_version}, block size "
                f"{meta.block_size}, content {meta.content_mode})"
            ),
        ),
    ]
    if meta.start_wall_ns:
        start = dt.datetime.fromtimestamp(meta.start_wall_ns / 1e9, tz=dt.timezone.utc)
        rows.append(("started", start.isoformat(timespec="milliseconds")))
    rows += [
        ("requests", f"{s.requests:,} in {s.sessions:,} sessions"),
        ("time span", _dur(s.span_ns)),
    ]
    if s.span_ns > 0:
        rows.append(
            (
                "arrival rate",
                f"{s.requests / (s.span_ns / 1e9):,.3f} req/s "
                f"({s.requests / (s.span_ns / 6e10):,.1f} req/min)",
            )
        )
    if len(s.per_minute) > 1:
        per = max(1, -(-len(s.per_minute) // 60))
        rows.append(
            (
                "per minute" if per == 1 else f"per {per} min",
                Text(sparkline(s.per_minute), style="cyan")
                + Text(f"  max {max(s.per_minute):,}/min"),
            )
        )
    rows.append(("tokens", f"{s.total_input_tokens:,} in, {s.total_output_tokens:,} out"))
    return rows


def _cache_rows(s: TraceSummary) -> list[_Row]:
    """Prefix reuse as the hash ids imply it, the original server's cached tokens, and the
    models."""
    rows: list[_Row] = []
    if s.prefix_reuse is not None:
        rows.append(
            (
                "prefix reuse",
                f"{s.prefix_reuse:.1%} of input blocks hit an unbounded "
                f"prefix cache ({s.implied_cached_total or 0:,} tokens)",
            )
        )
    else:
        rows.append(("prefix reuse", "unknown (no hash ids)"))
    server = s.server_cached_rate
    if server is not None:
        implied = s.implied_cached_rate
        vs = f"; the trace implies {implied:.1%}" if implied is not None else ""
        of = (
            "input"
            if s.cached_input_total == s.total_input_tokens
            else "the input of the requests it answered"
        )
        rows.append(
            (
                "cached (orig.)",
                f"{s.cached_tokens_total:,} tokens "
                f"({server:.1%} of {of}, by the server's usage{vs})",
            )
        )
    if s.models:
        rows.append(
            (
                "models",
                text(
                    ", ".join(
                        f"{k} ({v:,})"
                        for k, v in sorted(s.models.items(), key=lambda kv: -kv[1])[:5]
                    )
                ),
            )
        )
    return rows


def _distributions(s: TraceSummary) -> Table:
    pt = Table(title="distributions", title_justify="left")
    for col in ("", "count", "min", "mean", "p50", "p90", "p99", "max"):
        pt.add_column(col, justify="left" if not col else "right")
    pt.add_row(*_pct_row("input tokens", s.input_tokens))
    pt.add_row(*_pct_row("output tokens", s.output_tokens))
    pt.add_row(*_pct_row("turns / session", s.turns_per_session, "{:,.1f}"))
    if s.think_s.get("count"):
        pt.add_row(*_pct_row("think time (s)", s.think_s, "{:,.3f}"))
    else:
        pt.add_row("think time (s)", "0", "unknown", "", "", "", "", "")
    return pt


def render_summary(s: TraceSummary, meta: TraceMeta, path: str) -> RenderableType:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for label, value in _trace_rows(s, meta, path) + _cache_rows(s):
        head.add_row(label, value)
    parts: list[RenderableType] = [head, Text(""), _distributions(s)]
    if s.sessions_cache:
        parts += [Text(""), render_session_cache(s.sessions_cache)]
    if s.agents:
        parts += [Text(""), render_agents(s.agents)]
    return Group(*parts)


def render_agents(rows: list[AgentStream], limit: int = 40) -> RenderableType:
    """The agent streams of sessions with subagents or side lanes, with the request that
    spawned each and the one that joined it (``traces.stats.agent_streams``)."""
    t = Table(title="agents (sessions with more than one stream)", title_justify="left")
    for col in ("session", "agent", "turns", "requests", "spawned by", "joined by"):
        t.add_column(col, justify="left" if col in ("session", "agent") else "right")
    for r in rows[:limit]:
        t.add_row(
            text(r.session_id),
            text(r.agent_id),
            f"{r.turns:,}",
            f"{r.first}-{r.last}",
            "-" if r.spawned_by is None else f"#{r.spawned_by}",
            "-" if r.joined_by is None else f"#{r.joined_by}",
        )
    if len(rows) > limit:
        t.add_row(f"... {len(rows) - limit:,} more", "", "", "", "", "")
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render_session_cache(rows: list[SessionCache], limit: int = 30) -> RenderableType:
    """Per session: prompt tokens the original server reported cached vs those the
    trace's hash ids imply (``traces.stats.session_cache``)."""
    t = Table(
        title="prefix cache per session: server (recorded) vs trace (implied)", title_justify="left"
    )
    for col in ("session", "requests", "input tokens", "server cached", "trace implies"):
        t.add_column(col, justify="left" if col == "session" else "right")
    for r in rows[:limit]:
        t.add_row(
            text(r.session_id),
            f"{r.requests:,}",
            f"{r.input_tokens:,}",
            _pct(r.server_rate),
            _pct(r.implied_rate),
        )
    if len(rows) > limit:
        t.add_row(f"... {len(rows) - limit:,} more", "", "", "", "")
    return t


SESSION_WIDTH = 18
"""Session ids longer than this are cut (with an ellipsis): the row stays on one line."""
AGENT_WIDTH = 12


def _secs(v: object) -> str:
    return "-" if v is None else f"{int(v) / 1e9:,.3f}"  # type: ignore[call-overload]


def _cut(s: str, width: int) -> str:
    s = visible(s)
    return s if len(s) <= width else s[: width - 1] + "…"


@dataclass(frozen=True, slots=True)
class _HeadCol:
    """A column of ``traces head``: its title, alignment, cell text of a row, and the trace
    column it shows."""

    title: str
    justify: str
    cell: Callable[[dict[str, Any]], str]
    column: str


_SESSION_COL = _HeadCol(
    "session", "left", lambda r: _cut(str(r["session_id"]), SESSION_WIDTH), "session_id"
)
_INDEX_COL = _HeadCol("#", "right", lambda r: str(r["request_index"]), "request_index")
_AFTER_COL = _HeadCol(
    "after", "left", lambda r: ",".join(map(str, r["depends_on"] or [])) or "-", "depends_on"
)
_PARENT_COL = _HeadCol("parent", "right", lambda r: str(r["parent_index"]), "parent_index")
_AGENT_COL = _HeadCol(
    "agent", "left", lambda r: _cut(str(r["agent_id"] or "-"), AGENT_WIDTH), "agent_id"
)
_TIMING_COLS = (
    _HeadCol("arrival s", "right", lambda r: _secs(r["arrival_ns"]), "arrival_ns"),
    _HeadCol("think s", "right", lambda r: _secs(r.get("think_ns")), "think_ns"),
    _HeadCol("in tok", "right", lambda r: f"{r['input_tokens']:,}", "input_tokens"),
    _HeadCol("out tok", "right", lambda r: f"{r['output_tokens']:,}", "output_tokens"),
)
_OPTIONAL_COLS = (
    _HeadCol(
        "cached",
        "right",
        lambda r: "-" if r["cached_tokens"] is None else f"{r['cached_tokens']:,}",
        "cached_tokens",
    ),
    _HeadCol("blocks", "right", lambda r: str(len(r["hash_ids"] or [])), "hash_ids"),
)
_API_COL = _HeadCol("api", "left", lambda r: visible(r.get("api") or "-"), "api")
_DROPPED_FIRST = ("cached", "blocks", "agent", "after", "parent")
"""The columns left out, in this order, while the table is wider than asked."""


def _head_columns(present: set[str], shared: list[str]) -> list[_HeadCol]:
    cols = [_SESSION_COL, _INDEX_COL, _AFTER_COL if "depends_on" in present else _PARENT_COL]
    if "agent_id" in present:
        cols.append(_AGENT_COL)
    cols += _TIMING_COLS
    cols += [c for c in _OPTIONAL_COLS if c.column in present]
    if "api" in present and "api" not in shared:
        cols.append(_API_COL)
    return cols


def _fit(cols: list[_HeadCol], cells: dict[str, list[str]], width: int) -> list[_HeadCol]:
    """``cols`` less those that must go (``_DROPPED_FIRST``) for the table to fit ``width``."""

    def needed(cs: list[_HeadCol]) -> int:
        return sum(max([len(c.title)] + [len(v) for v in cells[c.title]]) for c in cs) + len(cs) - 1

    for drop in _DROPPED_FIRST:
        if needed(cols) <= width:
            break
        cols = [c for c in cols if c.title != drop]
    return cols


def _head_notes(
    table: pa.Table,
    rows: list[dict[str, Any]],
    cols: list[_HeadCol],
    shared: list[str],
    present: set[str],
) -> list[str]:
    """The lines below the table: the values every row shares, the columns not shown."""
    shown = {c.column for c in cols} | {"parent_index"}
    notes = [f"{c}: {visible(rows[0][c])}" for c in shared]
    more = [c for c in table.column_names if c not in shown and c not in shared and c in present]
    lines = []
    if notes:
        lines.append("every row above: " + "; ".join(notes))
    if more:
        lines.append(
            "also in the trace: "
            + ", ".join(map(visible, more))
            + " (agent-replay traces inspect summarizes them)"
        )
    return lines


def _shared(rows: list[dict[str, Any]], present: set[str]) -> list[str]:
    """The columns said once below the table: api and model where every row has the same."""
    return [c for c in ("api", "model") if c in present and len({r.get(c) for r in rows}) == 1]


def render_head(table: pa.Table, n: int, width: int = 80) -> RenderableType:
    """The first ``n`` rows within ``width`` columns: one line per request with times in
    seconds and token counts. Columns every row shares (api, model) are said once below the
    table; optional columns that do not fit (cached, blocks, agent, dependencies, in this
    order) and the others present are named there rather than squeezed in."""
    rows = table.slice(0, n).to_pylist()
    present = {c for c in table.column_names if any(r.get(c) is not None for r in rows)}
    shared = _shared(rows, present)
    cols = _head_columns(present, shared)
    cells = {c.title: [c.cell(r) for r in rows] for c in cols}
    cols = _fit(cols, cells, width)
    lines = _head_notes(table, rows, cols, shared, present)
    return Group(_head_table(cols, cells, len(rows)), *(Text(line, style="dim") for line in lines))


def _head_table(cols: list[_HeadCol], cells: dict[str, list[str]], n: int) -> Table:
    t = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for c in cols:
        t.add_column(c.title, justify=c.justify, no_wrap=True)  # type: ignore[arg-type]
    for i in range(n):
        t.add_row(*(Text(cells[c.title][i]) for c in cols))
    return t
