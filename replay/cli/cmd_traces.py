"""``agent-replay traces ...``: import, synth, inspect, validate, head, convert."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError, OutputExistsError


def register(sub: Any) -> None:
    """Add this area's parsers to ``sub``."""
    p = sub.add_parser("traces", help="inspect, validate, import, convert and synthesize traces")
    tsub = p.add_subparsers(dest="traces_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    from agent_replay.traces.importers import FORMATS

    imp = tsub.add_parser("import", help="import public traces or agent logs into a Parquet trace")
    imp.add_argument("paths", nargs="+", metavar="PATH", help="files or folders of one format")
    imp.add_argument("-o", "--output", required=True, help="trace file to write (.parquet)")
    imp.add_argument("--format", choices=sorted(FORMATS), help="input format (default: detect)")
    imp.add_argument("--block-size", type=int, help="override the format's block size")
    imp.add_argument("--tokenizer", help="tokenizer.json for content-bearing formats (lmcache)")
    imp.add_argument(
        "--no-sessions",
        action="store_true",
        help="mooncake: do not infer sessions from hash-prefix chains",
    )
    imp.add_argument("--force", action="store_true", help="overwrite OUTPUT")
    imp.set_defaults(func=_import)

    syn = tsub.add_parser("synth", help="synthesize agent-like sessions")
    syn.add_argument("-o", "--output", required=True)
    syn.add_argument("--sessions", type=int, default=8)
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--rate", type=float, help="new sessions per second (default 1, or fitted)")
    syn.add_argument(
        "--duration", type=float, help="drop requests arriving after this many seconds"
    )
    syn.add_argument("--block-size", type=int, default=64)
    syn.add_argument("--system-prompt-tokens", type=int, default=0)
    syn.add_argument("--fit", metavar="TRACE", help="fit distributions to this trace")
    syn.add_argument("--model", help="model name to record in the trace")
    syn.add_argument("--force", action="store_true")
    syn.set_defaults(func=_synth)

    ins = tsub.add_parser("inspect", help="summary of a trace")
    ins.add_argument("trace")
    ins.set_defaults(func=_inspect)

    val = tsub.add_parser("validate", help="check a trace against the schema and its invariants")
    val.add_argument("trace")
    val.set_defaults(func=_validate)

    hd = tsub.add_parser("head", help="first rows of a trace")
    hd.add_argument("trace")
    hd.add_argument("-n", type=int, default=10)
    hd.set_defaults(func=_head)

    cv = tsub.add_parser("convert", help="convert between a Parquet trace and Mooncake-style JSONL")
    cv.add_argument("input")
    cv.add_argument(
        "-o",
        "--output",
        required=True,
        help=".jsonl writes Mooncake JSONL; .parquet reads Mooncake JSONL",
    )
    cv.add_argument(
        "--to",
        choices=("mooncake", "weka"),
        default="mooncake",
        help="format of a .jsonl/.json output (weka: AgentX traces, agent trees kept)",
    )
    cv.add_argument("--force", action="store_true")
    cv.set_defaults(func=_convert)


def _console() -> Any:
    from rich.console import Console

    return Console()


def _check_out(path: str, force: bool) -> None:
    if Path(path).exists() and not force:
        raise OutputExistsError(path)


def _prompt_hasher(block_size: int) -> Any:
    """The recorder's content hasher (a fresh secret seed) for imports of captured prompts."""
    import secrets

    from agent_replay.replay.record.content import PromptHasher

    return PromptHasher(block_size, secrets.randbits(63))


def _import(a: argparse.Namespace) -> int:
    from agent_replay.traces.importers import ImportOptions, import_paths
    from agent_replay.traces.io import write_trace

    _check_out(a.output, a.force)
    res = import_paths(
        a.paths,
        a.format,
        ImportOptions(
            block_size=a.block_size,
            tokenizer=a.tokenizer,
            infer_sessions=not a.no_sessions,
            prompt_hasher=_prompt_hasher,
        ),
    )
    from agent_replay.traces.stats import session_codes

    _, n_sess = session_codes(res.table)
    write_trace(res.table, a.output, res.meta, force=a.force)
    print(
        f"format {res.format}: {res.table.num_rows:,} requests in {n_sess:,} sessions, "
        f"block size {res.meta.block_size} -> {a.output}"
    )
    for note in res.notes:
        print(f"  {note}")
    return 0


def _synth(a: argparse.Namespace) -> int:
    from agent_replay.traces.io import read_trace, write_trace
    from agent_replay.traces.synth import SynthConfig, SynthModel, fit, synthesize

    if a.sessions < 1 or a.block_size < 1:
        raise InputError("--sessions and --block-size must be >= 1")
    if a.rate is not None and a.rate <= 0:
        raise InputError("--rate must be > 0")
    _check_out(a.output, a.force)
    model = fit(read_trace(a.fit)[0]) if a.fit else SynthModel()
    model.system_prompt_tokens = a.system_prompt_tokens
    table, meta = synthesize(
        model,
        SynthConfig(
            sessions=a.sessions,
            seed=a.seed,
            block_size=a.block_size,
            rate=a.rate,
            duration_s=a.duration,
            model_name=a.model,
        ),
    )
    write_trace(table, a.output, meta, force=a.force)
    print(
        f"synthetic: {table.num_rows:,} requests in {a.sessions:,} sessions (seed {a.seed}) -> {a.output}"
    )
    return 0


def _inspect(a: argparse.Namespace) -> int:
    import pyarrow as pa

    from agent_replay.safetext import text
    from agent_replay.traces.inspect import render_summary
    from agent_replay.traces.io import read_meta
    from agent_replay.traces.summary import summarize_trace

    # One row group is read at a time; the default allocator (mimalloc) keeps the pages of
    # the ones before, the system's gives them back: 10% less peak memory on 1M rows.
    pa.set_memory_pool(pa.system_memory_pool())
    meta = read_meta(a.trace)
    s = summarize_trace(a.trace, meta.block_size)
    console = _console()
    console.print(render_summary(s, meta, a.trace))
    console.print(text(failed_sentence(s.failed, s.requests, s.failure_causes)))
    return 0


def failed_line(table: Any) -> str:
    """One line on the recorded failures: how many, their causes, and what replay does."""
    from agent_replay.traces.failed import failed_mask, failure_causes

    return failed_sentence(int(failed_mask(table).sum()), table.num_rows, failure_causes(table))


def failed_sentence(n: int, total: int, causes: list[tuple[str, int]]) -> str:
    if n == 0:
        return "failed requests: none"
    text = ", ".join(f"{c} ({k:,})" for c, k in causes)
    return (
        f"failed requests: {n:,} of {total:,} ({n / total:.1%}): {text}; "
        "left out of replay unless --include-failed"
    )


def _validate(a: argparse.Namespace) -> int:
    from agent_replay.safetext import visible
    from agent_replay.traces.io import read_trace
    from agent_replay.traces.validate import validate

    table, meta = read_trace(a.trace)
    problems = validate(table, meta, a.trace)
    for p in problems:
        print(visible(p), file=sys.stderr)
    if problems:
        return 2
    print(f"{visible(a.trace)}: valid ({table.num_rows:,} requests, schema v{meta.schema_version})")
    return 0


def _head(a: argparse.Namespace) -> int:
    from agent_replay.traces.inspect import render_head
    from agent_replay.traces.io import iter_batches, read_meta

    read_meta(a.trace)
    batch = next(iter_batches(a.trace, batch_size=max(1, a.n)), None)
    import pyarrow as pa

    table = pa.Table.from_batches([batch]) if batch is not None else pa.table({})
    console = _console()
    console.print(render_head(table, a.n, width=console.width))
    return 0


def _convert(a: argparse.Namespace) -> int:
    out = Path(a.output)
    _check_out(a.output, a.force)
    if getattr(a, "to", "mooncake") == "weka" and out.suffix in (".jsonl", ".json"):
        from agent_replay.traces.convert import write_weka
        from agent_replay.traces.io import read_trace

        table, meta = read_trace(a.input)
        write_weka(table, meta, out, force=a.force)
        print(
            f"{table.num_rows:,} requests -> {out} (weka traces, WEKA convention, "
            f"{meta.block_size}-token blocks)"
        )
        return 0
    if out.suffix == ".jsonl":
        from agent_replay.traces.convert import write_mooncake
        from agent_replay.traces.io import read_trace

        table, meta = read_trace(a.input)
        write_mooncake(table, meta, out, force=a.force)
        print(
            f"{table.num_rows:,} requests -> {out} (Mooncake JSONL, hash ids over "
            f"{meta.block_size}-token blocks)"
        )
        return 0
    if out.suffix == ".parquet":
        from agent_replay.traces.importers import ImportOptions, import_paths
        from agent_replay.traces.io import write_trace

        res = import_paths([a.input], "mooncake", ImportOptions())
        write_trace(res.table, out, res.meta, force=a.force)
        print(f"{res.table.num_rows:,} requests -> {out}")
        return 0
    raise InputError(f"{out}: output must end in .jsonl (to Mooncake) or .parquet (from Mooncake)")
