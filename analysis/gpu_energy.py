"""What the GPUs did during a run, from ``gpu_telemetry.parquet`` (``GPU_TELEMETRY_SCHEMA``):
per GPU mean/P50/P99 of each field, energy over the measured window, and energy per output
token, per request and per session.

Energy over the window ``[w0, w1]`` (the report's measured window: the first counted
request's intended send to the last byte) is computed two ways, both per GPU:

- ``counter``: the energy counter, read as a piecewise-linear function of time between
  samples (a drop counts as a reset: the new value is the increase), at ``w1`` minus at
  ``w0``;
- ``power``: the trapezoid integral of the sampled power over the window, the power at
  ``w0``/``w1`` interpolated between the samples around them.

They should agree to a few percent; the driver's power reading may be averaged (over up to
1 s on recent GPUs), so a short window or a coarse interval widens the gap. Derived
figures use the counter where every GPU has one, else the power integral.

Per-session energy (``apportion``): the energy of each sampling interval (sum over GPUs)
goes to the sessions whose output tokens arrived in it, in proportion to those tokens. An
interval in which no token arrived (idle GPUs, or prefill only) is not attributed to any
session; its energy is reported as ``unattributed_j``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent_replay.analysis.definitions import RUN_FIGURES
from agent_replay.analysis.hist import percentile_summary
from agent_replay.runmeta import RunMeta

if TYPE_CHECKING:
    from agent_replay.analysis.runstats import RunStats

NS = 1_000_000_000
FIELDS = (
    ("gpu_util_pct", "util %"),
    ("sm_active_pct", "SM active %"),
    ("mem_util_pct", "memory util %"),
    ("dram_active_pct", "DRAM active %"),
    ("mem_used_bytes", "memory used GiB"),
    ("power_w", "power W"),
    ("temp_c", "temperature C"),
    ("sm_clock_mhz", "SM clock MHz"),
    ("mem_clock_mhz", "memory clock MHz"),
)
"""The fields the report summarizes, with their labels (memory shown in GiB)."""
GIB = float(1 << 30)
AGREEMENT = 0.02
"""Counter and power integral further apart than this (relative) get a note."""


def _col(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _counter_cum(t_ns: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Cumulative increase of a counter at each sample (resets: the new value is the increase)."""
    d = np.diff(v)
    inc = np.where(d >= 0, d, v[1:])
    return np.concatenate([[0.0], np.cumsum(inc)])


def counter_energy_j(t_ns: np.ndarray, energy_mj: np.ndarray, w0: float, w1: float) -> float | None:
    """Joules the counter (mJ) gained over ``[w0, w1]``, linear between samples; None
    without two samples."""
    keep = ~np.isnan(energy_mj)
    t, e = t_ns[keep], energy_mj[keep]
    if t.size < 2:
        return None
    cum = _counter_cum(t, e)
    return float(np.interp(w1, t, cum) - np.interp(w0, t, cum)) / 1000.0


def power_energy_j(t_ns: np.ndarray, power_w: np.ndarray, w0: float, w1: float) -> float | None:
    """Trapezoid integral (J) of power over ``[w0, w1]``, power linear between samples and
    held at the first/last sample outside them; None without two samples."""
    keep = ~np.isnan(power_w)
    t, p = t_ns[keep], power_w[keep]
    if t.size < 2 or w1 <= w0:
        return None
    inside = (t > w0) & (t < w1)
    ts = np.concatenate([[w0], t[inside], [w1]])
    ps = np.interp(ts, t, p)
    return float(np.sum((ps[1:] + ps[:-1]) / 2 * np.diff(ts))) / NS


def _stats(v: np.ndarray, scale: float = 1.0) -> dict[str, Any]:
    s = percentile_summary(v / scale, (50.0, 99.0))
    return {"n": s.count, "mean": s.mean, "p50": s.values[50.0], "p99": s.values[99.0]}


