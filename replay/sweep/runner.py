"""Running a sweep: the interleaved schedule, a warm-up before each run, one plain results
folder per run, the index table after every run, and resumption.

Schedule: for each repeat, the targets in a balanced order (a seeded random order rotated
by one place per repeat: a Latin square, so every target goes first, second, ... equally
often over each cycle of as many repeats as targets), and within each target's visit its
load points in a seeded random order; so drift over time, the first run after a start and
noisy neighbours hit every arm alike. Runs of the same (point, repeat) share their prompt salt and arrival
seed on every target: a paired design.

Tree: ``OUT/sweep.json`` (the experiment, its identity, the sweep's own timing),
``OUT/index.parquet`` and ``index.csv``, ``OUT/runs/TARGET/AXIS=POINT/rN/`` (a results
folder like any ``agent-replay run`` writes) and ``.../rN.warmup/`` (the warm-up bursts
and ``warmup.json``, the data behind the steadiness decision).

Extension point: ``RunHook`` objects (e.g. a GPU telemetry sampler) are started before
each run with its folder and target and stopped after it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agent_replay.errors import AgentReplayError, InputError
from agent_replay.redact import redact
from agent_replay.replay.config import RunConfig
from agent_replay.replay.options import axes, axis_values
from agent_replay.replay.plan import stable_hash
from agent_replay.replay.results import write_json_atomic
from agent_replay.replay.sweep.experiment import Experiment, Target, Warmup
from agent_replay.replay.sweep.index import DONE, key, read_index, write_index
from agent_replay.replay.sweep.targets import Running, Servers
from agent_replay.runmeta import RunMeta

if TYPE_CHECKING:
    from agent_replay.replay.runrecord import RunSummary

Reporter = Callable[[str], None]


class RunHook(Protocol):
    """Something to run beside each run of a sweep (a telemetry sampler): ``start`` just
    before the run with its results folder, ``stop`` just after (also when it failed)."""

    def start(self, run_dir: Path, target: Target, url: str) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Slot:
    order: int
    repeat: int
    target: int
    point: float
    phase: str = "sweep"


def target_order(base: Sequence[int], repeat: int) -> list[int]:
    """The targets' order in ``repeat``: ``base`` rotated left by ``repeat`` places. Over any
    ``len(base)`` consecutive repeats each target holds each position once."""
    k = repeat % len(base) if base else 0
    return list(base[k:]) + list(base[:k])


def schedule(
    n_targets: int,
    points: Sequence[float],
    repeats: int,
    seed: int,
    first_order: int = 0,
    phase: str = "sweep",
) -> list[Slot]:
    """The interleaved order of runs: every repeat visits every target (``target_order``: a
    seeded permutation rotated per repeat), each visit runs every point (seeded random
    order)."""
    rng = np.random.default_rng([seed, stable_hash(phase) & 0xFFFFFFFF])
    base = rng.permutation(n_targets).tolist()
    out: list[Slot] = []
    for r in range(repeats):
        for t in target_order(base, r):
            for i in rng.permutation(len(points)).tolist():
                out.append(Slot(first_order + len(out), r, int(t), float(points[i]), phase))
    return out


def run_config(exp: Experiment, url: str, out: Path, point: float, repeat: int) -> RunConfig:
    """The RunConfig of one run: the experiment's [run] options, the load point, and the
    salt and arrival seed of (point, repeat), shared by every target."""
    opts = dict(exp.run)
    shared = stable_hash("sweep", exp.seed, point, repeat) & ((1 << 62) - 1)
    axis = axis_values(RunConfig, exp.axis, point)
    return RunConfig(
        trace=exp.trace,
        target=url,
        output=str(out),
        force=True,
        progress=False,
        salt=shared,
        arrival_seed=shared & 0xFFFFFFFF,
        **opts,
        **axis,
    )


def _median_tpot_ms(run_dir: Path) -> tuple[float | None, int]:
    from agent_replay.analysis.report import build_report

    rep = build_report(run_dir)
    s = rep.stats.latency["tpot"]
    v = s.values.get(50.0)
    return (None if v is None else v / 1e6), s.count


def steady(medians: Sequence[float | None], policy: Warmup) -> bool:
    """Steady when the last two bursts' median TPOT are within ``policy.tolerance`` of each
    other (after at least ``min_bursts``)."""
    if len(medians) < max(2, policy.min_bursts):
        return False
    a, b = medians[-2], medians[-1]
    return a is not None and b is not None and a > 0 and abs(b / a - 1.0) <= policy.tolerance


def warm_up(cfg: RunConfig, wdir: Path, policy: Warmup) -> dict[str, Any]:
    """Short replays of the same workload at the same load (different prompt salts) until
    the median TPOT of one burst is within ``tolerance`` of the last one's; the bursts'
    results and the decision go to ``wdir``."""
    from agent_replay.replay.run import run

    if wdir.exists():
        shutil.rmtree(wdir)
    wdir.mkdir(parents=True)
    bursts: list[dict[str, Any]] = []
    medians: list[float | None] = []
    t0 = time.monotonic()
    dur = policy.burst_s if cfg.duration_s is None else min(policy.burst_s, cfg.duration_s)
    for i in range(policy.max_bursts):
        b_out = wdir / f"burst-{i}"
        bcfg = replace(
            cfg,
            output=str(b_out),
            duration_s=dur,
            warmup_s=0.0,
            scrape_interval_s=0.0,
            gpu_metrics="off",
            salt=stable_hash("warmup", cfg.salt, i) & ((1 << 62) - 1),
        )
        tb = time.monotonic()
        summary = run(bcfg, progress=None)
        med, n = _median_tpot_ms(b_out)
        medians.append(med)
        bursts.append(
            {
                "burst": i,
                "path": b_out.name,
                "wall_s": time.monotonic() - tb,
                "ok": summary.ok,
                "failed": summary.failed,
                "tpot_p50_ms": med,
                "tpot_count": n,
            }
        )
        if summary.interrupted:
            raise KeyboardInterrupt
        if steady(medians, policy):
            break
    decision = {
        "policy": {
            "burst_s": dur,
            "min_bursts": policy.min_bursts,
            "max_bursts": policy.max_bursts,
            "tolerance": policy.tolerance,
        },
        "bursts": bursts,
        "steady": steady(medians, policy),
        "wall_s": time.monotonic() - t0,
    }
    write_json_atomic(wdir / "warmup.json", decision)
    return decision


@dataclass
class SweepResult:
    out: Path
    rows: list[dict[str, Any]]
    timing: dict[str, float] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def failed(self) -> int:
        """Runs that failed (a resumed sweep runs them again)."""
        return sum(1 for r in self.rows if r.get("status") == "failed")

    @property
    def exit_code(self) -> int:
        """130 when interrupted, 1 when a run failed, else 0."""
        return 130 if self.interrupted else 1 if self.failed else 0


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _outcome(
    run_dir: Path,
    summary: Any,
    target: Target,
    prices: dict[str, float] | None = None,
) -> tuple[str, str | None, dict[str, Any], bool, bool, bool]:
    """status, reason, point figures, and the flags bottleneck, cold start, host contention
    (``analysis.selfcheck``) of a finished run."""
    from agent_replay.analysis.points import empty_point, point_metrics
    from agent_replay.analysis.report import build_report, self_check
    from agent_replay.analysis.runstats import Prices

    meta = RunMeta.from_json(json.loads((run_dir / "run.json").read_text()))
    rep = build_report(
        run_dir,
        gpus=target.gpus,
        prices=None
        if prices is None
        else Prices(
            input_miss=prices["input_miss"], input_hit=prices["input_hit"], output=prices["output"]
        ),
    )
    figures = point_metrics(rep, target.gpus, target.usd_per_gpu_hour)
    bottleneck = meta.load_generator_bottleneck
    cold = bool(rep.cold_start)
    contended = bool(self_check(meta, rep.stats).contention)
    if summary.interrupted:
        return "interrupted", "interrupted by the user", figures, bottleneck, cold, contended
    if meta.status in ("failed", "aborted"):  # replay.run's final status
        why = meta.error or f"the run ended {meta.status}"
        return "failed", str(why), figures, bottleneck, cold, contended
    if meta.status == "invalid":  # agentx timing: the AgentX rules refuse the run
        return (
            "failed",
            f"invalid AgentX run: {meta.invalid_reason}",
            figures,
            bottleneck,
            cold,
            contended,
        )
    if rep.stats.requests["ok"] == 0:
        why = ", ".join(f"{k} {v}" for k, v in rep.stats.errors.items()) or "no request was sent"
        return (
            "failed",
            f"no request succeeded ({why})",
            empty_point() | figures,
            bottleneck,
            cold,
            contended,
        )
    if bottleneck:
        return (
            "unreachable",
            "the load generator could not hold this load: " + str(meta.load_generator_warning),
            figures,
            bottleneck,
            cold,
            contended,
        )
    return "complete", None, figures, bottleneck, cold, contended


def execute(
    exp: Experiment,
    slots: Iterable[Slot],
    servers: Servers,
    rows: dict[tuple[Any, ...], dict[str, Any]],
    out: Path,
    *,
    progress: Reporter | None,
    hooks: Sequence[RunHook] = (),
    timing: dict[str, float] | None = None,
    total: int | None = None,
) -> bool:
    """Run ``slots`` (skipping those already done in ``rows``), updating ``rows`` and the
    index after each; returns False when interrupted."""
    timing = timing if timing is not None else {}
    slots = list(slots)
    total = total or len(slots)
    current: Target | None = None
    cannot_start: dict[
        tuple[str, int], str
    ] = {}  # (target, repeat) -> why: not retried in that visit
    for n, slot in enumerate(slots, 1):
        target = exp.targets[slot.target]
        k = _slot_key(exp, slot)
        if _done(rows, k):
            continue
        if current is not None and current.name != target.name:
            servers.release(current)
        current = target
        t_run = time.monotonic()
        row, interrupted = _attempt(exp, slot, target, servers, cannot_start, out, hooks, timing)
        rows[k] = row
        write_index(out, rows.values())
        if progress is not None:
            progress(_line(n, total, row, time.monotonic() - t_run))
        if interrupted:
            return False
    if current is not None:
        servers.release(current)
    return True


def _attempt(
    exp: Experiment,
    slot: Slot,
    target: Target,
    servers: Servers,
    cannot_start: dict[tuple[str, int], str],
    out: Path,
    hooks: Sequence[RunHook],
    timing: dict[str, float],
) -> tuple[dict[str, Any], bool]:
    """One slot's run in its folder under ``out``: its index row, whatever happened (a
    target that failed is dropped, to be started afresh for its next run), and whether
    the run was interrupted."""
    run_dir = (
        out
        / ("runs" if slot.phase == "sweep" else slot.phase)
        / target.name
        / exp.point_label(slot.point)
        / f"r{slot.repeat}"
    )
    row = _new_row(exp, slot, target, str(run_dir.relative_to(out)))
    try:
        running = _server(servers, target, slot.repeat, cannot_start)
        return row, _run_slot(exp, slot, target, running, run_dir, row, hooks, timing)
    except KeyboardInterrupt:
        row.update(status="interrupted", reason="interrupted by the user")
        return row, True
    except AgentReplayError as exc:
        row.update(status="failed", reason=redact(str(exc)))
        servers.drop(target)  # a target that failed is started afresh for its next run
        return row, False


def _new_row(exp: Experiment, slot: Slot, target: Target, path: str) -> dict[str, Any]:
    """A run's index row before it runs: where and what it is, its figures empty."""
    from agent_replay.analysis.points import empty_point

    return {
        "phase": slot.phase,
        "order": slot.order,
        "repeat": slot.repeat,
        "target": target.name,
        "axis": exp.axis,
        "point": slot.point,
        "path": path,
        "started_utc": _now(),
        "gpus": target.gpus,
        "usd_per_gpu_hour": target.usd_per_gpu_hour,
        **empty_point(),
    }


