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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

_OTLP_HEAD = re.compile(rb'^\s*\{\s*"resource(Spans|Logs|Metrics)"')


def looks_like_otlp(head: bytes) -> bool:
    """The bytes start an OTLP JSON export request."""
    return _OTLP_HEAD.match(head) is not None


def value(v: Any) -> Any:
    """A protobuf-JSON ``AnyValue`` as a Python value (None when empty or unknown)."""
    if not isinstance(v, dict):
        return None
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return None
    if "doubleValue" in v:
        d = v["doubleValue"]
        return float(d) if isinstance(d, (int, float, str)) and _is_num(d) else None
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        vals = (v["arrayValue"] or {}).get("values") or []
        return [value(x) for x in vals]
    if "kvlistValue" in v:
        return attributes((v["kvlistValue"] or {}).get("values"))
    return None


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
        try:
            obj = orjson.loads(first) if first.strip() else None
        except orjson.JSONDecodeError:
            obj = None
        if obj is None and first.strip():
            # not a whole object on its first line: one (pretty-printed) body
            body = first + fh.read()
            try:
                whole = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                yield 1, f"not valid JSON: {exc}"
                return
            yield (1, whole) if isinstance(whole, dict) else (1, "not a JSON object")
            return
        n = 1
        raw = first
        while raw:
            if raw.strip():
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    hint = " (truncated?)" if not raw.endswith(b"\n") else ""
                    yield n, f"not valid JSON{hint}: {exc}"
                else:
                    yield (n, obj) if isinstance(obj, dict) else (n, "not a JSON object")
            raw = fh.readline()
            n += 1


def spans(export: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, span) for each span of an export request."""
    for rs in export.get("resourceSpans") or ():
        if not isinstance(rs, dict):
            continue
        res = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            for sp in (ss.get("spans") or ()) if isinstance(ss, dict) else ():
                if isinstance(sp, dict):
                    yield res, sp


def log_records(export: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, log record) for each log record of an export request."""
    for rl in export.get("resourceLogs") or ():
        if not isinstance(rl, dict):
            continue
        res = attributes((rl.get("resource") or {}).get("attributes"))
        for sl in rl.get("scopeLogs") or rl.get("instrumentationLibraryLogs") or ():
            for rec in (sl.get("logRecords") or ()) if isinstance(sl, dict) else ():
                if isinstance(rec, dict):
                    yield res, rec
