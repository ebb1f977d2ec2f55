"""Presentation of ``traces inspect`` and ``traces head``: rich renderables built from
``traces.stats`` numbers. No computation beyond formatting."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

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
    head.add_row("trace", path)
    head.add_row("source", f"{meta.source} (schema v{meta.schema_version}, block size {meta.block_size}, "
                           f"content {meta.content_mode})")
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
    if s.cached_tokens_total is not None and s.total_input_tokens:
        implied = s.implied_cached_total
        vs = (f"; the trace implies {implied / s.total_input_tokens:.1%}"
              if implied is not None else "")
        head.add_row("cached (orig.)", f"{s.cached_tokens_total:,} tokens "
                                       f"({s.cached_tokens_total / s.total_input_tokens:.1%} "
                                       f"of input, by the server's usage{vs})")
    if s.models:
        head.add_row("models", ", ".join(f"{k} ({v:,})" for k, v in sorted(s.models.items(), key=lambda kv: -kv[1])[:5]))

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
        t.add_row(r.session_id, r.agent_id, f"{r.turns:,}", f"{r.first}-{r.last}",
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
        t.add_row(r.session_id, f"{r.requests:,}", f"{r.input_tokens:,}", _pct(r.server_rate),
                  _pct(r.implied_rate))
    if len(rows) > limit:
        t.add_row(f"... {len(rows) - limit:,} more", "", "", "", "")
    return t


def render_head(table: pa.Table, n: int) -> RenderableType:
    t = Table(show_lines=False)
    cols = [c for c in table.column_names if c not in ("content", "chunk_gaps_ns", "chunk_tokens")]
    for c in cols:
        t.add_column(c, overflow="fold")
    for row in table.slice(0, n).select(cols).to_pylist():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, list):
                cells.append(f"[{len(v)} ids]" if c == "hash_ids" else str(v[:4]))
            elif v is None:
                cells.append("-")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    return t
