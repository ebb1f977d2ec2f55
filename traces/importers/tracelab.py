"""TraceLab ``round_trace.jsonl`` (uw-syfi/TraceLab): one object per LLM round with
``session_id``, ``round_index``, ``model``, ``input_tokens_total`` (= ``prefix_tokens``,
the cached part, + ``newly_append_tokens``), ``output_tokens`` and ``timing_events``
(user messages, tool results, reasoning, text, tool calls, usage reports; ISO times).

Mapping:

* arrival = the last input event (``user_message`` / ``tool_result``) before the round's
  first output event: the moment the agent had everything it sent;
* end = the round's last output event; ``end_ns`` = end - arrival (approximate: events are
  logged when content blocks complete);
* ``think_ns`` = arrival - the previous round's end: tool time when the round opens with
  tool results, human time when it opens with a user message;
* ``cached_tokens`` = ``prefix_tokens``; hash ids follow ``hashing.chain_hashes``.
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
    first_json_object,
    get_int,
    parse_iso_ns,
    read_jsonl,
)

NAME = "tracelab"
BLOCK_SIZE = 16
INPUT_EVENTS = ("user_message", "tool_result")


def sniff(path: Path, head: bytes) -> bool:
    obj = first_json_object(head)
    return obj is not None and {"round_index", "input_tokens_total", "timing_events"} <= obj.keys()


def _times(events: Any, path: Path, line: int) -> tuple[int | None, int | None, str | None]:
    """(arrival, end, kind of the input that opened the round) in absolute ns."""
    if not isinstance(events, list):
        raise fail(path, line, "field 'timing_events' must be a list")
    arrival: int | None = None
    end: int | None = None
    kind: str | None = None
    started = False
    for ev in events:
        if not isinstance(ev, dict):
            raise fail(path, line, "field 'timing_events' holds a non-object")
        t = parse_iso_ns(ev.get("timestamp"), path, line, "timing_events.timestamp")
        if ev.get("event_type") in INPUT_EVENTS and not started:
            arrival = t if arrival is None else max(arrival, t)
            kind = kind or str(ev.get("event_type"))
        elif ev.get("event_type") not in INPUT_EVENTS:
            started = True
            end = t if end is None else max(end, t)
    return arrival, end, kind


_Round = tuple[str, int, int, int, int, int | None, int | None, str | None, str | None]
"""(session, round index, arrival, input tokens, output tokens, cached tokens, end, model,
input kind) of one round."""


def _round(obj: dict[str, Any], path: Path, line: int) -> _Round:
    sid = obj.get("session_id")
    if not isinstance(sid, str):
        raise fail(path, line, "field 'session_id' must be a string")
    idx = get_int(obj, "round_index", path, line)
    n_in = get_int(obj, "input_tokens_total", path, line)
    n_out = get_int(obj, "output_tokens", path, line)
    cached = obj.get("prefix_tokens")
    cached = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
    arrival, end, kind = _times(obj.get("timing_events"), path, line)
    if arrival is None:
        arrival = end
    if arrival is None:
        raise fail(path, line, "round has no timed events")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    return sid, idx, arrival, n_in, n_out, cached, end, model, kind


def _api(sid: str) -> str | None:
    """The API a session's client spoke, by the session id's prefix."""
    return (
        "messages" if sid.startswith("claude") else "responses" if sid.startswith("codex") else None
    )


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    rounds = [_round(obj, path, line) for path in paths for line, obj in read_jsonl(path)]
    if not rounds:
        raise fail(paths[0], None, "no rounds in file")
    rounds.sort(key=lambda r: (r[0], r[1]))
    reqs: list[Request] = []
    prev: dict[str, Request] = {}
    for sid, idx, arrival, n_in, n_out, cached, end, model, _kind in rounds:
        p = prev.get(sid)
        api = _api(sid)
        r = Request(
            session=sid,
            key=idx,
            arrival_abs_ns=arrival,
            input_tokens=n_in,
            output_tokens=n_out,
            cached_tokens=min(cached, n_in) if cached is not None else None,
            model=model,
            api=api,
            parent_key=p.key if p else None,
            end_ns=(end - arrival) if end is not None and end >= arrival else None,
        )
        link_to_parent(r, p, bs, f"{sid}#{idx}")
        prev[sid] = r
        reqs.append(r)
    return agent_log_result(
        reqs,
        paths,
        bs,
        NAME,
        ["sessions from session_id; think = arrival - previous round's last event"],
    )
