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
    return (
        b'"sessionId"' in head
        and (b'"parentUuid"' in head or b'"uuid"' in head)
        and b'"type"' in head
    )


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

    def add(self, uuid: str, ts: int, m: dict[str, Any], usage: dict[str, Any]) -> None:
        """A record of the message (one content block): its time, stop reason, usage (the
        largest output count's), content and uuid."""
        self.last_ts = max(self.last_ts, ts)
        self.first_ts = min(self.first_ts, ts)
        self.stopped = self.stopped or m.get("stop_reason") is not None
        if int(usage.get("output_tokens") or 0) >= int(self.usage.get("output_tokens") or 0):
            self.usage = dict(usage)
        self.content_chars += _content_chars(m.get("content"))
        texts, calls, tasks = _texts(m.get("content"))
        self.texts += texts
        self.tool_calls += calls
        self.tasks += tasks
        self.uuids.append(uuid)

    def tokens(self, tokenizer: Any) -> tuple[int, int | None, int, bool]:
        """(input tokens, cached tokens or None without cache fields, output tokens,
        whether the output was estimated from the content)."""
        u = self.usage
        has_cache = "cache_read_input_tokens" in u or "cache_creation_input_tokens" in u
        cached = int(u.get("cache_read_input_tokens") or 0) if has_cache else None
        n_in = (
            int(u.get("input_tokens") or 0)
            + int(u.get("cache_creation_input_tokens") or 0)
            + (cached or 0)
        )
        n_out = int(u.get("output_tokens") or 0)
        # no stop_reason: the usage may be the stream's start, whatever its figure (5 tokens
        # were logged for 14 words and a tool call): the content's estimate when larger
        guess = 0 if self.stopped else estimate_output(self.texts, self.tool_calls, tokenizer)
        return n_in, cached, max(n_out, guess), guess > n_out


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
        out += _block_texts(block)
        if block.get("type") == "tool_use":
            calls += 1
            tasks += _task_call(block)
    return out, calls, tasks


def _block_texts(block: dict[str, Any]) -> list[str]:
    """A block's text and thinking, and its tool-call input as JSON."""
    out = [block[key] for key in ("text", "thinking") if isinstance(block.get(key), str)]
    if "input" in block:
        out.append(orjson.dumps(block["input"]).decode())
    return out


