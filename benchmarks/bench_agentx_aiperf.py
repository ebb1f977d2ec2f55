"""AIPerf (its ``inferencex-agentx-mvp`` scenario) against ``--timing agentx`` on the same
weka traces and the same simulated engine: per-request plan, schedule and token counts, and
the AgentX scores (interactivity and the North Star), with the spread over repeats (the runs
interleaved) and each run's host load. The verdict (scores equal within the repeats' spread
or not) is refused when the two sides measured different requests, or when any run met host
contention (other processes kept the host busy: ``analysis.selfcheck.host_busy``, the line
of ``analysis.compare.contention_refusal``).

Needs the AIPerf venv and the offline tokenizer of scripts/setup-aiperf.sh, and weka traces
(default: the ones with subagents in ../shared/data/weka; ``--pick N --pick-seed S`` draws N
traces of ``--pick-from``, default ../shared/data/weka-corpus, and prints the seed).

    python benchmarks/bench_agentx_aiperf.py --out DIR [--traces F.json ...] [--concurrency 2]
        [--duration 120] [--repeats 3] [--seed 42] [--ours-arg=--preset=...]
        [--pick 6 --pick-seed S]

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
from agent_replay.analysis.compare import contention_refusal  # noqa: E402
from agent_replay.analysis.selfcheck import Machine, host_busy  # noqa: E402
from benchmarks import agentx_oracle as ao  # noqa: E402

SHARED = Path(os.environ.get("AGENT_REPLAY_SHARED", ROOT.parent / "shared")) / "data"
CACHE = Path(os.environ.get("AGENT_REPLAY_CACHE", Path.home() / ".cache" / "agent-replay"))
AIPERF_VENV = Path(os.environ.get("AIPERF_VENV", CACHE / "aiperf-venv"))
SIM_TOKENIZER = Path(os.environ.get("AIPERF_SIM_TOKENIZER", CACHE / "sim-tokenizer"))
SUBAGENT_TRACES = (
    "trace_0014",
    "trace_0274",
    "trace_0277",
    "trace_0279",
    "trace_0282",
    "trace_0291",
)
MODEL = "sim-agentx"
SCENARIO = "inferencex-agentx-mvp"


def aiperf_bin(venv: Path = AIPERF_VENV) -> Path | None:
    b = venv / "bin" / "aiperf"
    return b if b.exists() and (SIM_TOKENIZER / "tokenizer.json").exists() else None


def sim_profile(dest: Path, max_model_len: int = 1_048_576) -> Path:
    """The ``fast`` profile with room for every weka context (the corpus's longest call holds
    about 716k tokens): a request the engine refused would end AIPerf's run when it is a
    warm-up, and would leave the two sides measuring different requests otherwise."""
    from agent_replay.engines import sim

    p = json.loads((Path(sim.__file__).parent / "profiles" / "fast.json").read_text())
    p.update(
        name="agentx-oracle",
        model_name=MODEL,
        max_model_len=max_model_len,
        kv_cache_blocks=200_000,
        prefix_cache_blocks=200_000,
    )
    dest.write_text(json.dumps(p, indent=1))
    return dest


def load_now() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def reset_cache(url: str) -> None:
    req = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass


def run_aiperf(
    binary: Path,
    url: str,
    traces_dir: Path,
    out: Path,
    cache: Path,
    *,
    concurrency: int,
    duration: float,
    seed: int,
    start_range: tuple[float, float] | None,
    engine_pid: int | None = None,
) -> dict[str, Any]:
    cmd = [
        str(binary),
        "profile",
        "--scenario",
        SCENARIO,
        "--unsafe-override",
        "--benchmark-duration",
        f"{duration:g}",
        "--url",
        url.removeprefix("http://"),
        "--model",
        MODEL,
        "--tokenizer",
        str(SIM_TOKENIZER),
        "--endpoint-type",
        "chat",
        "--custom-dataset-type",
        "weka_trace",
        "--input-file",
        str(traces_dir),
        "--concurrency",
        str(concurrency),
        "--use-server-token-count",
        "--random-seed",
        str(seed),
        "--artifact-dir",
        str(out),
        "--ui",
        "none",
    ]
    if start_range is not None:
        cmd += [
            "--trajectory-start-min-ratio",
            f"{start_range[0]:g}",
            "--trajectory-start-max-ratio",
            f"{start_range[1]:g}",
        ]
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env["AIPERF_DATASET_MMAP_CACHE_DIR"] = str(cache)
    return _timed(cmd, out.with_suffix(".log"), env, duration, engine_pid)


def run_ours(
    trace: Path,
    url: str,
    out: Path,
    *,
    concurrency: int,
    duration: float,
    seed: int,
    start_range: tuple[float, float] | None,
    extra: list[str],
    engine_pid: int | None = None,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "agent_replay",
        "run",
        str(trace),
        "--timing",
        "agentx",
        "--concurrency",
        str(concurrency),
        "--duration",
        f"{duration:g}",
        "--target",
        url,
        "--model",
        MODEL,
        "--seed",
        str(seed),
        "-o",
        str(out),
        "--force",
        "--no-progress",
        "--scrape-interval",
        "0",
        *extra,
    ]
    if start_range is not None:
        cmd.append(f"--start-range={start_range[0]:g},{start_range[1]:g}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return _timed(cmd, out.with_suffix(".log"), env, duration, engine_pid)


def _process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0 when it is not there."""
    import psutil

    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def _reap(proc: subprocess.Popen[Any]) -> tuple[int, float] | None:
    """(exit code, CPU seconds of the process and the descendants it reaped) once ``proc``
    has ended, None while it runs: ``wait4`` reports that child's own usage, where the
    caller's RUSAGE_CHILDREN would also count any other child reaped meanwhile."""
    pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
    if not pid:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_utime + ru.ru_stime


