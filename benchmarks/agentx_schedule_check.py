"""Our ``--timing agentx`` schedule rules against AIPerf's, request by request, from the two
plans alone (no run, so no load in the figures): AIPerf's dataset metadata (its weka loader's
output, in the dataset cache a ``bench_agentx_aiperf.py`` run leaves in DIR/aiperf-cache)
and ``replay.agentx.stream_rules`` on our import of the same traces (DIR/trace.parquet).

    python benchmarks/agentx_schedule_check.py DIR [--json OUT]

Per request (``trace[outer].inner``): what it waits for, its kind (first / next / join /
child-first) and its delay: a next turn's end-to-start delay, a join's delay when its
subagents ended before the parent's previous turn (AIPerf's join turn ``delay_ms``; when one
outlives that turn both send the join at its end), a subagent's first turn's offset after
the spawning turn's end (AIPerf: the child's turn-0 ``timestamp_ms`` - its branch's
``start_timestamp_ms``). Prints the counts that differ and the largest delay difference per
kind; exit 1 when any wait set or kind differs or a delay differs by more than 1 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import agentx_oracle as ao  # noqa: E402
from benchmarks.bench_agentx_aiperf import aiperf_metadata  # noqa: E402

KINDS = {"root": "first", "next": "next", "join": "join", "child": "child-first", "after": "after"}


def aiperf_join_delays(metadata: dict[str, Any]) -> dict[ao.Key, float]:
    """Each turn's own ``delay_ms`` (the join's delay when its subagents are done first)."""
    out: dict[ao.Key, float] = {}
    for c in metadata.get("conversations", []):
        for t in c["turns"]:
            inner = t.get("source_inner_idx")
            out[(str(t["source_trace_id"]), int(t["source_outer_idx"]),
                 None if inner is None else int(inner))] = float(t.get("delay_ms") or 0.0)
    return out


def ours(trace: Path, ix: ao.TraceIndex) -> dict[ao.Key, tuple[frozenset[ao.Key], str, float]]:
    """Our rule per request: (waits for, kind, delay ms), from ``stream_rules``."""
    from agent_replay.replay.agentx import capped_times, stream_rules
    from agent_replay.replay.plan import PlanOptions, build_plan
    from agent_replay.traces.io import read_trace

    table, meta = read_trace(trace)
    plan = build_plan(table, meta.block_size, PlanOptions())
    out: dict[ao.Key, tuple[frozenset[ao.Key], str, float]] = {}
    for s in plan.sessions:
        rank: dict[str, int] = {}
        keys: list[ao.Key] = []
        for q in s.requests:
            a = q.agent_id
            keys.append(ix.streams[(s.session_id, a)][rank.get(a, 0)])
            rank[a] = rank.get(a, 0) + 1
        offsets, thinks = capped_times(s.requests, None)
        for p, r in enumerate(stream_rules(s.requests, offsets, thinks)):
            waits = frozenset(keys[d] for d in s.requests[p].deps)
            out[keys[p]] = (waits, KINDS[r.kind], r.delay_ns / 1e6)
    return out


def check(run_dir: Path) -> dict[str, Any]:
    ix = ao.load_traces(sorted((run_dir / "traces").glob("*.json")))
    meta = aiperf_metadata(run_dir / "aiperf-cache")
    a = ao.aiperf_rules(meta)
    join_delay = aiperf_join_delays(meta)
    o = ours(run_dir / "trace.parquet", ix)
    rows: list[dict[str, Any]] = []
    for k in sorted(set(a) | set(o), key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        ra, ro = a.get(k), o.get(k)
        if ra is None or ro is None:
            rows.append({"key": ao.key_str(k), "only": "ours" if ra is None else "aiperf"})
            continue
        da = join_delay[k] if ra.delay_ms is None else ra.delay_ms
        rows.append({"key": ao.key_str(k), "kind_aiperf": ra.kind, "kind_ours": ro[1],
                     "waits_equal": ra.waits_for == ro[0], "delay_aiperf_ms": da,
                     "delay_ours_ms": ro[2], "diff_ms": ro[2] - da})
    both = [r for r in rows if "only" not in r]
    by_kind: dict[str, dict[str, float | int]] = {}
    for kind in sorted({r["kind_aiperf"] for r in both}):
        diffs = [abs(r["diff_ms"]) for r in both if r["kind_aiperf"] == kind]
        by_kind[kind] = {"n": len(diffs), "max_abs_diff_ms": max(diffs)}
    return {"requests": len(rows), "only_one_side": [r for r in rows if "only" in r],
            "waits_differ": [r["key"] for r in both if not r["waits_equal"]],
            "kinds_differ": [r["key"] for r in both if r["kind_aiperf"] != r["kind_ours"]],
            "delays_differ": [r for r in both if abs(r["diff_ms"]) > 1.0],
            "by_kind": by_kind, "traces": sorted({k[0] for k in a})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a bench_agentx_aiperf.py --out DIR")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = check(args.run_dir)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"traces {', '.join(res['traces'])}: {res['requests']} requests; only one side "
          f"{len(res['only_one_side'])}; wait sets differ {len(res['waits_differ'])}; kinds differ "
          f"{len(res['kinds_differ'])}; delays differ by more than 1 ms {len(res['delays_differ'])}")
    for kind, v in res["by_kind"].items():
        print(f"  {kind}: {v['n']} requests, largest |delay difference| {v['max_abs_diff_ms']:.3f} ms")
    for r in res["delays_differ"][:20]:
        print(f"  {r['key']} ({r['kind_aiperf']}): AIPerf {r['delay_aiperf_ms']:,.1f} ms, ours "
              f"{r['delay_ours_ms']:,.1f} ms")
    bad = res["only_one_side"] or res["waits_differ"] or res["kinds_differ"] or res["delays_differ"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