def _slot_key(exp: Experiment, s: Slot) -> tuple[Any, ...]:
    """A run's key in the index: (phase, target, point, repeat)."""
    return (s.phase, exp.targets[s.target].name, s.point, s.repeat)


def _done(rows: dict[tuple[Any, ...], dict[str, Any]], k: tuple[Any, ...]) -> bool:
    return k in rows and rows[k]["status"] in DONE


def _server(
    servers: Servers, target: Target, repeat: int, cannot_start: dict[tuple[str, int], str]
) -> Running:
    """The target's running server; a target that could not start is not tried again in
    the same visit (``cannot_start``: (target, repeat) -> why)."""
    why = cannot_start.get((target.name, repeat))
    if why is not None:
        raise AgentReplayError(why)
    try:
        return servers.get(target)
    except AgentReplayError as exc:
        cannot_start[(target.name, repeat)] = str(exc)
        raise


def _run_slot(
    exp: Experiment,
    slot: Slot,
    target: Target,
    running: Running,
    run_dir: Path,
    row: dict[str, Any],
    hooks: Sequence[RunHook],
    timing: dict[str, float],
) -> bool:
    """One run of the sweep on ``running``: the warm-up, the replay with the hooks around
    it, and its outcome in ``row``; True when it was interrupted."""
    cfg = run_config(exp, running.url, run_dir, slot.point, slot.repeat)
    row["salt"] = cfg.salt
    if exp.warmup.enabled and target.kind != "virtual":  # a virtual engine starts warm
        tw = time.monotonic()
        w = warm_up(cfg, run_dir.with_name(run_dir.name + ".warmup"), exp.warmup)
        timing["warmup_s"] = timing.get("warmup_s", 0.0) + time.monotonic() - tw
        row.update(warmup_s=w["wall_s"], warmup_bursts=len(w["bursts"]), warmup_steady=w["steady"])
    summary, row["run_s"] = _replay_hooked(exp, cfg, target, running, run_dir, hooks)
    row["replay_s"] = summary.wall_s
    timing["run_s"] = timing.get("run_s", 0.0) + row["run_s"]
    timing["replay_s"] = timing.get("replay_s", 0.0) + summary.wall_s
    status, reason, figures, bottleneck, cold, contended = _outcome(
        run_dir, summary, target, exp.prices
    )
    row.update(
        figures,
        status=status,
        reason=redact(reason),
        load_generator_bottleneck=bottleneck,
        machine_contention=contended,
        cold_start=cold,
    )
    return summary.interrupted


