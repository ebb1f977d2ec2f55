"""``agent-replay engines sim``: run the simulated vLLM-dialect engine."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add ``sim`` to the ``engines`` group."""
    from agent_replay.engines.sim.cli import add_arguments

    p = sub.add_parser(
        "sim",
        help="run the simulated engine (vLLM's OpenAI-compatible dialect, modelled timing)",
        description="Run the simulated engine: a real HTTP server speaking vLLM's dialect whose "
        "timing follows a documented performance model (docs/sim-engine.md). It is a model, "
        "never a measurement of real hardware. Stop it with Ctrl-C or SIGTERM.",
    )
    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from agent_replay.engines.sim.cli import run

    return run(args)


def register_fit(sub: Any) -> None:
    """Add ``sim-fit`` to the ``engines`` group."""
    p = sub.add_parser(
        "sim-fit",
        help="fit the simulated engine's performance model to real runs",
        description="Fit the simulated engine's step-time model (docs/sim-engine.md) to real "
        "runs of one deployment: decode step time against batch and context, prefill cost, "
        "speculative acceptance. The profile records each term with its 95%% interval "
        "(bootstrap over runs) and what it was fitted on.",
    )
    p.add_argument("results", nargs="+", help="results folders of real runs (one deployment)")
    p.add_argument("-o", "--output", required=True, help="the profile JSON to write")
    p.add_argument(
        "--command",
        help="the deployment's launch record (*.command.json): its "
        "vLLM flags (speculative tokens, max-num-seqs, max-num-batched-tokens)",
    )
    p.add_argument("--name", default="fitted", help="the profile's name")
    p.add_argument(
        "--prefill-ctx-full-chunk",
        type=int,
        default=0,
        metavar="TOKENS",
        help="a prefill chunk of fewer new tokens counts that fraction of its context "
        "(the attention backend's decode-path threshold: 512 for vLLM's FLASH_ATTN_MLA; "
        "default 0: every chunk counts its whole context)",
    )
    p.add_argument(
        "--frontend-batch-overlap",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="how much of a front-end batch runs in parallel: a batch costs its largest "
        "request's cost plus (1 - SHARE) x the others' (0 to 1; default 0)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing profile")
    p.set_defaults(func=_fit)


def _fit(args: argparse.Namespace) -> int:
    from agent_replay.engines.sim.fit import describe, fit_runs, read_command, write_profile
    from agent_replay.errors import InputError

    command = read_command(args.command) if args.command else None
    if args.prefill_ctx_full_chunk < 0:
        raise InputError("--prefill-ctx-full-chunk must be >= 0")
    if not 0.0 <= args.frontend_batch_overlap <= 1.0:
        raise InputError("--frontend-batch-overlap must be within [0, 1]")
    fit = fit_runs(
        args.results,
        name=args.name,
        command=command,
        prefill_ctx_full_chunk=args.prefill_ctx_full_chunk,
        frontend_batch_overlap=args.frontend_batch_overlap,
    )
    write_profile(fit, args.output, force=args.force)
    print(describe(fit))
    print(f"wrote {args.output}")
    return 0
