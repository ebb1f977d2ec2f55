"""Our ``--timing agentx`` plan against AIPerf's, request by request, from the plans alone
(no run, so no load in the figures).

    python benchmarks/agentx_schedule_check.py --traces DIR [DIR ...]
        [--concurrency N ...] [--seed S] [--start-range LO,HI] [--recycles K] [--json OUT]
    python benchmarks/agentx_schedule_check.py DIR [--json OUT]
        [--concurrency N [--seed S] [--start-range LO,HI] [--recycles K]]

``--traces``: every weka trace file of the folders (default: ../shared/data/weka and
../shared/data/weka-corpus, the whole local AgentX corpus). AIPerf's side is built by AIPerf's
own code in its venv, with no run (``aiperf_agentx_plan.py --traces``: its weka loader, then
its trajectory source and agentic replay strategy); ours by importing the same files
(``traces import``, no ``--format``) and planning them as ``agent-replay run`` does. DIR:
a ``bench_agentx_aiperf.py --out DIR`` instead (its AIPerf dataset cache DIR/aiperf-cache,
our import DIR/trace.parquet, the traces DIR/traces).

Rules: AIPerf's dataset metadata (its weka loader's conversations, branches, delays,
recorded-interval barriers) against ``replay.agentx.stream_rules`` on our import, through
``agentx_oracle.aiperf_rules`` and ``agentx_oracle.ours_rules``. Per request
(``trace[outer].inner``): what it waits for (its direct waits, ``agentx_oracle.direct_waits``),
what its barrier holds it back for, its kind (first / next / join / child-first), its
branch (a child's first turn: the first turns of its branch's children) and its delay: a
next turn's end-to-start delay, a join's delay when its subagents ended before the parent's
previous turn (when one outlives that turn both send the join at its end), a subagent's
first turn's offset after the spawning turn's end (AIPerf: the child's turn-0
``timestamp_ms`` - its branch's ``start_timestamp_ms``).

Starts (each ``--concurrency``): AIPerf's own start plan (``aiperf_agentx_plan.py``) against
ours (``replay.agentx.first_plays``, ``warm_spread``, ``play_starts``) for the same
concurrency, seed and start range (default 0,1: the MVP scenario's): per lane its trace and
t*, the warm-ups (which requests, and when after the warm-up starts, before the system idle
cap moves them), the first measured sends (which, and when after the measured phase starts)
and the order of the next K traces the lanes recycle into. With ``--traces``, once for all
the traces as one dataset (lane i plays the i-th trace), and once for each trace alone as
the dataset (every lane plays it: every trace gets its t* draws and warm-ups).

Prints the counts that differ; exit 1 when anything differs (delays and offsets by more
than 1 ms).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import agentx_oracle as ao  # noqa: E402
from benchmarks.bench_agentx_aiperf import AIPERF_VENV, SHARED, aiperf_metadata  # noqa: E402

if TYPE_CHECKING:
    from agent_replay.replay.plan import Plan

TOL_MS = 1.0
CORPUS = (SHARED / "weka", SHARED / "weka-corpus")
"""The local AgentX corpus: 14 + 203 traces."""
CONCURRENCIES = (1, 6, 16)


def _order(k: ao.Key) -> tuple[str, int, int]:
    return (k[0], k[1], -1 if k[2] is None else k[2])


def check(run_dir: Path) -> dict[str, Any]:
    ix = ao.load_traces(sorted((run_dir / "traces").glob("*.json")))
    a = ao.aiperf_rules(aiperf_metadata(run_dir / "aiperf-cache"))
    o = ao.ours_rules(ao.read_plan(run_dir / "trace.parquet"), ix)
    return compare_plans(a, o)


def compare_plans(a: dict[ao.Key, ao.Rule], o: dict[ao.Key, ao.Rule]) -> dict[str, Any]:
    """Request by request: on one side only, direct waits, barriers, branches, kinds and
    delays that differ; the largest delay difference per kind."""
    rows: list[dict[str, Any]] = []
    for k in sorted(set(a) | set(o), key=_order):
        ra, ro = a.get(k), o.get(k)
        if ra is None or ro is None:
            rows.append({"key": ao.key_str(k), "only": "ours" if ra is None else "aiperf"})
            continue
        rows.append(
            {
                "key": ao.key_str(k),
                "kind_aiperf": ra.kind,
                "kind_ours": ro.kind,
                "waits_equal": ao.direct_waits(k, a) == ao.direct_waits(k, o),
                "barrier_equal": ra.barrier == ro.barrier,
                "branch_equal": ra.branch == ro.branch,
                "delay_aiperf_ms": ra.delay_ms,
                "delay_ours_ms": ro.delay_ms,
                "diff_ms": ro.delay_ms - ra.delay_ms,
            }
        )
    both = [r for r in rows if "only" not in r]
    by_kind: dict[str, dict[str, float | int]] = {}
    for kind in sorted({r["kind_aiperf"] for r in both}):
        diffs = [abs(r["diff_ms"]) for r in both if r["kind_aiperf"] == kind]
        by_kind[kind] = {"n": len(diffs), "max_abs_diff_ms": max(diffs)}
    return {
        "requests": len(rows),
        "only_one_side": [r for r in rows if "only" in r],
        "waits_differ": [r["key"] for r in both if not r["waits_equal"]],
        "barriers_differ": [r["key"] for r in both if not r["barrier_equal"]],
        "branches_differ": [r["key"] for r in both if not r["branch_equal"]],
        "kinds_differ": [r["key"] for r in both if r["kind_aiperf"] != r["kind_ours"]],
        "delays_differ": [r for r in both if abs(r["diff_ms"]) > TOL_MS],
        "barriers": sum(1 for k in a if a[k].barrier),
        "by_kind": by_kind,
        "traces": sorted({k[0] for k in a}),
    }


def rule_differences(res: dict[str, Any]) -> int:
    return sum(
        len(res[k])
        for k in (
            "only_one_side",
            "waits_differ",
            "barriers_differ",
            "branches_differ",
            "kinds_differ",
            "delays_differ",
        )
    )


def aiperf_starts(
    run_dir: Path,
    concurrency: int,
    seed: int,
    start_range: str,
    recycles: int,
    venv: Path = AIPERF_VENV,
) -> dict[str, Any]:
    """AIPerf's start plan (``aiperf_agentx_plan.py`` in the AIPerf venv)."""
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            str(ROOT / "benchmarks" / "aiperf_agentx_plan.py"),
            str(run_dir / "aiperf-cache"),
            "--concurrency",
            str(concurrency),
            "--seed",
            str(seed),
            "--start-range",
            start_range,
            "--recycles",
            str(recycles),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def ours_starts(
    run_dir: Path, concurrency: int, seed: int, start_range: str, recycles: int
) -> dict[str, Any]:
    """Our start plan of a ``bench_agentx_aiperf.py`` run folder (``plan_starts``)."""
    ix = ao.load_traces(sorted((run_dir / "traces").glob("*.json")))
    return plan_starts(
        ao.read_plan(run_dir / "trace.parquet"), ix, concurrency, seed, start_range, recycles
    )