def _task_call(block: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, prompt) of a Task tool call (spawning a subagent); none for other tools."""
    if block.get("name") != "Task" or not isinstance(block.get("id"), str):
        return []
    inp = block.get("input")
    prompt = inp.get("prompt") if isinstance(inp, dict) else None
    return [(block["id"], prompt if isinstance(prompt, str) else "")]


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


class _Log:
    """One Claude Code log: its records by uuid, its messages by ``message.id``, then the
    sidechains' spawns and joins and the requests (see the module text)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, dict[str, Any]] = {}
        self.msgs: dict[str, _Msg] = {}
        self.msg_of_uuid: dict[str, str] = {}
        self.root_of: dict[str, str | None] = {}
        self.spawned_by: dict[str, str] = {}
        self.agent_of_root: dict[str, str] = {}
        self.root_of_task: dict[str, str] = {}
        self.last_of_root: dict[str, str] = {}
        self.first_of_root: set[str] = set()
        self.done: dict[str, Request] = {}

    # ---- reading

    def read(self) -> None:
        for line, rec in read_records(self.path):
            uuid = rec.get("uuid")
            if not isinstance(uuid, str) or "timestamp" not in rec:
                continue
            ts = parse_iso_ns(rec.get("timestamp"), self.path, line)
            rec["_ts"] = ts
            self.records[uuid] = rec
            if rec.get("type") == "assistant":
                self._assistant(line, uuid, ts, rec)

    def _assistant(self, line: int, uuid: str, ts: int, rec: dict[str, Any]) -> None:
        m = rec.get("message")
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise fail(self.path, line, "assistant record without message.id")
        raw_usage = m.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        mid = m["id"]
        sid = rec.get("sessionId")
        if not isinstance(sid, str):
            raise fail(self.path, line, "assistant record without sessionId")
        cur = self.msgs.get(mid)
        if cur is None:
            cur = self.msgs[mid] = _Msg(
                mid,
                sid,
                uuid,
                ts,
                ts,
                m.get("model"),
                dict(usage),
                m.get("stop_reason") is not None,
                0,
            )
        cur.add(uuid, ts, m, usage)
        self.msg_of_uuid[uuid] = mid

    # ---- sidechains

    def _sidechain_root(self, uuid: str) -> str | None:
        """The root user record of ``uuid``'s sidechain (None: main agent)."""
        path_up: list[str] = []
        cur: str | None = uuid
        root: str | None = None
        while isinstance(cur, str) and cur in self.records and len(path_up) < 100_000:
            if cur in self.root_of:
                root = self.root_of[cur]
                break
            path_up.append(cur)
            rec = self.records[cur]
            if not rec.get("isSidechain"):
                root = None
                break
            parent = rec.get("parentUuid")
            if not isinstance(parent, str) or parent not in self.records:
                root = cur
                break
            cur = parent
        for u in path_up:
            self.root_of[u] = root
        return root

    def _spawn_task(
        self, root: str, ordered: list[_Msg], used: set[str]
    ) -> tuple[_Msg, str] | None:
        """(the main message, its Task call id) that spawned sidechain ``root``: the
        unused Task call before the root carrying its prompt, else the latest one."""
        prompt = _first_text((self.records[root].get("message") or {}).get("content"))
        cands = _open_tasks(ordered, self.records[root]["_ts"], used)
        match = [(m, tid) for m, tid in cands if tid and prompt and _task_prompt(m, tid) == prompt]
        if match:
            return match[0]
        return cands[-1] if cands else None

    def _subagents(self, ordered: list[_Msg]) -> None:
        """Each sidechain's agent id, spawning message and last message."""
        roots = sorted(
            {m.sidechain for m in ordered if m.sidechain is not None},
            key=lambda u: self.records[u]["_ts"],
        )
        used: set[str] = set()
        for root in roots:
            pick = self._spawn_task(root, ordered, used)
            if pick is None:
                self.agent_of_root[root] = f"sidechain-{root[:8]}"
                continue
            used.add(pick[1])
            self.spawned_by[root] = pick[0].id
            self.agent_of_root[root] = pick[1]
        self.root_of_task = {tid: root for root, tid in self.agent_of_root.items()}
        for m in ordered:
            if m.sidechain is not None:
                self.last_of_root[m.sidechain] = m.id

    # ---- requests

    def requests(self, bs: int, tokenizer: Any) -> list[Request]:
        for m in self.msgs.values():
            m.sidechain = self._sidechain_root(m.first_uuid)
        ordered = sorted(self.msgs.values(), key=lambda m: m.first_ts)
        self._subagents(ordered)
        reqs: list[Request] = []
        for m in ordered:
            r = self._request(m, bs, tokenizer)
            self.done[m.id] = r
            reqs.append(r)
        return reqs

    def _arrival(self, m: _Msg) -> int:
        """When the request was sent: the record its first block hangs from (the user
        prompt or the last tool result), unless that is an assistant record."""
        parent_uuid = self.records[m.first_uuid].get("parentUuid")
        opener = self.records.get(parent_uuid) if isinstance(parent_uuid, str) else None
        if opener is not None and opener.get("type") != "assistant":
            return min(opener["_ts"], m.first_ts)
        return m.first_ts

    def _up(self, m: _Msg) -> tuple[str | None, list[str]]:
        """(the nearest other assistant message up the ``parentUuid`` chain, the sidechain
        roots whose Task results the records passed on the way carry)."""
        joins: list[str] = []
        seen = 0
        cur_uuid = self.records[m.first_uuid].get("parentUuid")
        while isinstance(cur_uuid, str) and cur_uuid in self.records and seen < 100_000:
            seen += 1
            other = self.msg_of_uuid.get(cur_uuid)
            if other is not None and other != m.id:
                return other, joins
            joins += _task_results(self.records[cur_uuid], self.root_of_task)
            cur_uuid = self.records[cur_uuid].get("parentUuid")
        return None, joins

    def _tree_deps(self, m: _Msg, joins: list[str]) -> tuple[str, list[str]]:
        """(agent id, dependencies beyond the parent): a sidechain's first message waits
        for its spawner, a main message for the sidechains whose Task results it carries."""
        if m.sidechain is None:
            return "main", [
                self.last_of_root[j] for j in joins if self.last_of_root.get(j) in self.done
            ]
        agent = self.agent_of_root[m.sidechain]
        if m.sidechain in self.first_of_root:
            return agent, []
        self.first_of_root.add(m.sidechain)
        spawner = self.spawned_by.get(m.sidechain)
        return agent, [spawner] if spawner is not None and spawner in self.done else []

    def _request(self, m: _Msg, bs: int, tokenizer: Any) -> Request:
        arrival = self._arrival(m)
        parent_msg, joins = self._up(m)
        n_in, cached, n_out, estimated = m.tokens(tokenizer)
        p = self.done.get(parent_msg) if parent_msg else None
        deps = [parent_msg] if parent_msg is not None and p is not None else []
        agent, more = self._tree_deps(m, joins)
        deps += more
        r = Request(
            session=m.session,
            key=m.id,
            parent_key=p.key if p else None,
            arrival_abs_ns=arrival,
            input_tokens=n_in,
            output_tokens=n_out,
            cached_tokens=cached,
            api="messages",
            model=m.model,
            end_ns=m.last_ts - arrival,
            agent_id=agent,
            depends_on_keys=list(deps),
            output_estimated=estimated,
        )
        link_to_parent(r, p, bs, f"{self.path.name}#{m.id}")
        ends = [self.done[d].arrival_abs_ns + (self.done[d].end_ns or 0) for d in deps]
        r.think_ns = max(0, arrival - max(ends)) if ends else None
        return r


