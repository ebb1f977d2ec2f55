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
  has a ``stop_reason``, the usage may have been logged at stream start, whatever its
  figure: where the content's estimate is larger, it is the output size and
  ``output_estimated`` is set. With
  ``--tokenizer tokenizer.json`` (the ``tokenizer`` extra) the text, thinking and
  tool-call input are counted with it; otherwise one token per ``CHARS_PER_TOKEN``
  characters plus ``TOOL_CALL_TOKENS`` per tool call (the call's framing, which the log
  does not show: characters / 4 alone was 2.6-4.9x under the real count on single
  tool-call turns of a held-out log);
* sidechains (``isSidechain``: the records of a Task subagent, a chain of their own from
  a root user record) are subagents (schema v2): ``agent_id`` = the Task call's
  ``tool_use`` id (``sidechain-<root uuid>`` when no Task call matches). The subagent is
  spawned by the main message whose Task call carries the root's prompt (else the latest
  main message with a Task call before the root) and joined by the main message whose
  prompt carries that call's ``tool_result``; ``think_ns`` counts from the latest
  dependency's end;
* hash ids follow ``hashing.chain_hashes`` (the prompt's start, system prompt and tool
  definitions, is not in the log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

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

NAME = "claude-code"
BLOCK_SIZE = 16
CHARS_PER_TOKEN = 4
TOOL_CALL_TOKENS = 40
"""Estimated tokens of one tool call's framing beyond its input JSON (see the docstring)."""


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
    texts: list[str] = field(default_factory=list)
    tool_calls: int = 0
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (tool_use id, prompt)
    sidechain: str | None = None  # root uuid of its sidechain; None: main agent


def _texts(content: Any) -> tuple[list[str], int, list[tuple[str, str]]]:
    """Text, thinking and tool-call input JSON of a message's blocks; tool calls; Task calls."""
    if isinstance(content, str):
        return [content], 0, []
    out: list[str] = []
    calls = 0
    tasks: list[tuple[str, str]] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        for key in ("text", "thinking"):
            if isinstance(block.get(key), str):
                out.append(block[key])
        if "input" in block:
            out.append(orjson.dumps(block["input"]).decode())
        if block.get("type") == "tool_use":
            calls += 1
            inp = block.get("input")
            if block.get("name") == "Task" and isinstance(block.get("id"), str):
                prompt = inp.get("prompt") if isinstance(inp, dict) else None
                tasks.append((block["id"], prompt if isinstance(prompt, str) else ""))
    return out, calls, tasks


def _first_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            return str(block["text"])
    return ""


def estimate_output(texts: list[str], tool_calls: int, tokenizer: Any = None) -> int:
    """Output tokens of a message whose usage was logged at stream start."""
    if tokenizer is not None:
        n = sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts)
    else:
        n = math.ceil(sum(len(t) for t in texts) / CHARS_PER_TOKEN)
    return n + TOOL_CALL_TOKENS * tool_calls


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