def _timed(
    cmd: list[str], log: Path, env: dict[str, str], duration: float, engine_pid: int | None = None
) -> dict[str, Any]:
    """Run one side and measure the host over it (``analysis.selfcheck.MachineMeter``): the
    benchmark's own processes (the side's process tree and the engine) are ``ours``; the
    rest of the host's busy CPU is other processes'. The side's CPU: what the processes of
    its tree were last seen to have used (polled every 0.2 s: AIPerf's services need not be
    reaped by their parent), or what the reaped tree reports, whichever is more."""
    import psutil

    from agent_replay.analysis.selfcheck import MachineMeter

    before = load_now()
    meter = MachineMeter()
    engine0 = _process_cpu_s(engine_pid)
    reaped_s = 0.0
    seen: dict[int, float] = {}
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                done = _reap(proc)
                if done is not None:
                    rc, reaped_s = done
                    break
                time.sleep(0.2)
                if time.monotonic() - t0 > duration + 900:
                    proc.kill()
                    rc = proc.wait()
                    break
                try:
                    tree = [
                        psutil.Process(proc.pid),
                        *psutil.Process(proc.pid).children(recursive=True),
                    ]
                except psutil.Error:
                    continue
                for q in tree:
                    try:
                        t = q.cpu_times()
                        seen[q.pid] = float(t.user + t.system)
                    except psutil.Error:
                        pass
        except BaseException:
            proc.kill()
            raise
    wall = time.monotonic() - t0
    side_s = max(reaped_s, sum(seen.values()))
    engine_s = _process_cpu_s(engine_pid) - engine0
    m = meter.machine(side_s + engine_s)
    return {
        "cmd": cmd,
        "rc": rc,
        "wall_s": wall,
        "load_before": before,
        "load_after": load_now(),
        "log": str(log),
        "machine": {
            "cpus": m.cpus,
            "busy_cores": m.busy_cores,
            "steal": m.steal,
            "ours_cores": m.ours_cores,
            "side_cores": side_s / wall,
            "engine_cores": engine_s / wall,
            "host_busy": host_busy(m),
        },
    }


