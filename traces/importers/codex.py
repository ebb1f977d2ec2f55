"""Codex CLI session logs (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``): records of
``{timestamp, type, payload}``; ``session_meta`` names the session, ``turn_context`` the
model, ``response_item`` holds messages, reasoning, function calls and their outputs, and
``event_msg`` of type ``token_count`` closes each model request with
``info.last_token_usage`` (``input_tokens`` including ``cached_input_tokens``,
``output_tokens`` including reasoning).

Mapping: one request per ``token_count`` whose totals moved; arrival = the last input item
(user/developer message, tool output) before the request's first output item; end = the
``token_count`` record; ``think_ns`` = arrival - the previous request's end;
``cached_tokens`` = ``cached_input_tokens``; hash ids follow ``hashing.chain_hashes``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_replay.traces.builder import Request, link_to_parent
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    agent_log_result,
    fail,
    load_each,
    parse_iso_ns,
    read_records,
)

NAME = "codex"
BLOCK_SIZE = 16
INPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
OUTPUT_ITEMS = ("reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call")


def sniff(path: Path, head: bytes) -> bool:
    return b'"session_meta"' in head or (b'"response_item"' in head and b'"payload"' in head)


def _kind(rec: dict[str, Any]) -> str | None:
    """'in', 'out' or None for a record."""
    payload = rec.get("payload") if isinstance(rec.get("payload"), dict) else {}
    assert isinstance(payload, dict)
    ptype = payload.get("type")
    if rec.get("type") == "event_msg":
        return _EVENT_KINDS.get(ptype) if isinstance(ptype, str) else None
    if rec.get("type") != "response_item":
        return None
    if ptype == "message":
        return "out" if payload.get("role") == "assistant" else "in"
    if ptype in INPUT_ITEMS:
        return "in"
    return "out" if ptype in OUTPUT_ITEMS else None


_EVENT_KINDS = {"user_message": "in", "agent_message": "out", "agent_reasoning": "out"}
"""The ``event_msg`` payloads that carry a turn's input or output."""


def _load_file(path: Path, bs: int) -> list[Request]:
    session = path.stem
    model: str | None = None
    last_in: int | None = None
    first_out: int | None = None
    prev: Request | None = None
    prev_total: object = None
    reqs: list[Request] = []
    for line, rec in read_records(path):
        payload = rec.get("payload") if isinstance(rec.get("payload"), dict) else {}
        assert isinstance(payload, dict)
        if rec.get("type") == "session_meta" and isinstance(payload.get("id"), str):
            session = payload["id"]
            continue
        if rec.get("type") == "turn_context" and isinstance(payload.get("model"), str):
            model = payload["model"]
            continue
        if "timestamp" not in rec:
            continue
        ts = parse_iso_ns(rec["timestamp"], path, line)
        kind = _kind(rec)
        if kind == "in" and first_out is None:
            last_in = ts
        elif kind == "out" and first_out is None:
            first_out = ts
        if rec.get("type") == "event_msg" and payload.get("type") == "token_count":
            info = payload.get("info")
            if not isinstance(info, dict) or not isinstance(info.get("last_token_usage"), dict):
                continue
            if info.get("total_token_usage") == prev_total:
                continue  # a repeated report, not a new request
            prev_total = info.get("total_token_usage")
            u = info["last_token_usage"]
            try:
                n_in = int(u.get("input_tokens") or 0)
                cached = int(u.get("cached_input_tokens") or 0)
                n_out = int(u.get("output_tokens") or 0)
            except (TypeError, ValueError) as exc:
                raise fail(path, line, f"token_count usage is not numeric ({exc})") from exc
            arrival = last_in if last_in is not None else (first_out if first_out is not None else ts)
            r = Request(session=session, key=len(reqs), parent_key=prev.key if prev else None,
                        arrival_abs_ns=arrival, input_tokens=n_in, output_tokens=n_out,
                        cached_tokens=min(cached, n_in), api="responses", model=model,
                        end_ns=ts - arrival)
            link_to_parent(r, prev, bs, f"{session}#{len(reqs)}")
            reqs.append(r)
            prev, last_in, first_out = r, None, None
    if not reqs:
        raise fail(path, None, "no token_count events: not a Codex session log with usage")
    return reqs


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    return agent_log_result(load_each(paths, bs, _load_file), paths, bs, NAME, [
        "one request per token_count report; sessions from session_meta"])
