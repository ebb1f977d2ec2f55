"""LMCache agent traces (LMCache/lmcache-agent-trace): JSONL
``{timestamp (µs since epoch), input (text), output (text), session_id}``, rows not in
time order.

``input`` holds only the non-assistant messages, so the prompt the model really saw is
rebuilt per session in time order: earlier inputs interleaved with earlier outputs
(``input_0 + output_0 + new part of input_1 + output_1 + ... + new part of input_i``).
When a row's input does not extend the previous one, the session's context restarts.

Token counts come from a tokenizer when one is given (``--tokenizer tokenizer.json``),
else from the estimate ``ceil(utf-8 bytes / 4)``. Hash ids are computed from the content:
over token ids in ``block_size`` blocks with a tokenizer, else over
``4 * block_size``-byte blocks, so shared prefixes give shared ids and
``len(hash_ids) == ceil(input_tokens / block_size)`` holds. No end times: ``think_ns`` is
null and arrivals keep the original gaps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.builder import Request, build_table
from traces.errors import InputError
from traces.hashing import hash_bytes, hash_tokens
from traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    first_json_object,
    get_int,
    read_jsonl,
)
from traces.schema import TraceMeta

NAME = "lmcache"
BLOCK_SIZE = 16
BYTES_PER_TOKEN = 4


def sniff(path: Path, head: bytes) -> bool:
    obj = first_json_object(head)
    return obj is not None and {"timestamp", "input", "output", "session_id"} <= obj.keys()


def _tokenizer(path: str | None) -> Any:
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InputError("--tokenizer needs the 'tokenizers' package (pip install "
                         "'agent-replay[tokenizer]')") from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:
        raise InputError(f"{path}: cannot load tokenizer ({exc})") from exc


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    tok = _tokenizer(opts.tokenizer)
    rows: list[tuple[str, int, int, str, str]] = []
    for path in paths:
        for line, obj in read_jsonl(path):
            for key in ("input", "output", "session_id"):
                if not isinstance(obj.get(key), str):
                    raise fail(path, line, f"field {key!r} must be a string")
            rows.append((obj["session_id"], get_int(obj, "timestamp", path, line), line,
                         obj["input"], obj["output"]))
    if not rows:
        raise fail(paths[0], None, "no requests in file")
    rows.sort(key=lambda r: (r[0], r[1], r[2]))

    def count(text: str) -> int:
        if tok is not None:
            return len(tok.encode(text, add_special_tokens=False).ids)
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)

    reqs: list[Request] = []
    prev_input = ""
    prompt = ""
    prev: Request | None = None
    for sid, ts_us, line, text_in, text_out in rows:
        if prev is not None and prev.session == sid and text_in.startswith(prev_input):
            prompt = prompt + text_in[len(prev_input):]
            parent = prev.key
        else:
            prompt, parent = text_in, None
        if tok is not None:
            ids = tok.encode(prompt, add_special_tokens=False).ids
            n_in, hashes = len(ids), hash_tokens(ids, bs)
        else:
            data = prompt.encode()
            n_in = math.ceil(len(data) / BYTES_PER_TOKEN)
            hashes = hash_bytes(data, bs * BYTES_PER_TOKEN)
        r = Request(session=sid, key=(ts_us, line), parent_key=parent, arrival_abs_ns=ts_us * 1000,
                    input_tokens=n_in, output_tokens=count(text_out), hash_ids=hashes, api="chat")
        reqs.append(r)
        prompt += text_out
        prev_input, prev = text_in, r
    table, start = build_table(reqs)
    meta = TraceMeta(block_size=bs, source=f"imported:{NAME}", start_wall_ns=start,
                     content_mode="hashed", tokenizer=opts.tokenizer,
                     extra={"imported_from": [p.name for p in paths]})
    how = f"tokens counted with {opts.tokenizer}" if tok is not None else \
        f"tokens estimated as ceil(utf-8 bytes / {BYTES_PER_TOKEN}) (no --tokenizer)"
    return ImportResult(table, meta, NAME, [
        "prompts rebuilt from earlier inputs and outputs; hash ids from content", how])
