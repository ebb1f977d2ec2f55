"""``agent-replay sweep`` (run, resume, or search capacity) and ``agent-replay frontier``
(rebuild the frontier of one or several sweep trees without rerunning)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="run an experiment: targets x load points x repeats, "
        "interleaved, with warm-up; writes one tree, its index and frontier",
        description="Run (or resume) the sweep EXPERIMENT.toml describes, then "
        "write its frontier (frontier.md, PNGs with the plots extra).",
    )
    p.add_argument("experiment", help="experiment file (TOML)")
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="sweep folder (default: the file's 'output', else sweeps/<file name>)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace the sweep folder instead of resuming it"
    )
    p.add_argument(
        "--find-capacity",
        action="store_true",
        help="bisect the load axis for the most load that meets --slo",
    )
    p.add_argument(
        "--slo",
        default=None,
        metavar="TERMS",
        help="e.g. 'p90_tps>=20,ttft_p99<=2s' (default: the file's slo)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the frontier from the sweep folder, run nothing",
    )
    p.add_argument(
        "--reindex",
        action="store_true",
        help="with --report-only: first recompute every run's figures from its "
        "results folder (new metric definitions, prices or GPU costs)",
    )
    p.set_defaults(func=cmd_sweep)

    f = sub.add_parser("frontier", help="the frontier of one or several sweep folders (overlaid)")
    f.add_argument("sweeps", nargs="+", help="sweep folders")
    f.add_argument("--output", "-o", default=None, help="where to write (default: the first sweep)")
    f.add_argument(
        "--reference",
        default=None,
        metavar="FILE",
        help="published points to list and draw beside the frontier (JSON; e.g. "
        "benchmarks/references/agentx.json), with the hardware difference stated",
    )
    f.set_defaults(func=cmd_frontier)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _term_as_interrupt() -> None:
    """SIGTERM ends a sweep like Ctrl-C: the run in progress is marked interrupted in the
    index and every server the sweep started is stopped (none is left behind)."""
    import signal

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def cmd_sweep(args: argparse.Namespace) -> int:
    from agent_replay.analysis.frontier import build
    from agent_replay.replay.sweep import load_experiment, run_sweep

    exp = load_experiment(args.experiment, output=args.output)
    _term_as_interrupt()
    if args.report_only:
        if args.reindex:
            from agent_replay.replay.sweep.runner import reindex

            reindex(exp)
        res = build([exp.output])
        _html([exp.output], res, exp.output)
        print(res["markdown"])
        print("wrote " + ", ".join(str(f) for f in res["files"]))
        return 0
    if args.find_capacity:
        return _find_capacity(args, exp)
    result = run_sweep(exp, force=args.force, progress=_err, hooks=_hooks())
    t = result.timing
    _err(
        f"sweep wall {t.get('wall_s', 0):.1f} s: runs {t.get('run_s', 0):.1f} s, warm-up "
        f"{t.get('warmup_s', 0):.1f} s, server start {t.get('server_start_s', 0):.1f} s, "
        f"other {t.get('outside_runs_s', 0) - t.get('server_start_s', 0):.1f} s"
    )
    res = build([result.out])
    _html([result.out], res, result.out)
    print(res["markdown"])
    print("wrote " + ", ".join(str(f) for f in res["files"]))
    if result.failed:
        _err(
            f"agent-replay: error: {result.failed} of {len(result.rows)} runs failed (reasons "
            f"in {result.out}/index.csv); the same command runs them again"
        )
    return result.exit_code


def _find_capacity(args: argparse.Namespace, exp: Any) -> int:
    from agent_replay.analysis.frontier import build
    from agent_replay.errors import InputError
    from agent_replay.replay.sweep import run_capacity

    slo = args.slo or exp.slo
    if not slo:
        raise InputError(f"{args.experiment}: --find-capacity needs --slo or an 'slo' key")
    caps = run_capacity(exp, slo, force=args.force, progress=_err, hooks=_hooks())
    for c in caps:
        print(c.line(exp.axis))
    res = build([exp.output])  # the probes' frontier, and the page with the capacity table
    _html([exp.output], res, exp.output)
    print("wrote " + ", ".join(str(f) for f in [f"{exp.output}/capacity.md", *res["files"]]))
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    from agent_replay.analysis.frontier import build

    res = build(args.sweeps, args.output, reference=args.reference)
    _html(args.sweeps, res, args.output or args.sweeps[0])
    print(res["markdown"])
    print("wrote " + ", ".join(str(f) for f in res["files"]))
    return 0


def _hooks() -> list[Any]:
    """Each run of a sweep writes its report.html (with the html extra)."""
    from agent_replay.analysis.html import RunReportHook, available

    return [RunReportHook()] if available() else []


def _html(sweeps: Any, res: dict[str, Any], out: Any) -> None:
    """The sweep's report.html beside frontier.md, listed with the files written; without
    the html extra, one line saying how to get it."""
    from pathlib import Path

    from agent_replay.analysis.html import (
        FILE_NAME,
        HTML_EXTRA_HINT,
        available,
        sweep_html,
        write_html,
    )

    if not available():
        _err(f"HTML report: {HTML_EXTRA_HINT}")
        return
    res["files"].append(write_html(sweep_html(sweeps, res), Path(out) / FILE_NAME))
