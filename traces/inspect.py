"""Presentation of ``traces inspect`` and ``traces head``: rich renderables built from
``traces.stats`` numbers. No computation beyond formatting."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
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
    buckets = [sum(counts[i:i + step]) for i in range(0, len(counts), step)]
    top = max(buckets) or 1
    return "".join(BARS[min(len(BARS) - 1, (b * (len(BARS) - 1) + top - 1) // top)] if b else " "
                   for b in buckets)


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
    return [name, f"{int(p['count']):,}"] + [fmt.format(p[k]) for k in ("min", "mean", "p50", "p90", "p99", "max")]


def render_summary(s: TraceSummary, meta: TraceMeta, path: str) -> RenderableType:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("trace", text(path))
    head.add_row("source", text(f"{meta.source} (schema v{meta.schema_version}, block size "
                                f"{meta.block_size}, content {meta.content_mode})"))
    if meta.start_wall_ns:
        start = dt.datetime.fromtimestamp(meta.start_wall_ns / 1e9, tz=dt.timezone.utc)
        head.add_row("started", start.isoformat(timespec="milliseconds"))
    head.add_row("requests", f"{s.requests:,} in {s.sessions:,} sessions")
    head.add_row("time span", _dur(s.span_ns))
    if s.span_ns > 0:
        head.add_row("arrival rate", f"{s.requests / (s.span_ns / 1e9):,.3f} req/s "
                                     f"({s.requests / (s.span_ns / 6e10):,.1f} req/min)")
    if len(s.per_minute) > 1:
        per = max(1, -(-len(s.per_minute) // 60))
        head.add_row("per minute" if per == 1 else f"per {per} min",
                     Text(sparkline(s.per_minute), style="cyan") + Text(f"  max {max(s.per_minute):,}/min"))
    head.add_row("tokens", f"{s.total_input_tokens:,} in, {s.total_output_tokens:,} out")
    if s.prefix_reuse is not None:
        head.add_row("prefix reuse", f"{s.prefix_reuse:.1%} of input blocks hit an unbounded prefix "
                                     f"cache ({s.implied_cached_total or 0:,} tokens)")
    else:
        head.add_row("prefix reuse", "unknown (no hash ids)")
    server = s.server_cached_rate
    if server is not None:
        implied = s.implied_cached_rate
        vs = f"; the trace implies {implied:.1%}" if implied is not None else ""
        of = ("input" if s.cached_input_total == s.total_input_tokens
              else "the input of the requests it answered")
        head.add_row("cached (orig.)", f"{s.cached_tokens_total:,} tokens "
                                       f"({server:.1%} of {of}, by the server's usage{vs})")
    if s.models:
        head.add_row("models", text(", ".join(
            f"{k} ({v:,})" for k, v in sorted(s.models.items(), key=lambda kv: -kv[1])[:5])))

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
    parts: list[RenderableType] = [head, Text(""), pt]
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
        t.add_row(text(r.session_id), text(r.agent_id), f"{r.turns:,}", f"{r.first}-{r.last}",
                  "-" if r.spawned_by is None else f"#{r.spawned_by}",
                  "-" if r.joined_by is None else f"#{r.joined_by}")
    if len(rows) > limit:
        t.add_row(f"... {len(rows) - limit:,} more", "", "", "", "", "")
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render_session_cache(rows: list[SessionCache], limit: int = 30) -> RenderableType:
    """Per session: prompt tokens the original server reported cached vs those the
    trace's hash ids imply (``traces.stats.session_cache``)."""
    t = Table(title="prefix cache per session: server (recorded) vs trace (implied)",
              title_justify="left")
    for col in ("session", "requests", "input tokens", "server cached", "trace implies"):
        t.add_column(col, justify="left" if col == "session" else "right")
    for r in rows[:limit]:
        t.add_row(text(r.session_id), f"{r.requests:,}", f"{r.input_tokens:,}", _pct(r.server_rate),
                  _pct(r.implied_rate))
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


def render_head(table: pa.Table, n: int, width: int = 80) -> RenderableType:
    """The first ``n`` rows within ``width`` columns: one line per request with times in
    seconds and token counts. Columns every row shares (api, model) are said once below the
    table; optional columns that do not fit (cached, blocks, agent, dependencies, in this
    order) and the others present are named there rather than squeezed in."""
    rows = table.slice(0, n).to_pylist()
    names = set(table.column_names)

    def has(c: str) -> bool:
        return c in names and any(r.get(c) is not None for r in rows)

    Col = tuple[str, str, Callable[[dict[str, Any]], str], str]
    cols: list[Col] = [
        ("session", "left", lambda r: _cut(str(r["session_id"]), SESSION_WIDTH), "session_id"),
        ("#", "right", lambda r: str(r["request_index"]), "request_index"),
    ]
    if has("depends_on"):
        cols.append(("after", "left", lambda r: ",".join(map(str, r["depends_on"] or [])) or "-",
                     "depends_on"))
    else:
        cols.append(("parent", "right", lambda r: str(r["parent_index"]), "parent_index"))
    if has("agent_id"):
        cols.append(("agent", "left", lambda r: _cut(str(r["agent_id"] or "-"), AGENT_WIDTH),
                     "agent_id"))
    cols += [("arrival s", "right", lambda r: _secs(r["arrival_ns"]), "arrival_ns"),
             ("think s", "right", lambda r: _secs(r.get("think_ns")), "think_ns"),
             ("in tok", "right", lambda r: f"{r['input_tokens']:,}", "input_tokens"),
             ("out tok", "right", lambda r: f"{r['output_tokens']:,}", "output_tokens")]
    if has("cached_tokens"):
        cols.append(("cached", "right", lambda r: "-" if r["cached_tokens"] is None
                     else f"{r['cached_tokens']:,}", "cached_tokens"))
    if has("hash_ids"):
        cols.append(("blocks", "right", lambda r: str(len(r["hash_ids"] or [])), "hash_ids"))
    shared = [c for c in ("api", "model") if has(c) and len({r.get(c) for r in rows}) == 1]
    if has("api") and "api" not in shared:
        cols.append(("api", "left", lambda r: visible(r.get("api") or "-"), "api"))
    cells = {c[0]: [c[2](r) for r in rows] for c in cols}

    def needed(cs: list[Col]) -> int:
        return sum(max([len(c[0])] + [len(v) for v in cells[c[0]]]) for c in cs) + len(cs) - 1

    for drop in ("cached", "blocks", "agent", "after", "parent"):
        if needed(cols) <= width:
            break
        cols = [c for c in cols if c[0] != drop]
    t = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for name, justify, _, _ in cols:
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for i in range(len(rows)):
        t.add_row(*(Text(cells[c[0]][i]) for c in cols))
    shown = {c[3] for c in cols} | {"parent_index"}
    notes = [f"{c}: {visible(rows[0][c])}" for c in shared]
    more = [c for c in table.column_names if c not in shown and c not in shared and has(c)]
    lines = []
    if notes:
        lines.append("every row above: " + "; ".join(notes))
    if more:
        lines.append("also in the trace: " + ", ".join(map(visible, more))
                     + " (agent-replay traces inspect summarizes them)")
    return Group(t, *(Text(line, style="dim") for line in lines))