def _open_tasks(ordered: list[_Msg], by: int, used: set[str]) -> list[tuple[_Msg, str]]:
    """(main message, Task call id) of the Task calls sent by ``by`` not yet matched to a
    sidechain (``used``), in message order."""
    return [
        (m, tid)
        for m in ordered
        if m.sidechain is None and m.first_ts <= by
        for tid, _prompt in m.tasks
        if tid not in used
    ]


def _task_prompt(m: _Msg, tid: str) -> str:
    """The prompt of the message's (first) Task call with id ``tid``."""
    return next(p for t, p in m.tasks if t == tid)


def _task_results(rec: dict[str, Any], root_of_task: dict[str, str]) -> list[str]:
    """The sidechain roots whose Task call's ``tool_result`` the record carries."""
    content = (rec.get("message") or {}).get("content")
    return [
        root_of_task[b["tool_use_id"]]
        for b in (content if isinstance(content, list) else ())
        if isinstance(b, dict)
        and b.get("type") == "tool_result"
        and b.get("tool_use_id") in root_of_task
    ]


def _load_file(path: Path, bs: int, tokenizer: Any = None) -> list[Request]:
    log = _Log(path)
    log.read()
    reqs = log.requests(bs, tokenizer)
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
    how = (
        "with the tokenizer"
        if tok is not None
        else f"as characters / {CHARS_PER_TOKEN} + {TOOL_CALL_TOKENS} per tool call"
    )
    return agent_log_result(
        reqs,
        paths,
        bs,
        NAME,
        [
            "one request per message.id; sessions from sessionId; parents from parentUuid chains",
            f"{len(subagents)} sidechains as subagents (spawned by the Task call, joined by its result)",
            f"{estimated} requests with stream-start usage: output estimated {how} (output_estimated)",
        ],
    )