def plan_starts(
    plan: Plan, ix: ao.TraceIndex, concurrency: int, seed: int, start_range: str, recycles: int
) -> dict[str, Any]:
    """Our start plan, by the functions ``AgentXDriver`` plays it with, in the shape of
    ``aiperf_agentx_plan.py``'s (one worker, no trace idle cap: the MVP scenario)."""
    from agent_replay.replay.agentx import first_plays, play_starts, warm_spread

    lo, hi = (float(x) for x in start_range.split(","))
    starts = first_plays(plan, concurrency, seed=seed, start_range=(lo, hi), tree_idle_cap_ns=None)
    warm = iter(warm_spread([x for ls in starts for x in ls.warm_leads()], None))
    lanes = []
    for ls in starts:
        keys = ao.session_keys(ls.session, ix)
        reqs, keep = ls.session.requests, ls.cut.keep
        kept = set(keep)
        at = play_starts(reqs, keep, ls.offsets, ls.cut.t_star_ns, None)
        lanes.append(
            {
                "lane": ls.lane,
                "trace": ls.session.session_id,
                "t_star_ms": ls.cut.t_star_ns / 1e6,
                "warmups": [
                    {"key": list(keys[p]), "offset_ms": next(warm) / 1e6} for p in ls.cut.warm
                ],
                "first": [
                    {"key": list(keys[p]), "offset_ms": at[p] / 1e6}
                    for p in keep
                    if not any(d in kept for d in reqs[p].deps)
                ],
            }
        )
    n = len(plan.sessions)
    return {
        "lanes": lanes,
        "recycles": [plan.sessions[(concurrency + k) % n].session_id for k in range(recycles)],
    }


