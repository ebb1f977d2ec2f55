"""``agent-replay report`` and ``agent-replay compare``: parse, call analysis, render."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent_replay.errors import InputError


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return v


def _margin(text: str) -> float:
    """A relative margin: ``2%`` or ``0.02``, below 100%."""
    t = text.strip()
    try:
        share = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (2% or 0.02)") from None
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a margin is from 0% up to below 100%")
    return share


def _price(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a price (USD per million tokens)"
        ) from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def register(sub: Any) -> None:
    """Add this area's parsers to ``sub``."""
    p = sub.add_parser(
        "report",
        help="report the metrics of a results folder",
        description="Per-user P90 tokens/s, TTFT, ITL, tail latency, goodput, "
        "throughput, revenue per GPU-hour and replay fidelity of one run.",
    )
    p.add_argument(
        "results",
        nargs="+",
        help="results folder written by 'agent-replay run' "
        "(several: a table report of each in turn, e.g. demo-results/*)",
    )
    p.add_argument("--format", choices=("table", "md", "json", "csv"), default="table")
    p.add_argument(
        "--slo",
        help="per-request objectives for goodput, e.g. ttft=2s,tpot=50ms,e2e=60s "
        "(bare numbers are ms); any per-request metric of the report's latency "
        "table (ttst, e2e_per_token, agentx_itl, ...)",
    )
    p.add_argument("--gpus", type=_positive_int, help="GPUs serving the run (tokens/s per GPU)")
    p.add_argument("--price-input-miss", type=_price, help="USD per million computed input tokens")
    p.add_argument("--price-input-hit", type=_price, help="USD per million cached input tokens")
    p.add_argument("--price-output", type=_price, help="USD per million output tokens")
    p.add_argument("--plots", metavar="DIR", help="also write PNG plots into DIR (for papers)")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained "
        "HTML file with interactive charts (needs the html extra)",
    )
    p.add_argument("--force", action="store_true", help="overwrite existing plot files")
    p.set_defaults(func=run_report)

    c = sub.add_parser(
        "compare",
        help="compare two or more results folders",
        description="Side-by-side metrics of runs, deltas against the first, "
        "bootstrap 95% confidence intervals and a plain verdict.",
    )
    c.add_argument(
        "results",
        nargs="+",
        help="results folders; the first is the baseline. "
        "Replicate runs of one arm joined by commas (A1,A2,A3 B1,B2,B3) give "
        "run-level intervals",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="compare runs of different traces, "
        "models or timing options anyway (they are refused otherwise)",
    )
    c.add_argument("--format", choices=("table", "md", "json"), default="table")
    c.add_argument(
        "--resamples", type=_positive_int, default=1000, help="bootstrap resamples (default 1000)"
    )
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    c.add_argument(
        "--margin",
        type=_margin,
        default=0.0,
        metavar="PCT",
        help="the smallest change that matters (2%% or 0.02): a change whose interval "
        "lies wholly inside +-PCT reads as equivalent, not as a finding (default: none)",
    )
    c.add_argument(
        "--html",
        metavar="FILE",
        help="also write the comparison as one "
        "self-contained HTML file with the runs' latency CDFs (needs the html extra)",
    )
    c.set_defaults(func=run_compare)


def run_report(args: argparse.Namespace) -> int:
    from agent_replay.analysis.render import FORMATS, render_table
    from agent_replay.analysis.report import build_report, parse_slo
    from agent_replay.analysis.runstats import Prices

    given = [args.price_input_miss, args.price_input_hit, args.price_output]
    prices = None
    if any(v is not None for v in given):
        if any(v is None for v in given):
            raise InputError(
                "revenue needs all three prices: --price-input-miss, "
                "--price-input-hit and --price-output"
            )
        prices = Prices(
            input_miss=args.price_input_miss,
            input_hit=args.price_input_hit,
            output=args.price_output,
        )
    if len(args.results) > 1:
        if args.plots or args.html or args.format not in ("table", "md"):
            raise InputError(
                f"{len(args.results)} results folders given: --plots, --html and "
                "--format json/csv take one (report them one at a time)"
            )
        for results in args.results:
            one = argparse.Namespace(**{**vars(args), "results": [results]})
            run_report(one)
            print()
        return 0
    report = build_report(args.results[0], slo=parse_slo(args.slo), gpus=args.gpus, prices=prices)
    if args.plots:
        from agent_replay.analysis.plots import write_plots

        written = write_plots(report, args.plots, force=args.force)
        print(f"wrote {len(written)} plots to {args.plots}", file=sys.stderr)
    if args.html:
        from agent_replay.analysis.html import report_html, write_html

        write_html(report_html(report), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.format == "table":
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 110).print(render_table(report))
    else:
        sys.stdout.write(FORMATS[args.format](report))
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from agent_replay.analysis.compare import compare_dirs, render_compare, to_json, to_markdown

    if len(args.results) < 2:
        raise InputError("compare needs at least two results folders")
    if args.html:
        from agent_replay.analysis.html import HTML_EXTRA_HINT, available

        if not available():  # before the work, not after it
            raise InputError(f"--html needs Bokeh: {HTML_EXTRA_HINT}")
    arms = [[p for p in r.split(",") if p] for r in args.results]
    names = [a[0] if len(a) == 1 else f"{a[0]}+{len(a) - 1}" for a in arms]
    if any("," in r for r in args.results):
        from agent_replay.analysis.compare import compare_arms

        result = compare_arms(arms, names, force=args.force, margin=args.margin)
    else:
        result = compare_dirs(
            args.results,
            resamples=args.resamples,
            seed=args.seed,
            force=args.force,
            margin=args.margin,
        )
    if args.html:
        from agent_replay.analysis.html import compare_html, write_html
        from agent_replay.analysis.report import build_report

        runs = [
            (result.names[i] + (f" [{j}]" if len(arm) > 1 else ""), build_report(d))
            for i, arm in enumerate(arms)
            for j, d in enumerate(arm)
        ]
        write_html(compare_html(result, runs), args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.format == "json":
        sys.stdout.write(to_json(result))
    elif args.format == "md":
        sys.stdout.write(to_markdown(result))
    else:
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 110).print(render_compare(result))
    return 0