def _load_file(path: Path, bs: int, tokenizer: Any = None) -> list[Request]:
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
        texts, calls, tasks = _texts(m.get("content"))
        cur.texts += texts
        cur.tool_calls += calls
        cur.tasks += tasks
        cur.uuids.append(uuid)
        msg_of_uuid[uuid] = mid

    root_of: dict[str, str | None] = {}

    def sidechain_root(uuid: str) -> str | None:
        """The root user record of ``uuid``'s sidechain (None: main agent)."""
        path_up: list[str] = []
        cur: str | None = uuid
        root: str | None = None
        while isinstance(cur, str) and cur in records and len(path_up) < 100_000:
            if cur in root_of:
                root = root_of[cur]
                break
            path_up.append(cur)
            rec = records[cur]
            if not rec.get("isSidechain"):
                root = None
                break
            parent = rec.get("parentUuid")
            if not isinstance(parent, str) or parent not in records:
                root = cur
                break
            cur = parent
        for u in path_up:
            root_of[u] = root
        return root

    for m in msgs.values():
        m.sidechain = sidechain_root(m.first_uuid)

    ordered = sorted(msgs.values(), key=lambda m: m.first_ts)
    # subagents: which main message spawned each sidechain, and its agent id
    roots = sorted({m.sidechain for m in ordered if m.sidechain is not None},
                   key=lambda u: records[u]["_ts"])
    spawned_by: dict[str, str] = {}
    agent_of_root: dict[str, str] = {}
    task_used: set[str] = set()
    for root in roots:
        prompt = _first_text((records[root].get("message") or {}).get("content"))
        cands = [(m, tid) for m in ordered if m.sidechain is None and m.first_ts <= records[root]["_ts"]
                 for tid, p in m.tasks if tid not in task_used]
        match = [c for c in cands if c[1] and prompt and
                 next(p for t, p in c[0].tasks if t == c[1]) == prompt]
        pick = match[0] if match else (cands[-1] if cands else None)
        if pick is not None:
            task_used.add(pick[1])
            spawned_by[root] = pick[0].id
            agent_of_root[root] = pick[1]
        else:
            agent_of_root[root] = f"sidechain-{root[:8]}"
    root_of_task = {tid: root for root, tid in agent_of_root.items()}
    last_of_root: dict[str, str] = {}
    for m in ordered:
        if m.sidechain is not None:
            last_of_root[m.sidechain] = m.id

    reqs: list[Request] = []
    done: dict[str, Request] = {}
    first_of_root: set[str] = set()
    for m in ordered:
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
        joins: list[str] = []  # sidechain roots whose Task result this prompt carries
        while isinstance(cur_uuid, str) and cur_uuid in records and seen < 100_000:
            seen += 1
            other = msg_of_uuid.get(cur_uuid)
            if other is not None and other != m.id:
                parent_msg = other
                break
            content = (records[cur_uuid].get("message") or {}).get("content")
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") == "tool_result" and \
                        block.get("tool_use_id") in root_of_task:
                    joins.append(root_of_task[block["tool_use_id"]])
            cur_uuid = records[cur_uuid].get("parentUuid")
        u = m.usage
        has_cache = "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u
        cached = int(u.get("cache_read_input_tokens") or 0) if has_cache else None
        n_in = int(u.get("input_tokens") or 0) + int(u.get("cache_creation_input_tokens") or 0) + (cached or 0)
        n_out = int(u.get("output_tokens") or 0)
        # no stop_reason: the usage may be the stream's start, whatever its figure (5 tokens
        # were logged for 14 words and a tool call): the content's estimate when larger
        guess = 0 if m.stopped else estimate_output(m.texts, m.tool_calls, tokenizer)
        estimated = guess > n_out
        n_out = max(n_out, guess)
        p = done.get(parent_msg) if parent_msg else None
        deps: list[str] = [m_id for m_id in (parent_msg,) if m_id is not None and p is not None]
        agent = "main"
        if m.sidechain is not None:
            agent = agent_of_root[m.sidechain]
            if m.sidechain not in first_of_root:
                first_of_root.add(m.sidechain)
                spawner = spawned_by.get(m.sidechain)
                if spawner is not None and spawner in done:
                    deps.append(spawner)
        else:
            deps += [last_of_root[j] for j in joins if last_of_root.get(j) in done]
        r = Request(session=m.session, key=m.id, parent_key=p.key if p else None,
                    arrival_abs_ns=arrival, input_tokens=n_in, output_tokens=n_out,
                    cached_tokens=cached, api="messages", model=m.model,
                    end_ns=m.last_ts - arrival, agent_id=agent, depends_on_keys=list(deps),
                    output_estimated=estimated)
        link_to_parent(r, p, bs, f"{path.name}#{m.id}")
        ends = [done[d].arrival_abs_ns + (done[d].end_ns or 0) for d in deps]
        r.think_ns = max(0, arrival - max(ends)) if ends else None
        done[m.id] = r
        reqs.append(r)
    if not reqs:
        raise fail(path, None, "no assistant messages in the log")
    return reqs


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    from agent_replay.traces.importers.lmcache import _tokenizer

    bs = opts.block_size or BLOCK_SIZE
    tok = _tokenizer(opts.tokenizer)
    reqs = load_each(paths, bs, lambda p, b: _load_file(p, b, tok))
    subagents = {(r.session, r.agent_id) for r in reqs if r.agent_id not in (None, "main")}
    estimated = sum(1 for r in reqs if r.output_estimated)
    how = "with the tokenizer" if tok is not None else \
        f"as characters / {CHARS_PER_TOKEN} + {TOOL_CALL_TOKENS} per tool call"
    return agent_log_result(reqs, paths, bs, NAME, [
        "one request per message.id; sessions from sessionId; parents from parentUuid chains",
        f"{len(subagents)} sidechains as subagents (spawned by the Task call, joined by its result)",
        f"{estimated} requests with stream-start usage: output estimated {how} (output_estimated)"])
