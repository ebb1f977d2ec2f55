"""Importers of public traces and agent logs, one module per format, and auto-detection.

Each module exposes ``NAME``, ``sniff(path, head) -> bool`` and
``load(paths, options) -> ImportResult``. ``import_paths`` picks the format (or takes the
one given), loads, validates and returns the table with its metadata and notes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pyarrow as pa

from agent_replay.errors import InputError, TraceError
from agent_replay.traces.importers import (
    azure,
    burstgpt,
    claude_code,
    codex,
    lmcache,
    mooncake,
    otel,
    qwen,
    tracelab,
    weka,
)
from agent_replay.traces.importers._common import ImportOptions, ImportResult, head_bytes
from agent_replay.traces.validate import validate_or_raise

# Order matters: the first module whose sniff() accepts a file wins.
_MODULES: tuple[ModuleType, ...] = (
    otel,
    weka,
    qwen,
    tracelab,
    lmcache,
    mooncake,
    codex,
    claude_code,
    azure,
    burstgpt,
)
FORMATS: dict[str, ModuleType] = {m.NAME: m for m in _MODULES}
SUFFIXES = (".jsonl", ".json", ".csv")

__all__ = ["FORMATS", "ImportOptions", "ImportResult", "detect", "expand", "import_paths"]


def expand(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files named, and the trace-like files (``.jsonl``/``.json``/``.csv``) under folders."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and f.suffix in SUFFIXES and not f.name.startswith(".")
            )
            if not found:
                raise InputError(f"{p}: folder holds no .jsonl, .json or .csv files")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or folder")
    return out


def detect(path: Path) -> str:
    """The format name of ``path``, from its first bytes."""
    head = head_bytes(path)
    if not head.strip():
        raise TraceError("empty file: nothing to import", path=str(path))
    for m in _MODULES:
        if m.sniff(path, head):
            return str(m.NAME)
    raise TraceError(
        "unrecognized format (not one of " + ", ".join(FORMATS) + "); name it with --format",
        path=str(path),
    )


def _validate(result: ImportResult, first: Path) -> None:
    """The imported table checked; hash ids of the wrong count say to give --block-size."""
    try:
        validate_or_raise(result.table, result.meta, f"import of {first}")
    except TraceError as exc:
        if "'hash_ids'" not in str(exc) or "ceil(input_tokens" not in str(exc):
            raise
        raise TraceError(
            f"{exc}: the hash ids were made over other blocks than "
            f"{result.meta.block_size} tokens; give the file's block size "
            "with --block-size N"
        ) from None


def _detect_format(
    paths: Sequence[str | os.PathLike[str]], files: list[Path]
) -> tuple[list[Path], str, list[str]]:
    """(the files in a known format, that format, the names of the others): a file named
    on the command line must be in a known format, a side file in a folder (e.g.
    tool_calls.json) is skipped; the files must share one format."""
    explicit = {Path(p) for p in paths if Path(p).is_file()}
    kinds: dict[Path, str] = {}
    skipped: list[str] = []
    for f in files:
        try:
            kinds[f] = detect(f)
        except TraceError:
            if f in explicit:
                raise
            skipped.append(f.name)
    if not kinds:
        raise InputError(f"{paths[0]}: no file in a known format ({', '.join(FORMATS)})")
    names = set(kinds.values())
    if len(names) > 1:
        listing = ", ".join(f"{f.name}: {k}" for f, k in kinds.items())
        raise InputError(f"inputs mix formats ({listing}); import them separately")
    return list(kinds), names.pop(), skipped


def import_paths(
    paths: Sequence[str | os.PathLike[str]],
    fmt: str | None = None,
    options: ImportOptions | None = None,
) -> ImportResult:
    """Import one or more files of one format into a validated trace table."""
    files = expand(paths)
    opts = options or ImportOptions()
    skipped: list[str] = []
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt is None:
        files, fmt, skipped = _detect_format(paths, files)
    try:
        result: ImportResult = FORMATS[fmt].load(files, opts)
    except (pa.ArrowInvalid, OverflowError) as exc:  # a number the schema cannot hold
        raise TraceError(
            f"a value does not fit the trace schema ({exc}); numbers this large "
            "are not real requests (a unit mix-up?)",
            path=str(files[0]),
        ) from None
    _validate(result, files[0])
    if skipped:
        result.notes.append(f"skipped {len(skipped)} unrecognized files: {', '.join(skipped[:5])}")
    return result
