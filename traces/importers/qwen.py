"""Alibaba Qwen / Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon): JSONL with
``chat_id``, ``parent_chat_id`` (-1 = first turn), ``timestamp`` (seconds, float),
``input_length``, ``output_length``, ``type``, ``turn`` and ``hash_ids`` over 16-token
blocks (prefix semantics, kept as they are).

A session is the tree under a root chat (``parent_chat_id == -1``); a request whose parent
is not in the file starts a session of its own. Think times are not in the source (null).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_replay.traces.builder import Request, build_table
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    first_json_object,
    get_hash_ids,
    get_int,
    get_num,
    read_jsonl,
)
from agent_replay.traces.schema import TraceMeta

NAME = "qwen"
BLOCK_SIZE = 16


def sniff(path: Path, head: bytes) -> bool:
    obj = first_json_object(head)
    return obj is not None and {"chat_id", "parent_chat_id", "input_length"} <= obj.keys()


def _request(obj: dict[str, Any], path: Path, line: int, root_of: dict[object, object]) -> Request:
    """One row: in the session of its chat tree's root (``root_of``: chat -> root, of the
    rows before), its parent the chat it names when that one came before."""
    chat = obj.get("chat_id")
    parent = obj.get("parent_chat_id", -1)
    if chat is None:
        raise fail(path, line, "field 'chat_id' missing")
    h = get_hash_ids(obj, path, line)
    root_of[chat] = chat if parent in (-1, None) or parent not in root_of else root_of[parent]
    linked = parent not in (-1, None) and parent in root_of  # read after: a chat can name itself
    return Request(
        session=f"qw-{root_of[chat]}",
        key=chat,
        parent_key=parent if linked else None,
        arrival_abs_ns=round(get_num(obj, "timestamp", path, line) * 1e9),
        input_tokens=get_int(obj, "input_length", path, line),
        output_tokens=get_int(obj, "output_length", path, line),
        hash_ids=h,
    )


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    root_of: dict[object, object] = {}
    reqs = [_request(obj, path, line, root_of) for path in paths for line, obj in read_jsonl(path)]
    if not reqs:
        raise fail(paths[0], None, "no requests in file")
    table, _ = build_table(reqs)
    meta = TraceMeta(
        block_size=opts.block_size or BLOCK_SIZE,
        source=f"imported:{NAME}",
        extra={"imported_from": [p.name for p in paths]},
    )
    return ImportResult(table, meta, NAME, ["sessions from chat_id / parent_chat_id trees"])
