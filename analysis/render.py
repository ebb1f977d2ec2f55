"""Renderers of a Report: rich tables (terminal), Markdown, JSON and CSV.

``report_dict`` is the one JSON-ready view every format derives from, so the formats never
disagree. Times are shown in milliseconds, speeds in tokens per second.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import orjson
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from agent_replay.analysis.definitions import METRICS, SPEEDS, speeds
from agent_replay.analysis.hist import FEW, PERCENTILES, Summary, min_count_for
from agent_replay.analysis.report import Report
from agent_replay.analysis.runstats import PER_TOKEN_METRICS
from agent_replay.safetext import plain, text

LATENCY_ROWS = tuple((d.key, d.label) for d in METRICS)
"""The latency table's rows: the definitions table (``analysis.definitions``), in order."""
SESSIONS_SHOWN = 10


def _clean(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x


def summary_dict(s: Summary, scale: float = 1e-6) -> dict[str, Any]:
    """Percentiles in ms (scale 1e-6 of ns) with the count and a flag per percentile."""
    d: dict[str, Any] = {"count": s.count, "exact": s.exact}
    for p in PERCENTILES:
        v = s.values.get(p)
        d[f"p{p:g}"] = None if v is None else _clean(v * scale)
        d[f"p{p:g}_too_few"] = not s.reliable.get(p, False)
    d["max"] = None if s.max is None else _clean(s.max * scale)
    d["mean"] = None if s.mean is None else _clean(s.mean * scale)
    if s.dropped:
        d["dropped"] = s.dropped
    return d


def report_dict(r: Report) -> dict[str, Any]:
    st = r.stats
    sessions = st.sessions.to_pylist()
    for row in sessions:
        for k in ("wall_ns", "wait_ns", "think_ns"):
            v = row.pop(k, None)
            row[k.replace("_ns", "_s")] = None if v is None else _clean(v / 1e9)
        row["session_tps"] = _clean(row.get("session_tps"))
    fid = dict(st.fidelity)
    fid["think_time_error_ms"] = summary_dict(fid.pop("think_time_error"))
    return {
        "results_dir": r.results_dir,
        "warnings": r.warnings,
        "headline": {k: _clean(v) for k, v in r.headline.items()},
        "requests": st.requests,
        "errors": st.errors,
        "inexact_token_counts": st.inexact | {"left_out_of": list(PER_TOKEN_METRICS)},
        "duration_s": st.duration_ns / 1e9,
        "latency_ms": {k: summary_dict(st.latency[k]) for k, _ in LATENCY_ROWS},
        "request_tps": summary_dict(st.tps, 1.0) | {"reading": "P90 = speed 90% of requests reach"},
        "speeds_tok_s": {k: _clean(v) for k, v in speeds(st.latency).items()},
        "tokens": st.tokens,
        "throughput": {k: _clean(v) for k, v in st.extra.get("throughput", {}).items()},
        "goodput": st.goodput,
        "economics": st.economics,
        "fidelity": {k: _clean(v) for k, v in fid.items()},
        "tokens_per_chunk": {str(k): v for k, v in st.tokens_per_chunk.items()},
        "sessions": sessions,
        "server": _jsonable(r.server),
        "gpu": _jsonable(r.gpu),
        "run": _jsonable(r.meta.to_json()),
    }


def _jsonable(x: Any) -> Any:
    return (
        orjson.loads(
            orjson.dumps(
                x, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
            )
        )
        if x is not None
        else None
    )


def to_json(r: Report) -> str:
    return orjson.dumps(report_dict(r), option=orjson.OPT_INDENT_2).decode() + "\n"


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _pct_cells(d: Mapping[str, Any], digits: int = 2) -> list[str]:
    cells = []
    for p in PERCENTILES:
        v = d.get(f"p{p:g}")
        cells.append(_fmt(v, digits) + (FEW if v is not None and d.get(f"p{p:g}_too_few") else ""))
    cells.append(_fmt(d.get("max"), digits))
    return cells


def _latency_rows(d: Mapping[str, Any]) -> Iterator[list[str]]:
    for key, label in LATENCY_ROWS:
        s = d["latency_ms"][key]
        yield [label + ("" if s["exact"] else " (hdr)"), _fmt(s["count"]), *_pct_cells(s)]
    t = d["request_tps"]
    yield ["request TPS (tok/s)", _fmt(t["count"]), *_pct_cells(t, 1)]


HEAD = ["metric (ms)", "count", "P50", "P90", "P99", "P99.9", "max"]
FOOTNOTE = (
    f"{FEW} fewer samples than the percentile needs (P90 >= {min_count_for(90)}, "
    f"P99 >= {min_count_for(99)}, P99.9 >= {min_count_for(99.9)}). Request TPS is read "
    "as a tail: its P90 is the speed 90% of requests reach or beat. (hdr): HdrHistogram, "
    "3 significant digits; other rows are exact."
)


Section = tuple[str, list[tuple[str, str]]]


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _kv_sections(d: Mapping[str, Any]) -> Iterator[Section]:
    """The report's key-value sections, in order."""
    for section in (
        _requests_section,
        _throughput_section,
        _speeds_section,
        _goodput_section,
        _revenue_section,
        _fidelity_section,
        _chunks_section,
        _server_section,
        _gpu_sections,
    ):
        yield from section(d)


def _requests_section(d: Mapping[str, Any]) -> Iterator[Section]:
    req = d["requests"]
    errs = ", ".join(f"{k} {v}" for k, v in d["errors"].items()) or "none"
    yield (
        "Requests",
        [("ok / failed / warmup", f"{req['ok']:,} / {req['failed']:,} / {req['warmup']:,}")]
        + (
            [("cancelled by the run's stop (not failed)", f"{req['cancelled']:,}")]
            if req.get("cancelled")
            else []
        )
        + [("failed by cause", errs), ("duration", f"{d['duration_s']:,.1f} s")]
        + (
            [
                (
                    "inexact token counts (ok)",
                    f"{d['inexact_token_counts']['requests']:,}: left out of "
                    + ", ".join(d["inexact_token_counts"]["left_out_of"]),
                )
            ]
            if d["inexact_token_counts"]["requests"]
            else []
        ),
    )


def _throughput_section(d: Mapping[str, Any]) -> Iterator[Section]:
    tp = d["throughput"]
    rows = [
        ("output tokens/s", _fmt(tp.get("output_tokens_per_s"), 1)),
        (
            "input tokens/s (cached / computed)",
            f"{_fmt(tp.get('input_tokens_per_s'), 1)} ({_fmt(tp.get('input_cached_tokens_per_s'), 1)}"
            f" / {_fmt(tp.get('input_computed_tokens_per_s'), 1)})",
        ),
        ("requests/s", _fmt(tp.get("requests_per_s"), 2)),
    ]
    if tp.get("gpus"):
        rows.append(
            (
                f"per GPU ({tp['gpus']} GPUs): output / input tokens/s",
                f"{_fmt(tp.get('output_tokens_per_s_per_gpu'), 1)} / "
                f"{_fmt(tp.get('input_tokens_per_s_per_gpu'), 1)}",
            )
        )
    rows.append(
        (
            "AgentX total tokens/s per GPU (input + output, first send to last end)",
            _fmt(tp.get("total_tokens_per_s_per_gpu"), 1)
            if tp.get("gpus")
            else "GPU count unknown (give --gpus N)",
        )
    )
    yield "Throughput", rows


def _speeds_section(d: Mapping[str, Any]) -> Iterator[Section]:
    sp = d["speeds_tok_s"]
    yield "Speeds (tok/s)", [(f"{x.label}: {x.doc}", _fmt(sp.get(x.key), 1)) for x in SPEEDS]


def _goodput_section(d: Mapping[str, Any]) -> Iterator[Section]:
    g = d["goodput"]
    if g:
        slo = ", ".join(f"{k[:-3]} <= {v:g} ms" for k, v in g["slo"].items() if v is not None)
        frac = g["fraction"]
        yield (
            "Goodput",
            [
                ("SLO", slo),
                (
                    "good requests",
                    f"{g['good_requests']:,} of {g['attempted_requests']:,}"
                    + (f" ({100 * frac:.1f}%)" if frac is not None else ""),
                ),
                ("good requests/s", _fmt(g["requests_per_s"], 2)),
                ("good output tokens/s", _fmt(g["output_tokens_per_s"], 1)),
            ]
            + (
                [("TPOT unknown (inexact token counts, not good)", f"{g['tpot_unknown']:,}")]
                if g.get("tpot_unknown")
                else []
            ),
        )


def _revenue_section(d: Mapping[str, Any]) -> Iterator[Section]:
    e = d["economics"]
    if e:
        yield "Revenue per GPU-hour", [("", line) for line in e["arithmetic"]]


def _fidelity_section(d: Mapping[str, Any]) -> Iterator[Section]:
    f = d["fidelity"]
    tte = f["think_time_error_ms"]
    yield (
        "Replay fidelity",
        [
            (
                "prompt tokens served / trace",
                f"{f['prompt_tokens_served']:,} / "
                f"{f['prompt_tokens_trace']:,} ({_pct(f['prompt_ratio'])}), {f['prompt_mismatches']:,} rows differ",
            ),
            (
                "output tokens served / trace",
                f"{f['output_tokens_served']:,} / "
                f"{f['output_tokens_trace']:,} ({_pct(f['output_ratio'])}), {f['output_mismatches']:,} rows differ",
            ),
            (
                "prefix-cache hit rate: server / trace implies",
                f"{_pct(f['prefix_hit_rate_server'])} / {_pct(f['prefix_hit_rate_implied'])}",
            ),
            ("sent before dependencies finished", _fmt(f["sent_before_parent_end"])),
            (
                "think-time error P50 / P99 (ms)",
                f"{_fmt(tte['p50'], 3)} / {_fmt(tte['p99'], 3)} (n={tte['count']:,})",
            ),
        ],
    )


def _chunks_section(d: Mapping[str, Any]) -> Iterator[Section]:
    tpc = d["tokens_per_chunk"]
    if tpc:
        total = sum(tpc.values())
        mean = sum(int(k) * v for k, v in tpc.items()) / total
        yield (
            "Tokens per chunk",
            [
                (f"{k} tokens", f"{v:,} ({100 * v / total:.1f}%)")
                for k, v in sorted(tpc.items(), key=lambda kv: int(kv[0]))[:8]
            ]
            + [("mean", f"{mean:.2f}")],
        )


def _server_section(d: Mapping[str, Any]) -> Iterator[Section]:
    if d["server"] and d["server"].get("scrapes"):
        yield (
            "Server side (vLLM /metrics, deltas over the run) beside the client",
            list(_server_rows(d)),
        )


def _gpu_sections(d: Mapping[str, Any]) -> Iterator[Section]:
    if d.get("gpu"):
        from agent_replay.analysis.gpu_energy import report_rows

        yield from report_rows(d["gpu"])


SERVER_LATENCY = (
    ("ttft", "ttft", "TTFT (server from engine arrival)"),
    ("tpot", "tpot", "TPOT"),
    ("itl", "itl", "ITL (server: per engine step)"),
    ("e2e", "e2e", "E2E"),
)


def _bucket(h: Mapping[str, Any], q: str) -> str:
    b = h.get(q)
    if not b:
        return "-"
    hi = "+inf" if b.get("hi") is None else f"{1e3 * b['hi']:g}"
    return f"({1e3 * (b.get('lo') or 0.0):g}, {hi}]"


def _server_rows(d: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Client and server figures side by side. Server percentiles are only known to the
    histogram bucket that holds them, so they are shown as that bucket's range."""
    srv = d["server"]
    yield from _server_latency_rows(d)
    pc = srv.get("prefix_cache") or {}
    f = d["fidelity"]
    if pc.get("queries"):
        yield (
            "prefix-cache hit rate: server counters / client usage / trace implies",
            f"{_pct(pc.get('hit_rate'))} / {_pct(f.get('prefix_hit_rate_server'))} / "
            f"{_pct(f.get('prefix_hit_rate_implied'))}",
        )
    yield from _server_token_rows(d)
    yield from _server_gauge_rows(srv)
    fin = {k: int(v) for k, v in (srv.get("requests_finished") or {}).items() if v}
    if fin:
        yield (
            "requests finished (server), by reason",
            ", ".join(f"{k} {v:,}" for k, v in sorted(fin.items())),
        )
    yield (
        "scrapes / engines",
        f"{srv['scrapes']} over {_fmt(srv.get('duration_s'), 1)} s / {srv.get('engines')}",
    )


def _server_latency_rows(d: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Each latency's client mean beside the server's, with the server's P50 and P99 buckets."""
    hists = d["server"].get("histograms") or {}
    for client_key, server_key, label in SERVER_LATENCY:
        h = hists.get(server_key)
        c = d["latency_ms"].get(client_key) or {}
        if not h or not h.get("count"):
            continue
        yield (
            f"{label}, mean ms: client / server",
            f"{_fmt(c.get('mean'), 3)} / {_fmt(1e3 * h['mean'], 3)}  "
            f"(server n={int(h['count']):,}; P50 in {_bucket(h, 'p50')}, "
            f"P99 in {_bucket(h, 'p99')} ms)",
        )


def _server_token_rows(d: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Token counts on both sides and the server's speculative-decoding acceptance."""
    srv = d["server"]
    toks = d["tokens"]
    if srv.get("generation_tokens") is not None:
        yield (
            "generation tokens: server / client",
            f"{_fmt(int(srv['generation_tokens']))} / {_fmt(toks.get('output'))}",
        )
    if srv.get("prompt_tokens") is not None:
        yield (
            "prompt tokens: server / client",
            f"{_fmt(int(srv['prompt_tokens']))} / {_fmt(toks.get('input'))}",
        )
    spec = srv.get("spec_decode")
    if spec:
        per_pos = ", ".join(
            "-" if v is None else f"{v:.2f}" for v in spec.get("per_position_acceptance") or []
        )
        yield (
            "speculative decoding: acceptance length (server)",
            f"{_fmt(spec.get('acceptance_length'), 2)}; per position {per_pos or '-'}; "
            f"client tokens per chunk {_fmt(_mean_tpc(d), 2)}",
        )


def _server_gauge_rows(srv: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The scraped gauges' mean and max, and the preemptions."""
    for key, label in (
        ("kv_cache_usage", "KV-cache usage"),
        ("running", "requests running"),
        ("waiting", "requests waiting"),
    ):
        g = srv.get(key)
        if g:
            scale, unit = (100.0, "%") if key == "kv_cache_usage" else (1.0, "")
            yield (
                f"{label}: mean / max",
                f"{g['mean'] * scale:,.1f}{unit} / "
                f"{g['max'] * scale:,.1f}{unit} ({g['samples']} scrapes)",
            )
    if srv.get("preemptions") is not None:
        yield ("preemptions", _fmt(int(srv["preemptions"])))


def _mean_tpc(d: Mapping[str, Any]) -> float | None:
    tpc = d["tokens_per_chunk"]
    total = sum(tpc.values())
    return sum(int(k) * v for k, v in tpc.items()) / total if total else None


def _session_rows(d: Mapping[str, Any], limit: int | None) -> tuple[list[str], list[list[str]]]:
    rows = sorted(
        d["sessions"], key=lambda r: (r.get("session_tps") is None, r.get("session_tps") or 0.0)
    )
    head = ["session", "clone", "ok", "failed", "session TPS", "wall s", "engine wait s", "think s"]
    out = [
        [
            str(r["session_id"]),
            str(r["clone"]),
            _fmt(r["requests_ok"]),
            _fmt(r["requests_failed"]),
            _fmt(r["session_tps"], 1),
            _fmt(r["wall_s"], 1),
            _fmt(r["wait_s"], 1),
            _fmt(r["think_s"], 1),
        ]
        for r in rows[:limit]
    ]
    return head, out


def render_table(r: Report) -> Group:
    """The terminal report as a rich renderable."""
    d = report_dict(r)
    parts: list[Any] = [
        text(w, style="bold red" if w.startswith("WARNING") else "yellow") for w in d["warnings"]
    ]
    parts.append(text(f"agent-replay report: {d['results_dir']}", style="bold"))
    parts.append(text(d["headline"]["text"], style="bold green"))
    parts.append(
        _grid(
            Table(title="Latency", title_justify="left", show_edge=False),
            HEAD,
            list(_latency_rows(d)),
        )
    )
    parts.append(Text(FOOTNOTE, style="dim"))
    parts += [_kv_table(title, kv) for title, kv in _kv_sections(d)]
    head, rows = _session_rows(d, SESSIONS_SHOWN)
    parts.append(
        _grid(
            Table(
                title=f"Sessions (slowest {min(SESSIONS_SHOWN, len(d['sessions']))} of "
                f"{len(d['sessions'])} by session TPS)",
                title_justify="left",
                show_edge=False,
            ),
            head,
            rows,
        )
    )
    return Group(*parts)


def _grid(t: Table, head: list[str], rows: list[list[str]]) -> Table:
    """Table ``t`` with columns ``head`` (the first left-aligned, the others right) and rows."""
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*map(text, row))
    return t


def _kv_table(title: str, kv: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, show_edge=False)
    t.add_column(style="cyan")
    t.add_column()
    for k, v in kv:
        t.add_row(text(k), text(v))
    return t


def to_text(r: Report, width: int = 100) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(render_table(r))
    return buf.getvalue()


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(plain(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(r: Report) -> str:
    d = report_dict(r)
    out = [f"> {plain(w)}" for w in d["warnings"]]
    out += [
        f"# agent-replay report: `{plain(d['results_dir'])}`",
        "",
        f"**{plain(d['headline']['text'])}**",
        "",
        "## Latency",
        "",
        _md_table(HEAD, list(_latency_rows(d))),
        "",
        FOOTNOTE,
        "",
    ]
    for title, kv in _kv_sections(d):
        out += [f"## {title}", ""]
        out += [f"- {plain(k) + ': ' if k else ''}{plain(v)}" for k, v in kv] + [""]
    head, rows = _session_rows(d, None)
    out += ["## Sessions", "", _md_table(head, rows), ""]
    return "\n".join(out)


def to_csv(r: Report) -> str:
    """Long format: section,name,field,value (one row per number)."""
    d = report_dict(r)
    buf = io.StringIO()
    w = _PlainWriter(csv.writer(buf, lineterminator="\n"))
    w.writerow(["section", "name", "field", "value"])
    for row in _csv_rows(d):
        w.writerow(row)
    return buf.getvalue()


def _fields(
    section: str, name: str, values: Mapping[str, Any], nested: tuple[type, ...] = ()
) -> Iterator[list[Any]]:
    """One CSV row per field of ``values``, the ``nested`` kinds left out."""
    return ([section, name, f, v] for f, v in values.items() if not isinstance(v, nested))


def _csv_rows(d: Mapping[str, Any]) -> Iterator[list[Any]]:
    for key, _ in LATENCY_ROWS:
        yield from _fields("latency_ms", key, d["latency_ms"][key])
    yield from _fields("request_tps", "tps", d["request_tps"])
    yield from _fields("speeds_tok_s", "speeds_tok_s", d["speeds_tok_s"])
    for section in ("requests", "errors", "tokens", "throughput", "tokens_per_chunk"):
        yield from _fields(section, section, d[section])
    inexact = d["inexact_token_counts"]
    yield from _fields(
        "inexact_token_counts",
        "inexact_token_counts",
        {f: inexact[f] for f in ("requests", "without_usage")},
    )
    yield from _fields("fidelity", "fidelity", d["fidelity"], nested=(dict,))
    for block in ("goodput", "economics", "gpu"):
        yield from _fields(block, block, d.get(block) or {}, nested=(dict, list))
    for row in d["sessions"]:
        yield from _fields(
            "sessions",
            f"{row['session_id']}#{row['clone']}",
            {f: v for f, v in row.items() if f not in ("session_id", "clone")},
        )


class _PlainWriter:
    """A CSV writer whose text cells are ``safetext.plain``."""

    def __init__(self, w: Any) -> None:
        self.w = w

    def writerow(self, row: list[Any]) -> None:
        self.w.writerow([plain(v) if isinstance(v, str) else v for v in row])


FORMATS = {"md": to_markdown, "json": to_json, "csv": to_csv}
