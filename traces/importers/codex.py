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

from dataclasses import dataclass, field
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
OUTPUT_ITEMS = (
    "reasoning",
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "web_search_call",
)


def sniff(path: Path, head: bytes) -> bool:
    return b'"session_meta"' in head or (b'"response_item"' in head and b'"payload"' in head)


def _kind(rec: dict[str, Any]) -> str | None:
    """'in', 'out' or None for a record."""
    payload = _payload(rec)
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


def _payload(rec: dict[str, Any]) -> dict[str, Any]:
    payload = rec.get("payload")
    return payload if isinstance(payload, dict) else {}


def _usage(u: dict[str, Any], path: Path, line: int) -> tuple[int, int, int]:
    """(input, cached input, output) tokens of a ``last_token_usage``."""
    try:
        return (
            int(u.get("input_tokens") or 0),
            int(u.get("cached_input_tokens") or 0),
            int(u.get("output_tokens") or 0),
        )
    except (TypeError, ValueError) as exc:
        raise fail(path, line, f"token_count usage is not numeric ({exc})") from exc


@dataclass
class _Log:
    """One session log read record by record: the session and model named so far, the
    times of the pending request's last input and first output, the requests made."""

    path: Path
    bs: int
    session: str
    model: str | None = None
    last_in: int | None = None
    first_out: int | None = None
    prev_total: object = None
    reqs: list[Request] = field(default_factory=list)

    def record(self, line: int, rec: dict[str, Any]) -> None:
        payload = _payload(rec)
        if self._context(rec.get("type"), payload) or "timestamp" not in rec:
            return
        ts = parse_iso_ns(rec["timestamp"], self.path, line)
        if self.first_out is None:
            kind = _kind(rec)
            if kind == "in":
                self.last_in = ts
            elif kind == "out":
                self.first_out = ts
        if rec.get("type") == "event_msg" and payload.get("type") == "token_count":
            self._token_count(payload.get("info"), ts, line)

    def _context(self, rtype: Any, payload: dict[str, Any]) -> bool:
        """A record naming the session or the model (taken); whether it was one."""
        if rtype == "session_meta" and isinstance(payload.get("id"), str):
            self.session = payload["id"]
            return True
        if rtype == "turn_context" and isinstance(payload.get("model"), str):
            self.model = payload["model"]
            return True
        return False

    def _token_count(self, info: Any, ts: int, line: int) -> None:
        """A usage report: a new request when the totals moved (a repeat is no request)."""
        if not isinstance(info, dict) or not isinstance(info.get("last_token_usage"), dict):
            return
        if info.get("total_token_usage") == self.prev_total:
            return
        self.prev_total = info.get("total_token_usage")
        n_in, cached, n_out = _usage(info["last_token_usage"], self.path, line)
        arrival = next((t for t in (self.last_in, self.first_out) if t is not None), ts)
        prev = self.reqs[-1] if self.reqs else None
        n = len(self.reqs)
        r = Request(
            session=self.session,
            key=n,
            parent_key=prev.key if prev else None,
            arrival_abs_ns=arrival,
            input_tokens=n_in,
            output_tokens=n_out,
            cached_tokens=min(cached, n_in),
            api="responses",
            model=self.model,
            end_ns=ts - arrival,
        )
        link_to_parent(r, prev, self.bs, f"{self.session}#{n}")
        self.reqs.append(r)
        self.last_in = self.first_out = None


def _load_file(path: Path, bs: int) -> list[Request]:
    log = _Log(path, bs, path.stem)
    for line, rec in read_records(path):
        log.record(line, rec)
    if not log.reqs:
        raise fail(path, None, "no token_count events: not a Codex session log with usage")
    return log.reqs


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    return agent_log_result(
        load_each(paths, bs, _load_file),
        paths,
        bs,
        NAME,
        ["one request per token_count report; sessions from session_meta"],
    )
