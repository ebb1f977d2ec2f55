"""OTLP JSON: export requests (``ExportTraceServiceRequest`` / ``ExportLogsServiceRequest``
in the protobuf JSON mapping) read one at a time, and their attributes decoded.

Two layouts hold them: the OpenTelemetry Collector's file exporter writes one export
request per line, and an OTLP/HTTP JSON body is one export request (a file may hold one
pretty-printed). ``read_exports`` streams the first line by line, so a file of a million
spans is never one parsed tree; the second is read whole (one HTTP body).

Times are ``*UnixNano`` strings (or integers) of nanoseconds since the epoch; trace and span
ids are hex strings; ``intValue`` is a decimal string.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

_OTLP_HEAD = re.compile(rb'^\s*\{\s*"resource(Spans|Logs|Metrics)"')


def looks_like_otlp(head: bytes) -> bool:
    """The bytes start an OTLP JSON export request."""
    return _OTLP_HEAD.match(head) is not None


def value(v: Any) -> Any:
    """A protobuf-JSON ``AnyValue`` as a Python value (None when empty or unknown)."""
    if not isinstance(v, dict):
        return None
    for key, convert in _VALUES:
        if key in v:
            return convert(v[key])
    return None


def _int_value(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _double_value(d: Any) -> float | None:
    return float(d) if isinstance(d, (int, float, str)) and _is_num(d) else None


def _array_value(x: Any) -> list[Any]:
    return [value(item) for item in (x or {}).get("values") or []]


def _kvlist_value(x: Any) -> dict[str, Any]:
    return attributes((x or {}).get("values"))


_VALUES: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("stringValue", lambda x: x),
    ("intValue", _int_value),
    ("doubleValue", _double_value),
    ("boolValue", bool),
    ("arrayValue", _array_value),
    ("kvlistValue", _kvlist_value),
)
"""``AnyValue``'s fields in the order they are tried, each with its conversion."""


def _is_num(s: Any) -> bool:
    try:
        float(s)
    except (TypeError, ValueError):
        return False
    return True


def attributes(kvs: Any) -> dict[str, Any]:
    """A ``KeyValue`` list as a dict."""
    out: dict[str, Any] = {}
    for kv in kvs if isinstance(kvs, list) else ():
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = value(kv.get("value"))
    return out


def nanos(v: Any) -> int | None:
    """A ``*UnixNano`` field as an int (None when absent, zero or not a number)."""
    if isinstance(v, bool):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def read_exports(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line, export request) for each export request of ``path``; (line, reason) for a
    line that is not one, so that the caller can name it and go on."""
    with path.open("rb") as fh:
        first = fh.readline()
        if first.strip() and _loads_or_none(first) is None:
            # not a whole object on its first line: one (pretty-printed) body
            yield _whole_body(first + fh.read())
            return
        yield from _lines(first, fh)


def _loads_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _whole_body(body: bytes) -> tuple[int, dict[str, Any] | str]:
    try:
        whole = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return 1, f"not valid JSON: {exc}"
    return (1, whole) if isinstance(whole, dict) else (1, "not a JSON object")


def _lines(first: bytes, fh: BinaryIO) -> Iterator[tuple[int, dict[str, Any] | str]]:
    n, raw = 1, first
    while raw:
        if raw.strip():
            yield n, _one_line(raw)
        raw = fh.readline()
        n += 1


def _one_line(raw: bytes) -> dict[str, Any] | str:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        hint = " (truncated?)" if not raw.endswith(b"\n") else ""
        return f"not valid JSON{hint}: {exc}"
    return obj if isinstance(obj, dict) else "not a JSON object"


def _items(
    export: dict[str, Any], top: str, scopes: tuple[str, str], item: str
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, item) for each item of an export request: ``top`` (resource
    level) > ``scopes`` (the scope level's name, then its pre-1.0 name) > ``item``."""
    for rs in export.get(top) or ():
        if not isinstance(rs, dict):
            continue
        res = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get(scopes[0]) or rs.get(scopes[1]) or ():
            for it in _dicts(ss.get(item) if isinstance(ss, dict) else None):
                yield res, it


def _dicts(xs: Any) -> Iterator[dict[str, Any]]:
    for x in xs or ():
        if isinstance(x, dict):
            yield x


def spans(export: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, span) for each span of an export request."""
    return _items(export, "resourceSpans", ("scopeSpans", "instrumentationLibrarySpans"), "spans")


def log_records(export: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, log record) for each log record of an export request."""
    return _items(export, "resourceLogs", ("scopeLogs", "instrumentationLibraryLogs"), "logRecords")