def summarize(
    table: pa.Table,
    window_ns: tuple[float, float],
    *,
    output_tokens: int,
    requests_ok: int,
    gpus: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Per-GPU field statistics over samples inside the window, energy both ways, and the
    derived figures (see the module docstring). ``gpus``: run.json's GPU list (names)."""
    w0, w1 = float(window_ns[0]), float(window_ns[1])
    names = {int(g["index"]): g.get("name") for g in gpus if "index" in g}
    t_all = _col(table, "t_ns")
    gpu_all = np.asarray(table.column("gpu").to_numpy(zero_copy_only=False))
    per_gpu = [
        _gpu_summary(table, gpu_all == g, int(g), names.get(int(g)), t_all, w0, w1)
        for g in sorted(set(gpu_all.tolist()))
    ]
    secs = (w1 - w0) / NS
    e_counter = _total(x["energy_counter_j"] for x in per_gpu)
    e_power = _total(x["energy_power_j"] for x in per_gpu)
    energy = e_counter if e_counter is not None else e_power
    out: dict[str, Any] = {
        "gpus": per_gpu,
        "window_s": secs,
        "energy_counter_j": e_counter,
        "energy_power_j": e_power,
        "energy_diff_pct": _diff_pct(e_counter, e_power),
        "energy_j": energy,
        "energy_from": "counter"
        if e_counter is not None
        else ("power" if e_power is not None else None),
        **_per_energy(energy, secs, output_tokens, requests_ok),
    }
    out["notes"] = _energy_notes(out["energy_diff_pct"], per_gpu)
    return out


def _per_energy(
    energy: float | None, secs: float, output_tokens: int, requests_ok: int
) -> dict[str, float | None]:
    """Mean power, joules per output token and per request, output tokens/s per kW."""
    return {
        "mean_power_w": energy / secs if energy is not None and secs > 0 else None,
        "j_per_output_token": energy / output_tokens if energy and output_tokens else None,
        "j_per_request": energy / requests_ok if energy and requests_ok else None,
        "output_tokens_per_s_per_kw": output_tokens * 1000 / energy if energy else None,
    }


def _total(values: Iterable[float | None]) -> float | None:
    """The sum over the GPUs; None when there are none or one is unknown."""
    vs = list(values)
    return sum(v for v in vs if v is not None) if vs and None not in vs else None


def _gpu_summary(
    table: pa.Table,
    sel: np.ndarray,
    gpu: int,
    name: str | None,
    t_all: np.ndarray,
    w0: float,
    w1: float,
) -> dict[str, Any]:
    """One GPU's field statistics over its samples in the window, and its energy both ways."""
    t = t_all[sel]
    order = np.argsort(t, kind="stable")
    t = t[order]
    win = (t >= w0) & (t <= w1)
    fields: dict[str, Any] = {}
    for field, _label in FIELDS:
        v = _col(table, field)[sel][order]
        if not np.isnan(v).all():
            fields[field] = _stats(v[win], GIB if field == "mem_used_bytes" else 1.0)
    e_counter = counter_energy_j(t, _col(table, "energy_mj")[sel][order], w0, w1)
    e_power = power_energy_j(t, _col(table, "power_w")[sel][order], w0, w1)
    return {
        "gpu": gpu,
        "name": name,
        "uuid": table.column("uuid").filter(pa.array(sel)).to_pylist()[0],
        "samples": int(win.sum()),
        "fields": fields,
        "energy_counter_j": e_counter,
        "energy_power_j": e_power,
        "energy_diff_pct": _diff_pct(e_counter, e_power),
    }


def _disagrees(diff: float | None) -> bool:
    return diff is not None and abs(diff) > 100 * AGREEMENT


def _energy_notes(diff: float | None, per_gpu: list[dict[str, Any]]) -> list[str]:
    """Where the counter and the power integral disagree (in total, else per GPU), and the
    GPUs with too few samples."""
    notes = []
    if _disagrees(diff):
        notes.append(
            f"energy counter and power integral differ by {diff:+.1f}% (more than "
            f"{100 * AGREEMENT:g}%): the driver may average its power reading, or the sample "
            "interval is coarse for this window"
        )
    elif len(per_gpu) > 1:
        off = [x for x in per_gpu if _disagrees(x["energy_diff_pct"])]
        if off:
            notes.append(
                "energy counter and power integral differ by more than "
                f"{100 * AGREEMENT:g}% on "
                + ", ".join(f"GPU {x['gpu']} ({x['energy_diff_pct']:+.1f}%)" for x in off)
            )
    covered = [x for x in per_gpu if x["samples"] < 2]
    if covered:
        notes.append(f"{len(covered)} GPUs have fewer than 2 samples in the window")
    return notes


def _diff_pct(counter: float | None, power: float | None) -> float | None:
    if counter is None or power is None or power == 0:
        return None
    return 100 * (counter - power) / power


def interval_energy_j(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Sample times (the union over GPUs, sorted) and the energy (J, all GPUs together) of
    each interval between consecutive times: from the counters where every GPU has them,
    else the power trapezoid."""
    t_all = _col(table, "t_ns")
    times = np.unique(t_all)
    if times.size < 2:
        return times, np.zeros(0)
    gpu_all = np.asarray(table.column("gpu").to_numpy(zero_copy_only=False))
    use_counter = not np.isnan(_col(table, "energy_mj")).any()
    total = np.zeros(times.size)
    for g in np.unique(gpu_all):
        sel = gpu_all == g
        t = t_all[sel]
        order = np.argsort(t, kind="stable")
        t = t[order]
        if use_counter:
            cum = _counter_cum(t, _col(table, "energy_mj")[sel][order]) / 1000.0
        else:
            p = _col(table, "power_w")[sel][order]
            cum = np.concatenate([[0.0], np.cumsum((p[1:] + p[:-1]) / 2 * np.diff(t) / NS)])
        total += np.interp(times, t, cum)
    return times, np.diff(total)


def apportion(
    times: np.ndarray,
    energy: np.ndarray,
    chunk_t: np.ndarray,
    chunk_tokens: np.ndarray,
    chunk_owner: np.ndarray,
    owners: int,
    window_ns: tuple[float, float] | None = None,
) -> tuple[np.ndarray, float]:
    """Energy per owner (session) and the unattributed rest, by the rule of the module
    docstring. ``chunk_owner[i]``: the owner index (0..owners-1) of chunk i; intervals are
    those between ``times``; with ``window_ns`` only the part of each interval inside the
    window counts (energy taken as uniform within an interval), so attributed plus
    unattributed is the window's energy."""
    e = energy.astype(np.float64).copy()
    if window_ns is not None and times.size >= 2:  # the part of each interval inside it
        lo, hi = times[:-1].astype(np.float64), times[1:].astype(np.float64)
        overlap = np.clip(np.minimum(hi, window_ns[1]) - np.maximum(lo, window_ns[0]), 0, None)
        e *= np.divide(overlap, hi - lo, out=np.zeros(e.size), where=hi > lo)
    k = np.searchsorted(times, chunk_t, side="left") - 1  # interval (t_k, t_k+1] of each chunk
    valid = (k >= 0) & (k < e.size)
    k, tok, own = k[valid], chunk_tokens[valid].astype(np.float64), chunk_owner[valid]
    per_interval = np.bincount(k, weights=tok, minlength=e.size)
    share = np.divide(e[k] * tok, per_interval[k], out=np.zeros(k.size), where=per_interval[k] > 0)
    per_owner = np.bincount(own, weights=share, minlength=owners)
    unattributed = float(e[per_interval == 0].sum())
    return per_owner, unattributed


def session_energy(
    table: pa.Table, batches: Iterable[pa.RecordBatch | pa.Table], window_ns: tuple[float, float]
) -> dict[str, Any]:
    """Per (session_id, clone) energy (see ``apportion``) from request batches with
    ``session_id``, ``clone``, ``chunk_ns`` and ``chunk_tokens``. Memory: the tokens of each
    (interval, session) pair, not every chunk."""
    times, energy = interval_energy_j(table)
    index: dict[tuple[str, int], int] = {}
    keys: list[np.ndarray] = []
    toks: list[np.ndarray] = []
    n_int = max(energy.size, 1)
    for b in batches:
        sids = b.column("session_id").to_pylist()
        clones = b.column("clone").to_pylist()
        row_owner = np.fromiter(
            (index.setdefault((s, c), len(index)) for s, c in zip(sids, clones, strict=True)),
            dtype=np.int64,
            count=len(sids),
        )
        chunk_ns = b.column("chunk_ns")
        if isinstance(chunk_ns, pa.ChunkedArray):
            chunk_ns = chunk_ns.combine_chunks()
        chunk_k = b.column("chunk_tokens")
        if isinstance(chunk_k, pa.ChunkedArray):
            chunk_k = chunk_k.combine_chunks()
        parents = np.asarray(pc.list_parent_indices(chunk_ns).to_numpy(zero_copy_only=False))
        t = np.asarray(pc.list_flatten(chunk_ns).to_numpy(zero_copy_only=False), dtype=np.float64)
        k = np.asarray(pc.list_flatten(chunk_k).to_numpy(zero_copy_only=False), dtype=np.float64)
        interval = np.searchsorted(times, t, side="left") - 1
        valid = (interval >= 0) & (interval < energy.size)
        key = row_owner[parents][valid] * n_int + interval[valid]
        batch_keys, inv = np.unique(key, return_inverse=True)
        keys.append(batch_keys)
        toks.append(np.bincount(inv, weights=k[valid], minlength=batch_keys.size))
    owners = len(index)
    u: np.ndarray = np.zeros(0, np.int64)
    tok: np.ndarray = np.zeros(0)
    if keys:
        u, inv = np.unique(np.concatenate(keys), return_inverse=True)
        tok = np.bincount(inv, weights=np.concatenate(toks), minlength=u.size)
    owner, interval = u // n_int, u % n_int
    # one pseudo-chunk per (session, interval) pair, stamped inside its interval
    mid = (
        (times[interval] + times[np.minimum(interval + 1, times.size - 1)]) / 2
        if times.size >= 2
        else np.zeros(0)
    )
    per, rest = apportion(times, energy, mid, tok, owner, owners, window_ns)
    tokens = np.bincount(owner, weights=tok, minlength=owners)
    rows = []
    for (sid, clone), i in index.items():
        rows.append(
            {
                "session_id": sid,
                "clone": int(clone),
                "energy_j": float(per[i]),
                "output_tokens": int(tokens[i]),
                "j_per_output_token": float(per[i] / tokens[i]) if tokens[i] else None,
            }
        )
    rows.sort(key=lambda r: (r["session_id"], r["clone"]))
    summ = percentile_summary(per, (50.0, 90.0))
    return {
        "rule": "each sampling interval's energy split by the output tokens each session "
        "received in it; intervals without tokens unattributed",
        "sessions": rows,
        "unattributed_j": rest,
        "attributed_j": float(per.sum()),
        "per_session_j": {
            "mean": summ.mean,
            "p50": summ.values[50.0],
            "p90": summ.values[90.0],
            "max": summ.max,
            "n": summ.count,
        },
    }


def gpu_section(
    results_dir: str | os.PathLike[str],
    meta: RunMeta | Mapping[str, Any],
    stats: RunStats,
    samples: pa.Table | None,
) -> dict[str, Any] | None:
    """The report's GPU block for a results folder: ``summarize`` over the measured window,
    plus per-session energy when sessions are the unit (session timing). None without
    telemetry samples."""
    if samples is None or samples.num_rows == 0:
        return None
    window = stats.extra.get("window_ns") or (0.0, 0.0)
    meta = RunMeta.of(meta)
    tel = meta.gpu_telemetry
    out = summarize(
        samples,
        window,
        output_tokens=stats.tokens["output"],
        requests_ok=stats.requests["ok"],
        gpus=tel.get("gpus") or (),
    )
    out["source"] = tel.get("source")
    out["sampler_cost"] = tel.get("cost")
    if meta.timing == "session":
        from agent_replay.analysis.results import iter_request_batches

        cols = ["session_id", "clone", "chunk_ns", "chunk_tokens"]
        out["sessions"] = session_energy(samples, iter_request_batches(results_dir, cols), window)
    return out


POINT_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (f.key, f.unit) for f in RUN_FIGURES if f.needs == "gpu"
)
"""The energy figures of one run as a sweep point (with their units): the definitions
table's figures that need GPU telemetry."""


def point_figures(gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """``POINT_FIELDS`` from a report's ``gpu`` block (all None without telemetry): what a
    sweep's index and frontier take (energy per token as a second axis)."""
    return {k: (gpu or {}).get(k) for k, _ in POINT_FIELDS}


def _n(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def report_rows(g: Mapping[str, Any]) -> Iterable[tuple[str, list[tuple[str, str]]]]:
    """The report's GPU sections as (title, [(label, value)]) from ``summarize``'s dict
    (after JSON conversion)."""
    rows = _energy_rows(g)
    ses = g.get("sessions")
    if ses:
        rows += _session_rows(ses)
    cost = g.get("sampler_cost")
    if cost:
        rows.append(
            (
                "sampler cost",
                f"{_n(cost.get('samples_per_s'))} samples/s, CPU "
                f"{_n(cost.get('cpu_percent'), 2)}% of a core, read "
                f"{_n(cost.get('read_ms_mean'), 3)} ms mean / {_n(cost.get('read_ms_max'), 3)}"
                f" ms max, {cost.get('errors', 0)} failed",
            )
        )
    rows += [("note", n) for n in g.get("notes") or ()]
    yield "GPU energy", rows
    labels = dict(FIELDS)
    fields = []
    for x in g["gpus"]:
        for name, st in x["fields"].items():
            fields.append(
                (
                    f"GPU {x['gpu']} {labels.get(name, name)}",
                    f"{_n(st['mean'])} / {_n(st['p50'])} / {_n(st['p99'])} (n={st['n']:,})",
                )
            )
    yield "GPU telemetry over the measured window (mean / P50 / P99)", fields


def _energy_rows(g: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Energy both ways, in total and per GPU, and the figures derived from it."""
    win = g.get("window_s") or 0.0
    rows = [("source", f"{g.get('source') or '-'}, {len(g['gpus'])} GPUs")]
    diff = g.get("energy_diff_pct")
    rows.append(
        (
            f"energy over the measured window ({win:,.1f} s), all GPUs",
            f"counter {_n(g.get('energy_counter_j'))} J / power integral "
            f"{_n(g.get('energy_power_j'))} J (difference "
            + ("-" if diff is None else f"{diff:+.2f}%")
            + ")",
        )
    )
    for x in g["gpus"]:
        d = x.get("energy_diff_pct")
        rows.append(
            (
                f"GPU {x['gpu']} energy: counter / power integral",
                f"{_n(x.get('energy_counter_j'))} / {_n(x.get('energy_power_j'))} J"
                + ("" if d is None else f" ({d:+.2f}%)"),
            )
        )
    rows += [
        (
            "mean power (from " + str(g.get("energy_from") or "-") + ")",
            f"{_n(g.get('mean_power_w'))} W",
        ),
        ("joules per output token", _n(g.get("j_per_output_token"), 4)),
        ("joules per request", _n(g.get("j_per_request"), 2)),
        ("output tokens/s per kW", _n(g.get("output_tokens_per_s_per_kw"), 1)),
    ]
    return rows


def _session_rows(ses: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Energy per session, and what no session was given."""
    ps = ses["per_session_j"]
    total = (ses["attributed_j"] or 0.0) + (ses["unattributed_j"] or 0.0)
    return [
        (
            f"energy per session (n={ps['n']:,}): mean / P50 / P90 / max",
            f"{_n(ps['mean'])} / {_n(ps['p50'])} / {_n(ps['p90'])} / {_n(ps['max'])} J",
        ),
        (
            "not attributed to a session (intervals without output tokens)",
            f"{_n(ses['unattributed_j'])} J"
            + (f" ({100 * ses['unattributed_j'] / total:.1f}%)" if total else ""),
        ),
    ]
