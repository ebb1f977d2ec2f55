"""AIPerf (its ``inferencex-agentx-mvp`` scenario) against ``--timing agentx`` on the same
weka traces and the same simulated engine: per-request plan, schedule and token counts, and
the AgentX interactivity score, with the spread over repeats (the runs interleaved).

Needs the AIPerf venv and the offline tokenizer of scripts/setup-aiperf.sh, and weka traces
(default: the ones with subagents in ../shared/data/weka).

    python benchmarks/bench_agentx_aiperf.py --out DIR [--traces F.json ...] [--concurrency 2]
        [--duration 120] [--repeats 3] [--seed 42] [--ours-arg=--preset=...]

Writes DIR/report.md and DIR/report.json (and keeps every run's raw output in DIR). AIPerf
runs under ``--unsafe-override`` because the scenario refuses durations below 900 s.
The comparison logic is benchmarks/agentx_oracle.py.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import agentx_oracle as ao  # noqa: E402

SHARED = Path(os.environ.get("AGENT_REPLAY_SHARED", ROOT.parent / "shared")) / "data"
CACHE = Path(os.environ.get("AGENT_REPLAY_CACHE", Path.home() / ".cache" / "agent-replay"))
AIPERF_VENV = Path(os.environ.get("AIPERF_VENV", CACHE / "aiperf-venv"))
SIM_TOKENIZER = Path(os.environ.get("AIPERF_SIM_TOKENIZER", CACHE / "sim-tokenizer"))
SUBAGENT_TRACES = ("trace_0014", "trace_0274", "trace_0277", "trace_0279", "trace_0282", "trace_0291")
MODEL = "sim-agentx"
SCENARIO = "inferencex-agentx-mvp"


def aiperf_bin(venv: Path = AIPERF_VENV) -> Path | None:
    b = venv / "bin" / "aiperf"
    return b if b.exists() and (SIM_TOKENIZER / "tokenizer.json").exists() else None


def sim_profile(dest: Path) -> Path:
    """The ``fast`` profile with room for the weka contexts (up to ~170k tokens)."""
    from agent_replay.engines import sim
    p = json.loads((Path(sim.__file__).parent / "profiles" / "fast.json").read_text())
    p.update(name="agentx-oracle", model_name=MODEL, max_model_len=262_144,
             kv_cache_blocks=200_000, prefix_cache_blocks=200_000)
    dest.write_text(json.dumps(p, indent=1))
    return dest


def load_now() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def reset_cache(url: str) -> None:
    req = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass


def run_aiperf(binary: Path, url: str, traces_dir: Path, out: Path, cache: Path, *,
               concurrency: int, duration: float, seed: int,
               start_range: tuple[float, float] | None) -> dict[str, Any]:
    cmd = [str(binary), "profile", "--scenario", SCENARIO, "--unsafe-override",
           "--benchmark-duration", f"{duration:g}", "--url", url.removeprefix("http://"),
           "--model", MODEL, "--tokenizer", str(SIM_TOKENIZER), "--endpoint-type", "chat",
           "--custom-dataset-type", "weka_trace", "--input-file", str(traces_dir),
           "--concurrency", str(concurrency), "--use-server-token-count",
           "--random-seed", str(seed), "--artifact-dir", str(out), "--ui", "none"]
    if start_range is not None:
        cmd += ["--trajectory-start-min-ratio", f"{start_range[0]:g}",
                "--trajectory-start-max-ratio", f"{start_range[1]:g}"]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["AIPERF_DATASET_MMAP_CACHE_DIR"] = str(cache)
    return _timed(cmd, out.with_suffix(".log"), env, duration)


def run_ours(trace: Path, url: str, out: Path, *, concurrency: int, duration: float, seed: int,
             start_range: tuple[float, float] | None, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "agent_replay", "run", str(trace), "--timing", "agentx",
           "--concurrency", str(concurrency), "--duration", f"{duration:g}", "--target", url,
           "--model", MODEL, "--seed", str(seed), "-o", str(out), "--force",
           "--no-progress", "--scrape-interval", "0", *extra]
    if start_range is not None:
        cmd.append(f"--start-range={start_range[0]:g},{start_range[1]:g}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return _timed(cmd, out.with_suffix(".log"), env, duration)


def _timed(cmd: list[str], log: Path, env: dict[str, str], duration: float) -> dict[str, Any]:
    before = load_now()
    t0 = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                            timeout=duration + 900, check=False).returncode
    return {"cmd": cmd, "rc": rc, "wall_s": time.monotonic() - t0, "load_before": before,
            "load_after": load_now(), "log": str(log)}


def aiperf_metadata(cache: Path) -> dict[str, Any]:
    manifests = sorted(glob.glob(str(cache / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"bench_agentx_aiperf: no AIPerf dataset manifest under {cache}")
    return dict(json.loads(json.loads(Path(manifests[-1]).read_text())["dataset_metadata_json"]))


def _fmt(x: float, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def analyse(out: Path, runs: list[dict[str, Any]], trace_files: list[Path]) -> dict[str, Any]:
    ix = ao.load_traces(trace_files)
    plan = pq.read_table(out / "trace.parquet", columns=[
        "session_id", "request_index", "agent_id"]).to_pylist()
    ranks = ao.stream_ranks(plan)
    rules_a = ao.aiperf_rules(aiperf_metadata(out / "aiperf-cache"))
    rules_o = ao.ours_rules(ao.read_plan(out / "trace.parquet"), ix)
    rule_diffs = ao.compare_rules(rules_a, rules_o)
    differ = {d.key for d in rule_diffs}
    sent: dict[str, list[ao.Sent]] = {"aiperf": [], "ours": []}
    scores: dict[str, list[dict[str, Any]]] = {"aiperf": [], "ours": []}
    problems: list[str] = []
    for r in runs:
        if r["rc"] != 0 and not (r["side"] == "ours" and (Path(r["dir"]) / "run.json").exists()):
            problems.append(f"{r['side']} repeat {r['repeat']}: exit {r['rc']} (see {r['log']})")
            continue
        if r["side"] == "aiperf":
            recs = [json.loads(line) for line in (Path(r["dir"]) / "profile_export.jsonl").read_text().splitlines() if line]
            s = ao.aiperf_sent(recs, r["repeat"])
        else:
            rows = pq.read_table(Path(r["dir"]) / "requests").to_pylist()
            s, probs = ao.ours_sent(rows, ix, ranks, r["repeat"])
            problems += probs
        sent[r["side"]] += s
        sc = ao.interactivity(s)
        if r["side"] == "aiperf":  # AIPerf's own figure: its inter_token_latency P90
            agg = json.loads((Path(r["dir"]) / "profile_export_aiperf.json").read_text())
            p90 = (agg.get("inter_token_latency") or {}).get("p90")
            sc["aiperf_own_tok_s_user"] = 1000.0 / p90 if p90 else math.nan
        sc.update(repeat=r["repeat"], requests=sum(not x.warmup for x in s),
                  warmups=sum(x.warmup for x in s), load_before=r["load_before"],
                  load_after=r["load_after"])
        scores[r["side"]].append(sc)
    gaps = ao.compare_gaps(ao.measured_gaps(sent["aiperf"], rules_a),
                           ao.measured_gaps(sent["ours"], rules_o))
    by_kind: dict[str, list[float]] = {}
    by_cause: dict[str, list[float]] = {}
    for g in gaps:
        kind = f"{rules_a[g.key].kind}/{rules_o[g.key].kind}"
        by_kind.setdefault(kind, []).append(g.diff_ms)
        by_cause.setdefault(ao.classify(g, g.key in differ), []).append(g.diff_ms)
    lag = by_cause.get("lag", [])
    # each side against its own plan, where no idle cap moved the send: how late it went
    late = {side: ao.summarize([getattr(g, f"{side}_ms") - getattr(g, f"plan_{side}_ms")
                                for g in gaps if ao.classify(g, g.key in differ) != "idle-cap"])
            for side in ("aiperf", "ours")}
    tokens = ao.compare_tokens(sent["aiperf"] + sent["ours"], ix)
    warm_a, warm_o = ao.warmups(sent["aiperf"]), ao.warmups(sent["ours"])
    warm_runs = []
    for rep in sorted(set(warm_a) & set(warm_o)):
        wa, wo = warm_a[rep], warm_o[rep]
        both = sorted(set(wa.sends) & set(wo.sends), key=lambda k: wa.sends[k])
        warm_runs.append({
            "repeat": rep, "aiperf": len(wa.sends), "ours": len(wo.sends),
            "same_requests": set(wa.sends) == set(wo.sends),
            "diff": ao.summarize([wa.sends[k] - wo.sends[k] for k in both]),
            "measured_start_ms": {"aiperf": wa.measured_start_ms, "ours": wo.measured_start_ms},
            "per_request": [{"key": ao.key_str(k), "aiperf_ms": wa.sends[k], "ours_ms": wo.sends[k]}
                            for k in both]})
    keys = {s: {x.key for x in sent[s] if not x.warmup} for s in sent}
    return {
        "rules": {"requests": len(rules_a), "differ": [
            {"key": ao.key_str(d.key), "aiperf_kind": d.aiperf.kind if d.aiperf else None,
             "ours_kind": d.ours.kind if d.ours else None, "what": d.what} for d in rule_diffs]},
        "coverage": {"aiperf_keys": len(keys["aiperf"]), "ours_keys": len(keys["ours"]),
                     "both": len(keys["aiperf"] & keys["ours"])},
        "gaps": {"all": ao.summarize([g.diff_ms for g in gaps]),
                 "by_kind": {k: ao.summarize(v) for k, v in sorted(by_kind.items())},
                 "by_cause": {k: ao.summarize(v) for k, v in sorted(by_cause.items())},
                 "lag_signed_p50_ms": ao.percentile(lag, 50),
                 "late_vs_own_plan": late,
                 "per_request": [{"key": ao.key_str(g.key), "aiperf_ms": g.aiperf_ms,
                                  "ours_ms": g.ours_ms, "diff_ms": g.diff_ms,
                                  "n_aiperf": g.n_aiperf, "n_ours": g.n_ours,
                                  "kind": f"{rules_a[g.key].kind}/{rules_o[g.key].kind}",
                                  "cause": ao.classify(g, g.key in differ),
                                  "plan_aiperf_ms": g.plan_aiperf_ms,
                                  "plan_ours_ms": g.plan_ours_ms}
                                 for g in gaps]},
        "tokens": {"requests": len(tokens),
                   "input_rel_diff": ao.summarize([(t.aiperf_in - t.ours_in) / t.trace_in * 100 for t in tokens]),
                   "ours_input_vs_trace": ao.summarize([(t.ours_in - t.trace_in) / t.trace_in * 100 for t in tokens]),
                   "aiperf_input_vs_trace": ao.summarize([(t.aiperf_in - t.trace_in) / t.trace_in * 100 for t in tokens]),
                   "output_mismatch": sum(t.aiperf_out != t.ours_out for t in tokens),
                   "per_request": [{
                       "key": ao.key_str(t.key), "trace_in": t.trace_in, "aiperf_in": t.aiperf_in,
                       "ours_in": t.ours_in, "trace_out": t.trace_out, "aiperf_out": t.aiperf_out,
                       "ours_out": t.ours_out} for t in tokens]},
        "warmups": warm_runs,
        "scores": {s: {"runs": scores[s], "spread": ao.spread([x["tok_s_user"] for x in scores[s]])}
                   for s in scores},
        "problems": problems,
    }


def render(res: dict[str, Any], meta: dict[str, Any]) -> str:
    L = [f"# AIPerf vs agent-replay, AgentX on weka traces ({meta['date']})", "",
         f"host {meta['host']}, {meta['cpus']} CPUs, load at start {meta['load_start']}; "
         f"code {meta['code']}; AIPerf {meta['aiperf_version']}; traces {', '.join(meta['traces'])}; "
         f"concurrency {meta['concurrency']}, duration {meta['duration']:g} s, repeats "
         f"{meta['repeats']}, seed {meta['seed']}, start range {meta.get('start_range') or 'each side default'}, "
         f"ours {' '.join(meta.get('ours_args') or [])}", "",
         "## Score: AgentX interactivity, 1 / P90 of (E2EL - TTFT) / (OSL - 1)", "",
         "| side | repeat | requests | scored | tok/s/user | AIPerf's own 1/P90(ITL) | load before | load after |",
         "|---|---|---|---|---|---|---|---|"]
    for side in ("aiperf", "ours"):
        for x in res["scores"][side]["runs"]:
            L.append(f"| {side} | {x['repeat']} | {x['requests']} | {x['n']} | "
                     f"{_fmt(x['tok_s_user'])} | {_fmt(x.get('aiperf_own_tok_s_user', math.nan))} | "
                     f"{x['load_before']} | {x['load_after']} |")
        sp = res["scores"][side]["spread"]
        L.append(f"| {side} | mean | | | {_fmt(sp['mean'])} (range {_fmt(sp['min'])}-"
                 f"{_fmt(sp['max'])}, {_fmt(sp['rel_range'] * 100)}%) | | | |")
    c = res["coverage"]
    L += ["", "## Schedule: gap after the awaited request's end, median per request, AIPerf - ours", "",
          f"requests measured: AIPerf {c['aiperf_keys']}, ours {c['ours_keys']}, both {c['both']}", "",
          "| rule (AIPerf/ours) | n | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
    for k, s in [("all", res["gaps"]["all"]), *res["gaps"]["by_kind"].items(),
                 *((f"cause: {c}", v) for c, v in res["gaps"]["by_cause"].items())]:
        L.append(f"| {k} | {s['n']} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | {_fmt(s['max_ms'])} |")
    L += ["", f"(|AIPerf - ours|; cause lag: both waited their full planned gap, signed "
          f"p50 {_fmt(res['gaps']['lag_signed_p50_ms'])} ms; idle-cap: a side's 10 s system idle cap "
          "cut the delay; plan: the plans differ, see below)"]
    if "late_vs_own_plan" in res["gaps"]:
        L += ["", "Each side against its own plan (sent minus planned gap, requests no idle cap "
              "moved):", "", "| side | n | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
        for side, s in res["gaps"]["late_vs_own_plan"].items():
            L.append(f"| {side} | {s['n']} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | "
                     f"{_fmt(s['max_ms'])} |")
    worst = sorted(res["gaps"]["per_request"], key=lambda g: -abs(g["diff_ms"]))[:15]
    if worst:
        L += ["", "Largest differences:", "",
              "| request | rule | cause | planned AIPerf/ours ms | AIPerf ms | ours ms | diff ms |",
              "|---|---|---|---|---|---|---|"]
        L += [f"| {g['key']} | {g['kind']} | {g['cause']} | "
              f"{_fmt(g['plan_aiperf_ms'], 0)}/"
              f"{_fmt(g['plan_ours_ms'], 0)} | {_fmt(g['aiperf_ms'])} | {_fmt(g['ours_ms'])} | "
              f"{_fmt(g['diff_ms'])} |" for g in worst]
    L += ["", "## Warm-up: each warm-up's send and the first measured send, after the first warm-up", "",
          "| repeat | warm-ups AIPerf/ours | same requests | |AIPerf - ours| p50 ms | max ms | "
          "first measured send AIPerf/ours s |", "|---|---|---|---|---|---|"]
    for w in res.get("warmups", []):
        ms = w["measured_start_ms"]
        L.append(f"| {w['repeat']} | {w['aiperf']}/{w['ours']} | {'yes' if w['same_requests'] else 'NO'} | "
                 f"{_fmt(w['diff']['p50_ms'])} | {_fmt(w['diff']['max_ms'])} | "
                 f"{_fmt((ms['aiperf'] or math.nan) / 1000, 2)}/{_fmt((ms['ours'] or math.nan) / 1000, 2)} |")
    t = res["tokens"]
    L += ["", "## Tokens (server counts, per request sent by both)", "",
          f"requests {t['requests']}; input AIPerf vs ours (% of trace `in`): p50 "
          f"{_fmt(t['input_rel_diff']['p50_ms'], 2)}, max {_fmt(t['input_rel_diff']['max_ms'], 2)}; "
          f"ours vs trace: max {_fmt(t['ours_input_vs_trace']['max_ms'], 2)}%; AIPerf vs trace: "
          f"p50 {_fmt(t['aiperf_input_vs_trace']['p50_ms'], 2)}%, max "
          f"{_fmt(t['aiperf_input_vs_trace']['max_ms'], 2)}%; output tokens differing: "
          f"{t['output_mismatch']}"]
    L += ["", f"## Plan differences ({len(res['rules']['differ'])} of {res['rules']['requests']} requests)", "",
          "| request | rule (AIPerf/ours) | difference |", "|---|---|---|"]
    L += [f"| {d['key']} | {d['aiperf_kind']}/{d['ours_kind']} | {d['what']} |" for d in res["rules"]["differ"]]
    if res["problems"]:
        L += ["", "## Problems", ""] + [f"- {p}" for p in res["problems"]]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--traces", nargs="*", type=Path)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--start-range", default=None, metavar="LO,HI",
                    help="both sides' start instant t* range (fractions of a trace's span); "
                         "default: each side's scenario (AIPerf 0-1, our preset's)")
    ap.add_argument("--ours-arg", action="append", default=None,
                    help="argument for `agent-replay run` (repeat; default --preset=aiperf-agentx-mvp "
                         "--min-duration=0 --metric-coverage=0)")
    ap.add_argument("--analyse-only", action="store_true", help="re-read DIR's runs, do not run")
    args = ap.parse_args()
    # AIPerf runs short under --unsafe-override: ours likewise, without the 900 s floor
    ours_args = args.ours_arg if args.ours_arg is not None else [
        "--preset=aiperf-agentx-mvp", "--min-duration=0", "--metric-coverage=0"]
    start_range = None
    if args.start_range:
        lo, hi = (float(x) for x in args.start_range.split(","))
        start_range = (lo, hi)
    binary = aiperf_bin()
    if binary is None and not args.analyse_only:
        print(f"bench_agentx_aiperf: no AIPerf at {AIPERF_VENV} or no tokenizer at {SIM_TOKENIZER}; "
              "run scripts/setup-aiperf.sh", file=sys.stderr)
        return 2
    out: Path = args.out
    files = args.traces or [SHARED / "weka" / f"{t}.json" for t in SUBAGENT_TRACES]
    for f in files:
        if not f.exists():
            print(f"bench_agentx_aiperf: {f}: no such trace", file=sys.stderr)
            return 2
    if args.analyse_only:
        meta = json.loads((out / "report.json").read_text())["meta"]
        runs = json.loads((out / "runs.json").read_text())
    else:
        out.mkdir(parents=True, exist_ok=True)
        tdir = out / "traces"
        shutil.rmtree(tdir, ignore_errors=True)
        tdir.mkdir()
        for f in files:
            shutil.copyfile(f, tdir / f.name)
        subprocess.run([sys.executable, "-m", "agent_replay", "traces", "import", str(tdir), "-o",
                        str(out / "trace.parquet"), "--force"], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       stdout=subprocess.DEVNULL)
        from agent_replay.engines.sim.process import SimProcess
        from agent_replay.replay.provenance import code_version
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
                "cpus": os.cpu_count(), "load_start": load_now(), "code": code_version(),
                "aiperf_version": version.splitlines()[-1] if version else "?",
                "traces": [f.stem for f in files], "concurrency": args.concurrency,
                "duration": args.duration, "repeats": args.repeats, "seed": args.seed,
                "ours_args": ours_args, "start_range": args.start_range}
        runs = []
        with SimProcess(sim_profile(out / "sim-profile.json")) as sim:
            for r in range(args.repeats):
                order = ("aiperf", "ours") if r % 2 == 0 else ("ours", "aiperf")
                for side in order:
                    reset_cache(sim.url)
                    d = out / f"{side}-{r}"
                    shutil.rmtree(d, ignore_errors=True)
                    if side == "aiperf":
                        assert binary is not None
                        info = run_aiperf(binary, sim.url, tdir, d, out / "aiperf-cache",
                                          concurrency=args.concurrency, duration=args.duration,
                                          seed=args.seed, start_range=start_range)
                    else:
                        info = run_ours(out / "trace.parquet", sim.url, d, concurrency=args.concurrency,
                                        duration=args.duration, seed=args.seed,
                                        start_range=start_range, extra=ours_args)
                    info.update(side=side, repeat=r, dir=str(d))
                    runs.append(info)
                    print(f"{side} repeat {r}: exit {info['rc']} in {info['wall_s']:.0f} s, load "
                          f"{info['load_before']} -> {info['load_after']}", flush=True)
        (out / "runs.json").write_text(json.dumps(runs, indent=1))
    res = analyse(out, runs, sorted((out / "traces").glob("*.json")))
    res["meta"] = meta
    (out / "report.json").write_text(json.dumps(res, indent=1, default=str))
    text = render(res, meta)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