def contended(runs: list[dict[str, Any]]) -> list[str]:
    """The runs (``side-repeat``) whose host was busy with other processes."""
    out = []
    for r in runs:
        m = Machine.from_dict(r.get("machine"))
        if m is not None and host_busy(m):
            out.append(f"{r['side']}-{r['repeat']}")
    return out


SCORES = (
    ("interactivity", "AgentX interactivity, 1 / P90 of (E2EL - TTFT) / (OSL - 1)"),
    ("north_star", "North Star, 1 / P90 of E2EL / OSL"),
)


def verdicts(res: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """One line per score: equal within the repeats' spread (the two sides' ranges over
    the repeats overlap), or which side reads higher and by how much; no verdict under host
    contention or when the sides measured different requests."""
    refuse = contention_refusal(contended(runs), "when nothing else runs on it")
    if refuse:
        return [refuse]
    c = res["coverage"]
    if not (c["aiperf_keys"] == c["ours_keys"] == c["both"]):
        return [
            f"no verdict: the sides measured different requests (AIPerf {c['aiperf_keys']}, "
            f"ours {c['ours_keys']}, both {c['both']})"
        ]
    out = []
    for key, label in SCORES:
        a, o = res["scores"]["aiperf"]["spread"][key], res["scores"]["ours"]["spread"][key]
        if any(math.isnan(x) for x in (a["min"], o["min"])):
            out.append(f"{label}: no verdict (a side has no score)")
        elif a["min"] <= o["max"] and o["min"] <= a["max"]:
            out.append(
                f"{label}: equal within the repeats' spread (AIPerf {_fmt(a['min'])}-"
                f"{_fmt(a['max'])}, ours {_fmt(o['min'])}-{_fmt(o['max'])} tok/s/user)"
            )
        else:
            rel = (o["mean"] - a["mean"]) / a["mean"] * 100
            out.append(
                f"{label}: ours {'higher' if rel > 0 else 'lower'} by {abs(rel):.1f}% "
                f"beyond the repeats' spread (AIPerf {_fmt(a['min'])}-{_fmt(a['max'])}, "
                f"ours {_fmt(o['min'])}-{_fmt(o['max'])} tok/s/user)"
            )
    return out


def pick_traces(folder: Path, n: int, seed: int) -> list[Path]:
    """``n`` traces of ``folder`` drawn by ``seed`` (``random.Random``, over the sorted
    names: the same seed draws the same set)."""
    import random

    files = sorted(folder.glob("trace_*.json"))
    if len(files) < n:
        raise SystemExit(f"bench_agentx_aiperf: {folder} has {len(files)} traces, fewer than {n}")
    return sorted(random.Random(seed).sample(files, n))


def calls_without_api_time(path: Path) -> tuple[int, int]:
    """(calls without ``api_time``, calls) of a weka trace, subagents' calls included."""

    def walk(reqs: list[Any]) -> tuple[int, int]:
        missing = total = 0
        for r in reqs:
            if isinstance(r, dict) and isinstance(r.get("requests"), list):
                m, t = walk(r["requests"])
                missing, total = missing + m, total + t
            elif isinstance(r, dict):
                total += 1
                missing += r.get("api_time") is None
        return missing, total

    return walk(json.loads(path.read_text()).get("requests") or [])


def aiperf_metadata(cache: Path) -> dict[str, Any]:
    manifests = sorted(glob.glob(str(cache / "*" / "manifest.json")), key=os.path.getmtime)
    if not manifests:
        raise SystemExit(f"bench_agentx_aiperf: no AIPerf dataset manifest under {cache}")
    return dict(json.loads(json.loads(Path(manifests[-1]).read_text())["dataset_metadata_json"]))


def _fmt(x: float, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def analyse(out: Path, runs: list[dict[str, Any]], trace_files: list[Path]) -> dict[str, Any]:
    ix = ao.load_traces(trace_files)
    plan = pq.read_table(
        out / "trace.parquet", columns=["session_id", "request_index", "agent_id"]
    ).to_pylist()
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
            recs = [
                json.loads(line)
                for line in (Path(r["dir"]) / "profile_export.jsonl").read_text().splitlines()
                if line
            ]
            s = ao.aiperf_sent(recs, r["repeat"])
        else:
            rows = pq.read_table(Path(r["dir"]) / "requests").to_pylist()
            s, probs = ao.ours_sent(rows, ix, ranks, r["repeat"])
            problems += probs
        sent[r["side"]] += s
        sc = ao.interactivity(s)
        sc["north_star_tok_s_user"] = ao.north_star(s)["tok_s_user"]
        if r["side"] == "aiperf":  # AIPerf's own figure: its inter_token_latency P90
            agg = json.loads((Path(r["dir"]) / "profile_export_aiperf.json").read_text())
            p90 = (agg.get("inter_token_latency") or {}).get("p90")
            sc["aiperf_own_tok_s_user"] = 1000.0 / p90 if p90 else math.nan
        sc.update(
            repeat=r["repeat"],
            requests=sum(not x.warmup for x in s),
            warmups=sum(x.warmup for x in s),
            load_before=r["load_before"],
            load_after=r["load_after"],
            machine=r.get("machine"),
        )
        scores[r["side"]].append(sc)
    gaps = ao.compare_gaps(
        ao.measured_gaps(sent["aiperf"], rules_a), ao.measured_gaps(sent["ours"], rules_o)
    )
    by_kind: dict[str, list[float]] = {}
    by_cause: dict[str, list[float]] = {}
    for g in gaps:
        kind = f"{rules_a[g.key].kind}/{rules_o[g.key].kind}"
        by_kind.setdefault(kind, []).append(g.diff_ms)
        by_cause.setdefault(ao.classify(g, g.key in differ), []).append(g.diff_ms)
    lag = by_cause.get("lag", [])
    # each side against its own plan, where no idle cap moved the send: how late it went
    late = {
        side: ao.summarize(
            [
                getattr(g, f"{side}_ms") - getattr(g, f"plan_{side}_ms")
                for g in gaps
                if ao.classify(g, g.key in differ) != "idle-cap"
            ]
        )
        for side in ("aiperf", "ours")
    }
    tokens = ao.compare_tokens(sent["aiperf"] + sent["ours"], ix)
    warm_a, warm_o = ao.warmups(sent["aiperf"]), ao.warmups(sent["ours"])
    warm_runs = []
    for rep in sorted(set(warm_a) & set(warm_o)):
        wa, wo = warm_a[rep], warm_o[rep]
        both = sorted(set(wa.sends) & set(wo.sends), key=lambda k: wa.sends[k])
        warm_runs.append(
            {
                "repeat": rep,
                "aiperf": len(wa.sends),
                "ours": len(wo.sends),
                "same_requests": set(wa.sends) == set(wo.sends),
                "diff": ao.summarize([wa.sends[k] - wo.sends[k] for k in both]),
                "measured_start_ms": {"aiperf": wa.measured_start_ms, "ours": wo.measured_start_ms},
                "per_request": [
                    {"key": ao.key_str(k), "aiperf_ms": wa.sends[k], "ours_ms": wo.sends[k]}
                    for k in both
                ],
            }
        )
    keys = {s: {x.key for x in sent[s] if not x.warmup} for s in sent}
    return {
        "rules": {
            "requests": len(rules_a),
            "differ": [
                {
                    "key": ao.key_str(d.key),
                    "aiperf_kind": d.aiperf.kind if d.aiperf else None,
                    "ours_kind": d.ours.kind if d.ours else None,
                    "what": d.what,
                }
                for d in rule_diffs
            ],
        },
        "coverage": {
            "aiperf_keys": len(keys["aiperf"]),
            "ours_keys": len(keys["ours"]),
            "both": len(keys["aiperf"] & keys["ours"]),
        },
        "gaps": {
            "all": ao.summarize([g.diff_ms for g in gaps]),
            "by_kind": {k: ao.summarize(v) for k, v in sorted(by_kind.items())},
            "by_cause": {k: ao.summarize(v) for k, v in sorted(by_cause.items())},
            "lag_signed_p50_ms": ao.percentile(lag, 50),
            "late_vs_own_plan": late,
            "per_request": [
                {
                    "key": ao.key_str(g.key),
                    "aiperf_ms": g.aiperf_ms,
                    "ours_ms": g.ours_ms,
                    "diff_ms": g.diff_ms,
                    "n_aiperf": g.n_aiperf,
                    "n_ours": g.n_ours,
                    "kind": f"{rules_a[g.key].kind}/{rules_o[g.key].kind}",
                    "cause": ao.classify(g, g.key in differ),
                    "plan_aiperf_ms": g.plan_aiperf_ms,
                    "plan_ours_ms": g.plan_ours_ms,
                }
                for g in gaps
            ],
        },
        "tokens": {
            "requests": len(tokens),
            "input_rel_diff": ao.summarize(
                [(t.aiperf_in - t.ours_in) / t.trace_in * 100 for t in tokens]
            ),
            "ours_input_vs_trace": ao.summarize(
                [(t.ours_in - t.trace_in) / t.trace_in * 100 for t in tokens]
            ),
            "aiperf_input_vs_trace": ao.summarize(
                [(t.aiperf_in - t.trace_in) / t.trace_in * 100 for t in tokens]
            ),
            "output_mismatch": sum(t.aiperf_out != t.ours_out for t in tokens),
            "per_request": [
                {
                    "key": ao.key_str(t.key),
                    "trace_in": t.trace_in,
                    "aiperf_in": t.aiperf_in,
                    "ours_in": t.ours_in,
                    "trace_out": t.trace_out,
                    "aiperf_out": t.aiperf_out,
                    "ours_out": t.ours_out,
                }
                for t in tokens
            ],
        },
        "warmups": warm_runs,
        "scores": {
            s: {
                "runs": scores[s],
                "spread": {
                    "interactivity": ao.spread([x["tok_s_user"] for x in scores[s]]),
                    "north_star": ao.spread([x["north_star_tok_s_user"] for x in scores[s]]),
                },
            }
            for s in scores
        },
        "problems": problems,
    }


def render(res: dict[str, Any], meta: dict[str, Any]) -> str:
    L = [
        f"# AIPerf vs agent-replay, AgentX on weka traces ({meta['date']})",
        "",
        f"host {meta['host']}, {meta['cpus']} CPUs, load at start {meta['load_start']}; "
        f"code {meta['code']}; AIPerf {meta['aiperf_version']}; traces {', '.join(meta['traces'])}; "
        f"concurrency {meta['concurrency']}, duration {meta['duration']:g} s, repeats "
        f"{meta['repeats']}, seed {meta['seed']}, engine context "
        f"{meta.get('max_model_len', 262_144):,} tokens, start range {meta.get('start_range') or 'each side default'}, "
        f"ours {' '.join(meta.get('ours_args') or [])}"
        + (
            f"; traces drawn by --pick-seed {meta['pick_seed']} from {meta['pick_from']}"
            if meta.get("pick_seed") is not None
            else ""
        )
        + (
            f"; calls without api_time: {meta['calls_without_api_time']}"
            if meta.get("calls_without_api_time")
            else ""
        ),
        "",
        "## Verdict",
        "",
        *[f"- {v}" for v in res.get("verdicts", [])],
        "",
        "## Scores (tok/s/user): AgentX interactivity, 1 / P90 of (E2EL - TTFT) / (OSL - 1); "
        "North Star, 1 / P90 of E2EL / OSL",
        "",
        "| side | repeat | requests | scored | interactivity | AIPerf's own 1/P90(ITL) | North Star |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in ("aiperf", "ours"):
        for x in res["scores"][side]["runs"]:
            L.append(
                f"| {side} | {x['repeat']} | {x['requests']} | {x['n']} | "
                f"{_fmt(x['tok_s_user'])} | {_fmt(x.get('aiperf_own_tok_s_user', math.nan))} | "
                f"{_fmt(x.get('north_star_tok_s_user', math.nan))} |"
            )
        sp = res["scores"][side]["spread"]
        cells = [
            f"{_fmt(v['mean'])} (range {_fmt(v['min'])}-{_fmt(v['max'])}, "
            f"{_fmt(v['rel_range'] * 100)}%)"
            for v in (sp["interactivity"], sp["north_star"])
        ]
        L.append(f"| {side} | mean | | | {cells[0]} | | {cells[1]} |")
    L += [
        "",
        "## Host load per run (cores on average over the run; ours = the side's processes "
        "+ the engine; others = the rest of the host)",
        "",
        "| side | repeat | load before | load after | busy | side | engine | others | steal | "
        "host busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in ("aiperf", "ours"):
        for x in res["scores"][side]["runs"]:
            m = x.get("machine") or {}
            others = (m["busy_cores"] - m["ours_cores"]) if m else math.nan
            L.append(
                f"| {side} | {x['repeat']} | {x['load_before']} | {x['load_after']} | "
                f"{_fmt(m.get('busy_cores', math.nan), 2)} of {m.get('cpus', '?')} | "
                f"{_fmt(m.get('side_cores', math.nan), 2)} | {_fmt(m.get('engine_cores', math.nan), 2)} | "
                f"{_fmt(max(0.0, others), 2)} | {_fmt(m.get('steal', math.nan) * 100, 0)}% | "
                f"{'-' if not m else ('YES' if m.get('host_busy') else 'no')} |"
            )
    c = res["coverage"]
    L += [
        "",
        "## Schedule: gap after the awaited request's end (a child-at-send: its spawning turn's send), median per request, AIPerf - ours",
        "",
        f"requests measured: AIPerf {c['aiperf_keys']}, ours {c['ours_keys']}, both {c['both']}",
        "",
        "| rule (AIPerf/ours) | n | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for k, s in [
        ("all", res["gaps"]["all"]),
        *res["gaps"]["by_kind"].items(),
        *((f"cause: {c}", v) for c, v in res["gaps"]["by_cause"].items()),
    ]:
        L.append(
            f"| {k} | {s['n']} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | {_fmt(s['max_ms'])} |"
        )
    L += [
        "",
        f"(|AIPerf - ours|; cause lag: both waited their full planned gap, signed "
        f"p50 {_fmt(res['gaps']['lag_signed_p50_ms'])} ms; idle-cap: a side's 10 s system idle cap "
        "cut the delay; plan: the plans differ, see below)",
    ]
    if "late_vs_own_plan" in res["gaps"]:
        L += [
            "",
            "Each side against its own plan (sent minus planned gap, requests no idle cap moved):",
            "",
            "| side | n | p50 ms | p99 ms | max ms |",
            "|---|---|---|---|---|",
        ]
        for side, s in res["gaps"]["late_vs_own_plan"].items():
            L.append(
                f"| {side} | {s['n']} | {_fmt(s['p50_ms'])} | {_fmt(s['p99_ms'])} | "
                f"{_fmt(s['max_ms'])} |"
            )
    worst = sorted(res["gaps"]["per_request"], key=lambda g: -abs(g["diff_ms"]))[:15]
    if worst:
        L += [
            "",
            "Largest differences:",
            "",
            "| request | rule | cause | planned AIPerf/ours ms | AIPerf ms | ours ms | diff ms |",
            "|---|---|---|---|---|---|---|",
        ]
        L += [
            f"| {g['key']} | {g['kind']} | {g['cause']} | "
            f"{_fmt(g['plan_aiperf_ms'], 0)}/"
            f"{_fmt(g['plan_ours_ms'], 0)} | {_fmt(g['aiperf_ms'])} | {_fmt(g['ours_ms'])} | "
            f"{_fmt(g['diff_ms'])} |"
            for g in worst
        ]
    L += [
        "",
        "## Warm-up: each warm-up's send and the first measured send, after the first warm-up",
        "",
        "| repeat | warm-ups AIPerf/ours | same requests | |AIPerf - ours| p50 ms | max ms | "
        "first measured send AIPerf/ours s |",
        "|---|---|---|---|---|---|",
    ]
    for w in res.get("warmups", []):
        ms = w["measured_start_ms"]
        L.append(
            f"| {w['repeat']} | {w['aiperf']}/{w['ours']} | {'yes' if w['same_requests'] else 'NO'} | "
            f"{_fmt(w['diff']['p50_ms'])} | {_fmt(w['diff']['max_ms'])} | "
            f"{_fmt((ms['aiperf'] or math.nan) / 1000, 2)}/{_fmt((ms['ours'] or math.nan) / 1000, 2)} |"
        )
    t = res["tokens"]
    L += [
        "",
        "## Tokens (server counts, per request sent by both)",
        "",
        f"requests {t['requests']}; input AIPerf vs ours (% of trace `in`): p50 "
        f"{_fmt(t['input_rel_diff']['p50_ms'], 2)}, max {_fmt(t['input_rel_diff']['max_ms'], 2)}; "
        f"ours vs trace: max {_fmt(t['ours_input_vs_trace']['max_ms'], 2)}%; AIPerf vs trace: "
        f"p50 {_fmt(t['aiperf_input_vs_trace']['p50_ms'], 2)}%, max "
        f"{_fmt(t['aiperf_input_vs_trace']['max_ms'], 2)}%; output tokens differing: "
        f"{t['output_mismatch']}",
    ]
    L += [
        "",
        f"## Plan differences ({len(res['rules']['differ'])} of {res['rules']['requests']} requests)",
        "",
        "| request | rule (AIPerf/ours) | difference |",
        "|---|---|---|",
    ]
    L += [
        f"| {d['key']} | {d['aiperf_kind']}/{d['ours_kind']} | {d['what']} |"
        for d in res["rules"]["differ"]
    ]
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
    ap.add_argument(
        "--start-range",
        default=None,
        metavar="LO,HI",
        help="both sides' start instant t* range (fractions of a trace's span); "
        "default: each side's scenario (AIPerf 0-1, our preset's)",
    )
    ap.add_argument(
        "--ours-arg",
        action="append",
        default=None,
        help="argument for `agent-replay run` (repeat; default --preset=aiperf-agentx-mvp "
        "--min-duration=0 --metric-coverage=0)",
    )
    ap.add_argument(
        "--pick",
        type=int,
        default=None,
        metavar="N",
        help="draw N traces of --pick-from by --pick-seed instead of --traces",
    )
    ap.add_argument(
        "--pick-seed",
        type=int,
        default=None,
        metavar="S",
        help="the seed of --pick (default: one drawn now, printed)",
    )
    ap.add_argument("--pick-from", type=Path, default=SHARED / "weka-corpus")
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=1_048_576,
        help="the simulated engine's context (default 1,048,576)",
    )
    ap.add_argument("--analyse-only", action="store_true", help="re-read DIR's runs, do not run")
    args = ap.parse_args()
    # AIPerf runs short under --unsafe-override: ours likewise, without the 900 s floor
    ours_args = (
        args.ours_arg
        if args.ours_arg is not None
        else ["--preset=aiperf-agentx-mvp", "--min-duration=0", "--metric-coverage=0"]
    )
    start_range = None
    if args.start_range:
        lo, hi = (float(x) for x in args.start_range.split(","))
        start_range = (lo, hi)
    binary = aiperf_bin()
    if binary is None and not args.analyse_only:
        print(
            f"bench_agentx_aiperf: no AIPerf at {AIPERF_VENV} or no tokenizer at {SIM_TOKENIZER}; "
            "run scripts/setup-aiperf.sh",
            file=sys.stderr,
        )
        return 2
    out: Path = args.out
    pick_seed = None
    if args.pick:
        import secrets

        pick_seed = args.pick_seed if args.pick_seed is not None else secrets.randbelow(2**31)
        files = pick_traces(args.pick_from, args.pick, pick_seed)
        print(
            f"bench_agentx_aiperf: --pick-seed {pick_seed}: {', '.join(f.stem for f in files)}",
            flush=True,
        )
    else:
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
        subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_replay",
                "traces",
                "import",
                str(tdir),
                "-o",
                str(out / "trace.parquet"),
                "--force",
            ],
            check=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
        )
        from agent_replay.engines.sim.process import SimProcess
        from agent_replay.replay.provenance import code_version

        version = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True
        ).stdout.strip()
        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_start": load_now(),
            "code": code_version(),
            "aiperf_version": version.splitlines()[-1] if version else "?",
            "traces": [f.stem for f in files],
            "concurrency": args.concurrency,
            "duration": args.duration,
            "repeats": args.repeats,
            "seed": args.seed,
            "max_model_len": args.max_model_len,
            "ours_args": ours_args,
            "start_range": args.start_range,
            "pick_seed": pick_seed,
            "pick_from": str(args.pick_from) if args.pick else None,
            "calls_without_api_time": ", ".join(
                f"{f.stem} {m} of {t}" for f in files for m, t in [calls_without_api_time(f)]
            ),
        }
        runs = []
        with SimProcess(sim_profile(out / "sim-profile.json", args.max_model_len)) as sim:
            for r in range(args.repeats):
                order = ("aiperf", "ours") if r % 2 == 0 else ("ours", "aiperf")
                for side in order:
                    reset_cache(sim.url)
                    d = out / f"{side}-{r}"
                    shutil.rmtree(d, ignore_errors=True)
                    if side == "aiperf":
                        assert binary is not None
                        info = run_aiperf(
                            binary,
                            sim.url,
                            tdir,
                            d,
                            out / "aiperf-cache",
                            concurrency=args.concurrency,
                            duration=args.duration,
                            seed=args.seed,
                            start_range=start_range,
                            engine_pid=sim.proc.pid,
                        )
                    else:
                        info = run_ours(
                            out / "trace.parquet",
                            sim.url,
                            d,
                            concurrency=args.concurrency,
                            duration=args.duration,
                            seed=args.seed,
                            start_range=start_range,
                            extra=ours_args,
                            engine_pid=sim.proc.pid,
                        )
                    info.update(side=side, repeat=r, dir=str(d))
                    runs.append(info)
                    m = info["machine"]
                    print(
                        f"{side} repeat {r}: exit {info['rc']} in {info['wall_s']:.0f} s, load "
                        f"{info['load_before']} -> {info['load_after']}; cores busy "
                        f"{m['busy_cores']:.2f} of {m['cpus']} (this side {m['side_cores']:.2f}, "
                        f"engine {m['engine_cores']:.2f}){' HOST BUSY' if m['host_busy'] else ''}",
                        flush=True,
                    )
        (out / "runs.json").write_text(json.dumps(runs, indent=1))
    res = analyse(out, runs, sorted((out / "traces").glob("*.json")))
    res["verdicts"] = verdicts(res, runs)
    res["meta"] = meta
    (out / "report.json").write_text(json.dumps(res, indent=1, default=str))
    text = render(res, meta)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