def _replay_hooked(
    exp: Experiment,
    cfg: RunConfig,
    target: Target,
    running: Running,
    run_dir: Path,
    hooks: Sequence[RunHook],
) -> tuple[RunSummary, float]:
    """The replay (a virtual engine's in virtual time) and its seconds, every hook started
    before it and stopped after it, whatever happens."""
    from agent_replay.replay.run import run

    started: list[RunHook] = []
    try:
        for h in hooks:
            h.start(run_dir, target, running.url)
            started.append(h)
        tr = time.monotonic()
        # a server the sweep started is "launched" (run.json, telemetry's auto mode)
        if target.kind == "virtual":
            from agent_replay.replay.virtual import run_virtual

            summary = run_virtual(cfg, running.url)
        else:
            summary = run(
                replace(cfg, warmed_up=exp.warmup.enabled),
                progress=None,
                launch_info=None if target.kind == "url" else running.info,
            )
        return summary, time.monotonic() - tr
    finally:
        for h in started:
            with contextlib.suppress(Exception):
                h.stop()


def _line(n: int, total: int, row: dict[str, Any], secs: float) -> str:
    head = f"[{n}/{total}] r{row['repeat']} {row['target']} {row['axis']}={row['point']:g}: {row['status']}"
    if row["status"] != "complete":
        return f"{head} ({row['reason']}) ({secs:.1f} s)"
    p90 = row.get("p90_tps")
    tps = row.get("output_tps_per_gpu")
    return (
        (f"{head}, P90 TPS {p90:,.1f}" if p90 is not None else f"{head}, P90 TPS n/a")
        + (f", {tps:,.0f} output tok/s/GPU" if tps is not None else "")
        + f" ({secs:.1f} s)"
    )


