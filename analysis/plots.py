"""PNG plots of a Report (``agent-replay report --plots DIR``); matplotlib is the optional
``plots`` extra and is imported only here, lazily."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from agent_replay.analysis.cdf import ZERO_MS, cdf_points, zero_fraction
from agent_replay.analysis.definitions import BY_KEY, CDF_KEYS
from agent_replay.analysis.metrics import served_output_tokens
from agent_replay.analysis.report import Report
from agent_replay.analysis.timeseries import bin_edges, lanes, mean_in_flight, spread_rate
from agent_replay.errors import InputError, OutputExistsError

NAMES = (
    "latency_cdf.png",
    "request_tps.png",
    "throughput.png",
    "tokens_per_chunk.png",
    "sessions.png",
)
MAX_LANES = 200


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'agent-replay[plots]'") from None
    return plt


def write_plots(
    report: Report, out_dir: str | os.PathLike[str], *, force: bool = False
) -> list[Path]:
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / n for n in NAMES]
    gpu = report.gpu_samples is not None and report.gpu_samples.num_rows > 0
    if not force:
        for p in paths + ([out / "gpu.png"] if gpu else []):
            if p.exists():
                raise OutputExistsError(str(p))
    for draw, path in zip(
        (_latency_cdfs, _request_tps, _throughput, _tokens_per_chunk, _timelines),
        paths,
        strict=True,
    ):
        fig = draw(plt, report)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
    if gpu:  # GPU telemetry beside the run (analysis.gpu_plots)
        from agent_replay.analysis.gpu_plots import NAME, plot_gpu

        paths.append(plot_gpu(report, out / NAME, plt))
    return paths


def _col(report: Report, name: str) -> np.ndarray:
    t = report.stats.per_request
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _ok(report: Report) -> np.ndarray:
    return report.stats.per_request.column("ok").to_numpy(zero_copy_only=False).astype(bool)


def _latency_cdfs(plt: Any, report: Report) -> Any:
    """The definitions table's CDF entries on one log axis."""
    fig, ax = plt.subplots(figsize=(8, 5))
    zeros = []
    for key in CDF_KEYS:
        v, f = cdf_points(report, key)
        m = BY_KEY[key]
        if v.size:
            n = report.stats.latency[key].count
            ax.step(
                np.maximum(v, ZERO_MS),
                f,
                where="post",
                label=f"{m.label} (n={n:,} {'requests' if m.per == 'request' else m.per + 's'})",
            )
            z = zero_fraction(v, f)
            if z:
                zeros.append(f"{m.label}: {100 * z:.0f}% are 0 ms")
    ax.set_xscale("log")
    ax.set_xlabel(
        "milliseconds (log)" + (f"; drawn at {ZERO_MS:g} ms: " + ", ".join(zeros) if zeros else "")
    )
    ax.set_ylabel("fraction at or below")
    ax.set_title("Latency CDFs (successful requests)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _request_tps(plt: Any, report: Report) -> Any:
    """The histogram of per-request decode speed, its P90 TPS marked."""
    fig, ax = plt.subplots(figsize=(8, 5))
    tps = _col(report, "tps")[_ok(report)]
    tps = tps[np.isfinite(tps)]
    if tps.size:
        ax.hist(tps, bins=60, color="tab:blue", alpha=0.8)
        p90 = report.stats.tps.values.get(90.0)
        if p90 is not None:
            ax.axvline(p90, color="red", label=f"P90 TPS {p90:,.1f} (90% of requests faster)")
            ax.legend()
    ax.set_xlabel("request TPS (tokens/s, per user)")
    ax.set_ylabel("requests")
    ax.set_title("Per-request decode speed")
    return fig


def _throughput(plt: Any, report: Report) -> Any:
    """Output tokens/s and mean requests in flight per bin of the run."""
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    end = _col(report, "end_ns")
    if np.isfinite(end).any():

        def col(name: str) -> np.ndarray:
            return _col(report, name)

        ok = _ok(report)
        # averages per bin (analysis.timeseries): sampling in-flight counts at whole seconds
        # shows none while requests shorter than a second keep tokens flowing
        t0 = float(np.nanmin(col("intended_ns")))
        edges = bin_edges(t0, max(float(np.nanmax(end)), t0 + 1e8))
        first = end - col("e2e") + col("ttft")  # s + TTFT, with s = end - E2E
        out_tok = served_output_tokens(
            col("completion_tokens"), col("output_tokens"), col("exact") > 0
        )
        x = (edges[:-1] - t0) / 1e9
        w = np.diff(edges) / 1e9
        ax1.bar(
            x,
            spread_rate(first[ok], end[ok], out_tok[ok], edges),
            width=w,
            align="edge",
            color="tab:green",
        )
        ax2.bar(
            x, mean_in_flight(col("sent_ns"), end, edges), width=w, align="edge", color="tab:orange"
        )
        ax1.set_title(f"Output tokens/s and requests in flight ({w[0]:g} s bins)")
    ax1.set_ylabel("output tokens/s")
    ax2.set_ylabel("mean requests in flight")
    ax2.set_xlabel("seconds since start")
    return fig


def _tokens_per_chunk(plt: Any, report: Report) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4))
    tpc = report.stats.tokens_per_chunk
    if tpc:
        ks = sorted(tpc)
        total = sum(tpc.values())
        ax.bar([str(k) for k in ks], [100 * tpc[k] / total for k in ks], color="tab:purple")
    ax.set_xlabel("tokens in one streamed chunk")
    ax.set_ylabel("% of chunks")
    ax.set_title("Tokens per chunk (several = speculative decoding or coalescing)")
    return fig


def _timelines(plt: Any, report: Report) -> Any:
    """A lane per session (clone, subagent), a bar per request from send to last byte."""
    t = report.stats.per_request
    ok = _ok(report)
    labels, lane = lanes(t)
    shown = labels[:MAX_LANES]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 1.0 + 0.18 * len(shown))))
    starts, ends, intended = (
        _col(report, "sent_ns"),
        _col(report, "end_ns"),
        _col(report, "intended_ns"),
    )
    t0 = float(np.nanmin(intended)) if intended.size else 0.0
    for i in range(t.num_rows):
        if lane[i] >= len(shown) or np.isnan(starts[i]) or np.isnan(ends[i]):
            continue
        ax.barh(
            lane[i],
            (ends[i] - starts[i]) / 1e9,
            left=(starts[i] - t0) / 1e9,
            height=0.6,
            color="tab:blue" if ok[i] else "tab:red",
        )
    ax.set_yticks(list(range(len(shown))), shown, fontsize=7)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlabel("seconds since start (bars: send to last byte; red: failed; gaps: thinking)")
    ax.set_title(
        f"Session timelines: all {len(labels)} lanes (session #clone / subagent)"
        if len(shown) == len(labels)
        else f"Session timelines: the first {len(shown)} of {len(labels)} lanes by start"
    )
    return fig
