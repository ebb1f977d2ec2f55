"""Native Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``).

Records carry ``timestamp``, ``sessionId``, ``uuid``/``parentUuid`` and, for assistant
records, ``message`` (``id``, ``model``, ``content``, ``usage``). Claude Code writes one
record per content block, so one API request is the group of assistant records sharing
``message.id``.

Mapping:

* session = ``sessionId``; one request per ``message.id``;
* parent = the nearest assistant message up the ``parentUuid`` chain;
* arrival = the timestamp of the record the request's first block hangs from (the user
  prompt or the last tool result: what the agent sent); end = its last block's timestamp;
  ``end_ns`` = end - arrival; ``think_ns`` = arrival - the parent's end (tool time, or
  human time after a prompt);
* ``input_tokens`` = ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``,
  ``cached_tokens`` = ``cache_read_input_tokens`` (null when the log has no cache fields);
* ``output_tokens`` = the largest ``usage.output_tokens`` among the blocks. When no block
  has a ``stop_reason`` the usage was logged at stream start (it then reads ~2 tokens):
  the output size is estimated from the content instead, one token per
  ``CHARS_PER_TOKEN`` characters of text, thinking and tool-call input;
* hash ids follow ``hashing.chain_hashes`` (the prompt's start, system prompt and tool
  definitions, is not in the log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from traces.builder import Request, link_to_parent
from traces.importers._common import (
    ImportOptions,
    ImportResult,
    agent_log_result,
    fail,
    load_each,
    parse_iso_ns,
    read_records,
)

NAME = "claude-code"
BLOCK_SIZE = 16
CHARS_PER_TOKEN = 4


def sniff(path: Path, head: bytes) -> bool:
    return (b'"sessionId"' in head and (b'"parentUuid"' in head or b'"uuid"' in head)
            and b'"type"' in head)


@dataclass
class _Msg:
    id: str
    session: str
    first_uuid: str
    first_ts: int
    last_ts: int
    model: str | None
    usage: dict[str, Any]
    stopped: bool
    content_chars: int
    uuids: list[str] = field(default_factory=list)


def _content_chars(content: Any) -> int:
    if not isinstance(content, list):
        return len(content) if isinstance(content, str) else 0
    n = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        for key in ("text", "thinking"):
            if isinstance(block.get(key), str):
                n += len(block[key])
        if "input" in block:
            n += len(orjson.dumps(block["input"]))
    return n


def _load_file(path: Path, bs: int) -> list[Request]:
    records: dict[str, dict[str, Any]] = {}
    msgs: dict[str, _Msg] = {}
    msg_of_uuid: dict[str, str] = {}
    for line, rec in read_records(path):
        uuid = rec.get("uuid")
        if not isinstance(uuid, str) or "timestamp" not in rec:
            continue
        ts = parse_iso_ns(rec.get("timestamp"), path, line)
        rec["_ts"] = ts
        records[uuid] = rec
        if rec.get("type") != "assistant":
            continue
        m = rec.get("message")
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise fail(path, line, "assistant record without message.id")
        raw_usage = m.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        mid = m["id"]
        sid = rec.get("sessionId")
        if not isinstance(sid, str):
            raise fail(path, line, "assistant record without sessionId")
        cur = msgs.get(mid)
        if cur is None:
            cur = msgs[mid] = _Msg(mid, sid, uuid, ts, ts, m.get("model"), dict(usage),
                                   m.get("stop_reason") is not None, 0)
        cur.last_ts = max(cur.last_ts, ts)
        cur.first_ts = min(cur.first_ts, ts)
        cur.stopped = cur.stopped or m.get("stop_reason") is not None
        if int(usage.get("output_tokens") or 0) >= int(cur.usage.get("output_tokens") or 0):
            cur.usage = dict(usage)
        cur.content_chars += _content_chars(m.get("content"))
        cur.uuids.append(uuid)
        msg_of_uuid[uuid] = mid

    reqs: list[Request] = []
    done: dict[str, Request] = {}
    for m in sorted(msgs.values(), key=lambda m: m.first_ts):
        first = records[m.first_uuid]
        parent_uuid = first.get("parentUuid")
        arrival = m.first_ts
        opener = records.get(parent_uuid) if isinstance(parent_uuid, str) else None
        if opener is not None and opener.get("type") != "assistant":
            arrival = min(opener["_ts"], m.first_ts)
        # nearest assistant message up the chain
        parent_msg: str | None = None
        seen = 0
        cur_uuid = parent_uuid
        while isinstance(cur_uuid, str) and cur_uuid in records and seen < 100_000:
            seen += 1
            other = msg_of_uuid.get(cur_uuid)
            if other is not None and other != m.id:
                parent_msg = other
                break
            cur_uuid = records[cur_uuid].get("parentUuid")
        u = m.usage
        has_cache = "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u
        cached = int(u.get("cache_read_input_tokens") or 0) if has_cache else None
        n_in = int(u.get("input_tokens") or 0) + int(u.get("cache_creation_input_tokens") or 0) + (cached or 0)
        n_out = int(u.get("output_tokens") or 0)
        if not m.stopped:
            n_out = max(n_out, math.ceil(m.content_chars / CHARS_PER_TOKEN))
        p = done.get(parent_msg) if parent_msg else None
        r = Request(session=m.session, key=m.id, parent_key=p.key if p else None,
                    arrival_abs_ns=arrival, input_tokens=n_in, output_tokens=n_out,
                    cached_tokens=cached, api="messages", model=m.model,
                    end_ns=m.last_ts - arrival)
        link_to_parent(r, p, bs, f"{path.name}#{m.id}")
        done[m.id] = r
        reqs.append(r)
    if not reqs:
        raise fail(path, None, "no assistant messages in the log")
    return reqs


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    return agent_log_result(load_each(paths, bs, _load_file), paths, bs, NAME, [
        "one request per message.id; sessions from sessionId; parents from parentUuid chains"])