def _prepare(exp: Experiment, force: bool) -> tuple[Path, dict[tuple[Any, ...], dict[str, Any]]]:
    out = Path(exp.output)
    state = out / "sweep.json"
    if out.exists() and force:
        shutil.rmtree(out)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    if state.exists():
        old = json.loads(state.read_text())
        if old.get("identity") != json.loads(json.dumps(redact(exp.identity()))):
            raise InputError(
                f"{out}: holds a sweep of a different experiment (trace, axis, seed, "
                "targets or [run] options differ); use --force to replace it or "
                "--output for another folder"
            )
        rows = {key(r): r for r in read_index(out)}
    elif out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: exists and is not a sweep folder (use --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    return out, rows


def write_state(exp: Experiment, out: Path, timing: dict[str, float], status: str) -> None:
    from agent_replay.replay.provenance import provenance

    write_json_atomic(
        out / "sweep.json",
        redact(
            {
                "experiment": exp.path,
                "identity": exp.identity(),
                "status": status,
                "axis": exp.axis,
                "axis_kind": axes(RunConfig)[exp.axis].axis,
                "points": list(exp.points),
                "repeats": exp.repeats,
                "seed": exp.seed,
                "targets": [t.__dict__ for t in exp.targets],
                "warmup": exp.warmup.__dict__,
                "prices": exp.prices,
                "timing": timing,
                "provenance": provenance(None),
            }
        ),
    )


def run_sweep(
    exp: Experiment,
    *,
    force: bool = False,
    progress: Reporter | None = None,
    hooks: Sequence[RunHook] = (),
) -> SweepResult:
    """Run (or resume) the sweep; the frontier is built from its index afterwards."""
    t0 = time.monotonic()
    out, rows = _prepare(exp, force)
    timing: dict[str, float] = {}
    write_state(exp, out, timing, "running")
    slots = schedule(len(exp.targets), exp.points, exp.repeats, exp.seed)
    todo = sum(1 for s in slots if not _done(rows, _slot_key(exp, s)))
    if progress is not None and todo < len(slots):
        progress(f"resuming {out}: {len(slots) - todo} of {len(slots)} runs already done")
    with Servers(exp.seed) as servers:
        if todo:
            servers.prestart([t for t in exp.targets if t.lifetime == "sweep" and t.kind != "url"])
        ok = execute(exp, slots, servers, rows, out, progress=progress, hooks=hooks, timing=timing)
        timing["server_start_s"] = servers.start_s
    timing["wall_s"] = time.monotonic() - t0
    timing["outside_runs_s"] = (
        timing["wall_s"] - timing.get("run_s", 0.0) - timing.get("warmup_s", 0.0)
    )
    write_state(exp, out, timing, "complete" if ok else "interrupted")
    return SweepResult(out, list(rows.values()), timing, interrupted=not ok)


def reindex(exp: Experiment, out: Path | None = None) -> list[dict[str, Any]]:
    """Recompute every run's figures from its results folder (after a change of metric
    definitions, prices or target costs in the experiment file) and rewrite the index;
    statuses and reasons of runs that did not finish stay as they are."""
    from agent_replay.analysis.points import point_metrics
    from agent_replay.analysis.report import build_report, self_check
    from agent_replay.analysis.runstats import Prices

    root = Path(out or exp.output)
    rows = read_index(root)
    if not rows:
        raise InputError(f"{root}: no index.parquet to rebuild")
    targets = {t.name: t for t in exp.targets}
    prices = (
        None
        if exp.prices is None
        else Prices(
            input_miss=exp.prices["input_miss"],
            input_hit=exp.prices["input_hit"],
            output=exp.prices["output"],
        )
    )
    for r in rows:
        run_dir = root / str(r["path"])
        t = targets.get(str(r["target"]))
        if (
            t is None
            or r["status"] not in ("complete", "unreachable")
            or not (run_dir / "run.json").exists()
        ):
            continue
        rep = build_report(run_dir, gpus=t.gpus, prices=prices)
        r.update(
            point_metrics(rep, t.gpus, t.usd_per_gpu_hour),
            gpus=t.gpus,
            usd_per_gpu_hour=t.usd_per_gpu_hour,
            cold_start=bool(rep.cold_start),
            machine_contention=self_check(rep.meta, rep.stats).contention,
        )
    write_index(root, rows)
    return rows
