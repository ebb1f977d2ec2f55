"""Shared pieces of the importers: options, results, line readers that name file and line."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from agent_replay.errors import TraceError
from agent_replay.traces.schema import TraceMeta


@dataclass(frozen=True)
class ImportOptions:
    block_size: int | None = None
    """Override the format's block size (for formats whose hashes we compute)."""
    tokenizer: str | None = None
    """Path of a Hugging Face ``tokenizer.json`` for content-bearing formats."""
    infer_sessions: bool = True
    """Mooncake: infer sessions from hash-prefix chains (else one session per request)."""
    prompt_hasher: Callable[[int], Any] | None = None
    """For formats that may carry captured prompts (OpenTelemetry): block size -> a hasher
    with ``hash_ids(api, body, input_tokens)`` (the recorder's ``PromptHasher``). None:
    hash ids from token and cache counts alone."""


@dataclass
class ImportResult:
    table: pa.Table
    meta: TraceMeta
    format: str
    notes: list[str] = field(default_factory=list)


def fail(path: Path | str, line: int | None, message: str) -> TraceError:
    where = f"line {line}: " if line is not None else ""
    return TraceError(f"{where}{message}", path=str(path))


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed object) for every non-blank line."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise fail(path, None, f"cannot open ({exc.strerror})") from exc
    with fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                hint = " (truncated?)" if not raw.endswith(b"\n") else ""
                raise fail(path, n, f"not valid JSON{hint}: {exc}") from exc
            if not isinstance(obj, dict):
                raise fail(path, n, f"expected a JSON object, got {type(obj).__name__}")
            yield n, obj


def read_csv(path: Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header and an iterator of (line number, cells)."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise fail(path, None, f"cannot open ({exc.strerror})") from exc
    reader = csv.reader(fh)
    try:
        header = next(reader)
    except StopIteration as exc:
        fh.close()
        raise fail(path, 1, "empty file: no CSV header") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        fh.close()
        raise fail(path, 1, f"not a CSV file ({exc})") from exc

    def rows() -> Iterator[tuple[int, list[str]]]:
        with fh:
            try:
                for cells in reader:
                    if cells:
                        yield reader.line_num, cells
            except (csv.Error, UnicodeDecodeError) as exc:
                raise fail(path, reader.line_num, f"garbled CSV ({exc})") from exc

    return [h.strip() for h in header], rows()


def get_int(obj: dict[str, Any], key: str, path: Path, line: int, *, minimum: int = 0) -> int:
    v = obj.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and v != int(v))
    ):
        raise fail(path, line, f"field {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise fail(path, line, f"field {key!r} must be >= {minimum}, got {v!r}")
    return int(v)


def get_hash_ids(obj: dict[str, Any], path: Path, line: int) -> list[int] | None:
    """The row's ``hash_ids`` list (None when absent); anything but a list of integers
    is refused."""
    h = obj.get("hash_ids")
    if h is not None and (not isinstance(h, list) or not all(isinstance(x, int) for x in h)):
        raise fail(path, line, "field 'hash_ids' must be a list of integers")
    return h


def get_num(obj: dict[str, Any], key: str, path: Path, line: int) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise fail(path, line, f"field {key!r} must be a number, got {v!r}")
    return float(v)


def parse_iso_ns(text: Any, path: Path | str, line: int | None, key: str = "timestamp") -> int:
    """ISO-8601 (``Z`` or offset; naive means UTC) to integer ns since the epoch, keeping
    every digit of the fraction (Python's datetime stops at microseconds)."""
    if not isinstance(text, str):
        raise fail(path, line, f"field {key!r} must be an ISO timestamp, got {text!r}")
    s = text.strip().replace("Z", "+00:00")
    frac_ns = 0
    main = s
    dot = s.find(".")
    if dot >= 0:
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        digits = s[dot + 1 : end]
        frac_ns = int((digits + "000000000")[:9]) if digits else 0
        main = s[:dot] + s[end:]
    try:
        d = dt.datetime.fromisoformat(main.replace(" ", "T"))
    except ValueError as exc:
        raise fail(path, line, f"field {key!r}: not an ISO timestamp: {text!r}") from exc
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    delta = d - epoch
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + frac_ns


def head_bytes(path: Path, n: int = 65536) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


SCAN_LIMIT = 16 << 20
"""How far into a file a sniffer may look for a field the first 64 KiB did not reach."""


def file_contains(
    path: Path, needle: bytes, *, start: int = 0, limit: int = SCAN_LIMIT, chunk: int = 1 << 20
) -> bool:
    """Whether ``needle`` occurs in ``path`` between ``start`` and ``start + limit``, read a
    chunk at a time (memory stays at one chunk, whatever the file's size)."""
    keep = len(needle) - 1
    tail = b""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            left = limit
            while left > 0:
                buf = fh.read(min(chunk, left))
                if not buf:
                    return False
                if needle in tail + buf:
                    return True
                tail = buf[-keep:] if keep else b""
                left -= len(buf)
    except OSError:
        return False
    return False


def first_json_object(head: bytes) -> dict[str, Any] | None:
    """The first line of ``head`` parsed as a JSON object, or None."""
    line = head.split(b"\n", 1)[0]
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


RECORD_SEPARATOR = b"===== record "


def read_records(path: Path) -> Iterator[tuple[int, Any]]:
    """JSON objects of an agent log: JSONL, or the pretty-printed excerpt layout (``#``
    comment lines, then ``===== record NNNN =====`` before each object). Yields (line of the
    object's start, object)."""
    head = head_bytes(path, 4096)
    if RECORD_SEPARATOR not in head:
        yield from read_jsonl(path)
        return
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise fail(path, None, f"cannot open ({exc.strerror})") from exc
    lines = text.split(b"\n")
    start: int | None = None
    buf: list[bytes] = []

    def flush() -> Iterator[tuple[int, Any]]:
        body = b"\n".join(buf).strip()
        if start is not None and body:
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise fail(path, start, f"record is not valid JSON: {exc}") from exc
            if not isinstance(obj, dict):
                raise fail(path, start, "record is not a JSON object")
            yield start, obj

    for n, raw in enumerate(lines, 1):
        if raw.startswith(RECORD_SEPARATOR):
            yield from flush()
            start, buf = n + 1, []
        elif start is not None:
            buf.append(raw)
    yield from flush()


SYNTH_HASH_NOTE = "hash ids synthesized: append-only context, cached prefix on compaction"


def agent_log_result(
    reqs: list[Any], paths: list[Path], block_size: int, name: str, notes: list[str]
) -> ImportResult:
    """The result of an agent-log importer (Claude Code, Codex, TraceLab): the table built
    from its requests, with metadata naming the files it came from."""
    from agent_replay.traces.builder import build_table

    table, start = build_table(reqs)
    meta = TraceMeta(
        block_size=block_size,
        source=f"imported:{name}",
        start_wall_ns=start,
        extra={"imported_from": [p.name for p in paths]},
    )
    return ImportResult(table, meta, name, [*notes, SYNTH_HASH_NOTE])


def load_each(
    paths: list[Path], block_size: int, load_file: Callable[[Path, int], list[Any]]
) -> list[Any]:
    """The requests of every file, in order; an empty file is an error that names it."""
    reqs: list[Any] = []
    for p in paths:
        if not head_bytes(p, 1):
            raise fail(p, None, "empty file")
        reqs += load_file(p, block_size)
    return reqs