def compare_starts(a: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """Lane by lane: trace, t*, warm-ups and first sends (as key -> offset), recycle order."""

    def by_key(xs: list[dict[str, Any]]) -> dict[str, float]:
        return {ao.key_str((x["key"][0], x["key"][1], x["key"][2])): x["offset_ms"] for x in xs}

    lanes = []
    for la, lo in zip(a["lanes"], o["lanes"], strict=False):
        row: dict[str, Any] = {"lane": la["lane"], "trace": la["trace"], "problems": []}
        if la["trace"] != lo["trace"]:
            row["problems"].append(f"trace: AIPerf {la['trace']}, ours {lo['trace']}")
        if abs(la["t_star_ms"] - lo["t_star_ms"]) > 1e-3:
            row["problems"].append(
                f"t*: AIPerf {la['t_star_ms']:.3f} ms, ours {lo['t_star_ms']:.3f} ms"
            )
        for what in ("warmups", "first"):
            wa, wo = by_key(la[what]), by_key(lo[what])
            if set(wa) != set(wo):
                row["problems"].append(
                    f"{what}: AIPerf only {sorted(set(wa) - set(wo))}, ours only "
                    f"{sorted(set(wo) - set(wa))}"
                )
            for k in sorted(set(wa) & set(wo)):
                if abs(wa[k] - wo[k]) > TOL_MS:
                    row["problems"].append(
                        f"{what} {k}: AIPerf at {wa[k]:,.1f} ms, ours {wo[k]:,.1f} ms"
                    )
        row.update(
            warmups=len(la["warmups"]),
            first=len(la["first"]),
            warm_spread_ms=max((x["offset_ms"] for x in la["warmups"]), default=0.0),
        )
        lanes.append(row)
    problems = [f"lane {r['lane']} ({r['trace']}): {p}" for r in lanes for p in r["problems"]]
    if len(a["lanes"]) != len(o["lanes"]):
        problems.append(f"lanes: AIPerf {len(a['lanes'])}, ours {len(o['lanes'])}")
    if a["recycles"] != o["recycles"]:
        problems.append(f"recycle order: AIPerf {a['recycles']}, ours {o['recycles']}")
    return {"lanes": lanes, "recycles": a["recycles"], "problems": problems}


def aiperf_corpus(
    folders: list[Path],
    concurrencies: list[int],
    seed: int,
    start_range: str,
    recycles: int,
    venv: Path = AIPERF_VENV,
) -> subprocess.Popen[str]:
    """AIPerf's plans of the traces of ``folders`` (``aiperf_agentx_plan.py --traces
    --per-trace``), started in the background: its stdout is the JSON."""
    cmd = [
        str(venv / "bin" / "python"),
        str(ROOT / "benchmarks" / "aiperf_agentx_plan.py"),
        "--traces",
        *map(str, folders),
        "--seed",
        str(seed),
        "--start-range",
        start_range,
        "--recycles",
        str(recycles),
        "--per-trace",
    ]
    for c in concurrencies:
        cmd += ["--concurrency", str(c)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ours_corpus(folders: list[Path]) -> tuple[Plan, ao.TraceIndex]:
    """Our plan of the traces of ``folders``: imported without ``--format`` (all at once,
    the files in name order), written and read back, planned as ``agent-replay run`` plans
    it but for the implied prefix-cache hits (``plan._implied_cached``, half the time on
    this corpus, a figure no schedule rule reads); and the traces' index."""
    from unittest import mock

    from agent_replay.traces.importers import import_paths
    from agent_replay.traces.io import write_trace

    files = sorted((f for d in folders for f in d.glob("*.json")), key=lambda f: f.name)
    res = import_paths(files)
    with tempfile.TemporaryDirectory() as tmp:
        write_trace(res.table, Path(tmp) / "trace.parquet", res.meta)
        with mock.patch("agent_replay.replay.plan._implied_cached"):
            plan = ao.read_plan(Path(tmp) / "trace.parquet")
    return plan, ao.load_traces(files)


def corpus_check(
    folders: list[Path],
    concurrencies: list[int],
    seed: int = 42,
    start_range: str = "0,1",
    recycles: int = 12,
) -> dict[str, Any]:
    """The whole plan of every trace of ``folders``, ours against AIPerf's: the rules
    (``compare_plans``), and per concurrency the start plans of all traces as one dataset
    and of each trace alone (``compare_starts``); with the seconds each side took."""
    from agent_replay.replay.plan import Plan

    t0 = time.monotonic()
    proc = aiperf_corpus(folders, concurrencies, seed, start_range, recycles)
    try:
        plan, ix = ours_corpus(folders)
        t_ours = time.monotonic() - t0
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"aiperf_agentx_plan.py failed (exit {proc.returncode}): {err[-3000:]}")
    t_aiperf = time.monotonic() - t0
    a = json.loads(out)
    res = compare_plans(ao.aiperf_rules(a["metadata"]), ao.ours_rules(plan, ix))
    res["starts"] = {}
    by_id = {s.session_id: s for s in plan.sessions}
    for c in concurrencies:
        sa = a["starts"][str(c)]
        whole = compare_starts(sa["corpus"], plan_starts(plan, ix, c, seed, start_range, recycles))
        alone: dict[str, Any] = {"traces": 0, "warmups": 0, "first": 0, "problems": []}
        for tid, ta in sa["traces"].items():
            one = Plan([by_id[tid]], plan.block_size) if tid in by_id else Plan([], plan.block_size)
            if not one.sessions:
                alone["problems"].append(f"{tid}: not in our import")
                continue
            st = compare_starts(ta, plan_starts(one, ix, c, seed, start_range, 0))
            alone["traces"] += 1
            alone["warmups"] += sum(r["warmups"] for r in st["lanes"])
            alone["first"] += sum(r["first"] for r in st["lanes"])
            alone["problems"] += [f"{tid} alone: {p}" for p in st["problems"]]
        res["starts"][str(c)] = {"corpus": whole, "alone": alone}
    res["seconds"] = {
        "ours_import_and_plan": t_ours,
        "aiperf_plan": t_aiperf,
        "total": time.monotonic() - t0,
    }
    return res


def differences(res: dict[str, Any]) -> int:
    """Every difference ``corpus_check`` found: rules, then start plans."""
    n = rule_differences(res)
    for st in res.get("starts", {}).values():
        n += len(st["corpus"]["problems"]) + len(st["alone"]["problems"])
    return n


def _print_rules(res: dict[str, Any]) -> None:
    print(
        f"{len(res['traces'])} traces: {res['requests']:,} requests; only one side "
        f"{len(res['only_one_side'])}; wait sets differ {len(res['waits_differ'])}; barriers "
        f"differ {len(res['barriers_differ'])} (AIPerf's hold {res.get('barriers', 0):,} requests); "
        f"branches differ {len(res['branches_differ'])}; kinds differ "
        f"{len(res['kinds_differ'])}; delays differ by more than {TOL_MS:g} ms "
        f"{len(res['delays_differ'])}"
    )
    for kind, v in res["by_kind"].items():
        print(
            f"  {kind}: {v['n']:,} requests, largest |delay difference| {v['max_abs_diff_ms']:.3f} ms"
        )
    for r in res["delays_differ"][:20]:
        print(
            f"  {r['key']} ({r['kind_aiperf']}): AIPerf {r['delay_aiperf_ms']:,.1f} ms, ours "
            f"{r['delay_ours_ms']:,.1f} ms"
        )
    for r in (
        res["only_one_side"][:10]
        + [{"key": k, "only": "kind"} for k in res["kinds_differ"][:10]]
        + [{"key": k, "only": "wait set"} for k in res["waits_differ"][:10]]
        + [{"key": k, "only": "barrier"} for k in res["barriers_differ"][:10]]
        + [{"key": k, "only": "branch"} for k in res["branches_differ"][:10]]
    ):
        print(f"  {r['key']}: {r['only']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, nargs="?", help="a bench_agentx_aiperf.py --out DIR")
    ap.add_argument(
        "--traces",
        type=Path,
        nargs="*",
        metavar="DIR",
        help="folders of weka traces (none named: the local AgentX corpus)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="also compare the start plans (t*, warm-ups, first sends, recycling); "
        "repeatable (with --traces, default 1, 6 and 16)",
    )
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--start-range", default="0,1", metavar="LO,HI")
    ap.add_argument("--recycles", type=int, default=12)
    args = ap.parse_args()
    if args.traces is not None:
        folders = args.traces or list(CORPUS)
        cs = args.concurrency or list(CONCURRENCIES)
        res = corpus_check(folders, cs, args.seed, args.start_range, args.recycles)
        _print_rules(res)
        print(f"starts, seed {args.seed}, start range {args.start_range}:")
        print("| concurrency | dataset | lanes | warm-ups | first sends | differences |")
        print("|---|---|---|---|---|---|")
        for c, st in res["starts"].items():
            w = st["corpus"]
            print(
                f"| {c} | all {len(res['traces'])} traces | {len(w['lanes'])} | "
                f"{sum(r['warmups'] for r in w['lanes']):,} | {sum(r['first'] for r in w['lanes']):,} | "
                f"{len(w['problems'])} |"
            )
            al = st["alone"]
            print(
                f"| {c} | each trace alone ({al['traces']}) | {int(c) * al['traces']:,} | "
                f"{al['warmups']:,} | {al['first']:,} | {len(al['problems'])} |"
            )
        for st in res["starts"].values():
            for p in (st["corpus"]["problems"] + st["alone"]["problems"])[:15]:
                print(f"  {p}")
        sec = res["seconds"]
        print(
            f"{differences(res)} differences; took {sec['total']:.1f} s (ours: import and plan "
            f"{sec['ours_import_and_plan']:.1f} s; AIPerf's plan {sec['aiperf_plan']:.1f} s, beside it)"
        )
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return 1 if differences(res) else 0
    if args.run_dir is None:
        ap.error("give DIR or --traces")
    res = check(args.run_dir)
    _print_rules(res)
    bad = rule_differences(res) > 0
    if args.concurrency:
        c = args.concurrency[0]
        a = aiperf_starts(args.run_dir, c, args.seed, args.start_range, args.recycles)
        o = ours_starts(args.run_dir, c, args.seed, args.start_range, args.recycles)
        st = compare_starts(a, o)
        res["starts"] = st
        print(
            f"starts, {c} lanes, seed {args.seed}, start range {args.start_range}: "
            f"{sum(r['warmups'] for r in st['lanes'])} warm-ups, "
            f"{sum(r['first'] for r in st['lanes'])} first sends, {len(st['problems'])} differences; "
            f"recycle order {', '.join(st['recycles'])}"
        )
        for r in st["lanes"]:
            print(
                f"  lane {r['lane']} {r['trace']}: {r['warmups']} warm-ups (last at "
                f"{r['warm_spread_ms'] / 1000:,.1f} s), {r['first']} first sends"
            )
        for p in st["problems"][:30]:
            print(f"  {p}")
        bad = bad or bool(st["problems"])
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
