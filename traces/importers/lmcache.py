"""LMCache agent traces (LMCache/lmcache-agent-trace): JSONL
``{timestamp (µs since epoch), input (text), output (text), session_id}``, rows not in
time order.

The prompt the model really saw is rebuilt per conversation in time order:

* A row continues the conversation (chain) of its session whose last input its own input
  extends (the longest such input wins); none: a new chain starts. ``taubench`` files
  interleave two LLMs (user simulator and agent) under one ``session_id``: each gets its
  own chain, and when a session has more than one chain that continues, each chain is an
  ``agent_id`` stream (``main``, ``llm-1``, ...) whose turns depend on their chain's
  previous turn and on the session's previous row (the order the two LLMs took turns).
* A row whose input holds an earlier row's output (at least ``MIN_OUTPUT_CHARS``
  characters of it, byte for byte: the agent's reply forwarded to the user simulator)
  waits for that row, the latest such one, even where it starts a chain of its own.
* Where ``input`` holds only the non-assistant messages (``miniswe``), earlier outputs are
  interleaved (``input_0 + output_0 + new part of input_1 + output_1 + ...``). Where it
  already holds the whole flattened conversation (``magagent``: the new part of the input
  contains the chain's previous output), the input is the prompt as it is; appending the
  outputs again would inflate it.
* A row whose input repeats its chain's last input byte for byte (``magagent``'s
  orchestrator sends the same ledger prompt again) is a new call with that same prompt:
  its prompt is the previous row's prompt, without the previous output appended.
* Rows with an empty ``input`` (``magagent`` rows whose screenshot was dropped) are left
  out and counted in the import summary: they are not 0-token prompts.
* Rows with an empty ``output`` (``taubench`` tool calls, whose text the source did not
  log) are replayed with one output token, the least a server can be asked for, and marked
  ``output_estimated``: their real length is unknown.

Token counts come from a tokenizer when one is given (``--tokenizer tokenizer.json``),
else from the estimate ``ceil(utf-8 bytes / 4)``. Hash ids are computed from the content:
over token ids in ``block_size`` blocks with a tokenizer, else over
``4 * block_size``-byte blocks, so shared prefixes give shared ids and
``len(hash_ids) == ceil(input_tokens / block_size)`` holds. No end times: ``think_ns`` is
null and arrivals keep the original gaps.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError
from agent_replay.traces.builder import Request, build_table
from agent_replay.traces.hashing import hash_bytes, hash_tokens
from agent_replay.traces.importers._common import (
    ImportOptions,
    ImportResult,
    fail,
    first_json_object,
    get_int,
    read_jsonl,
)
from agent_replay.traces.schema import TraceMeta

NAME = "lmcache"
BLOCK_SIZE = 16
BYTES_PER_TOKEN = 4
MIN_OUTPUT_CHARS = 16
"""An earlier output shorter than this (stripped) found in an input is no evidence of a
dependency: a short reply ("OK") can occur by chance."""
LOOK_BACK = 64
"""How many earlier rows of the session an input is searched for their outputs."""


def content_dependency(
    text_in: str, earlier: list[tuple[object, str]], parent: object | None = None
) -> object | None:
    """The key of the latest earlier row (``earlier`` in time order: (key, output)) whose
    output, stripped and at least ``MIN_OUTPUT_CHARS`` long, is inside ``text_in``; None
    when there is none or it is the row's prefix ``parent`` (waited for already)."""
    for key, out in reversed(earlier[-LOOK_BACK:]):
        s = out.strip()
        if len(s) >= MIN_OUTPUT_CHARS and s in text_in:
            return None if key == parent else key
    return None


def sniff(path: Path, head: bytes) -> bool:
    obj = first_json_object(head)
    return obj is not None and {"timestamp", "input", "output", "session_id"} <= obj.keys()


def _tokenizer(path: str | None) -> Any:
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InputError(
            "--tokenizer needs the 'tokenizers' package (pip install 'agent-replay[tokenizer]')"
        ) from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:
        raise InputError(f"{path}: cannot load tokenizer ({exc})") from exc


def _read_rows(paths: list[Path]) -> list[tuple[str, int, int, str, str]]:
    """(session, timestamp in us, line, input, output) of every row, by session then time
    (file order on ties)."""
    rows: list[tuple[str, int, int, str, str]] = []
    for path in paths:
        for line, obj in read_jsonl(path):
            for key in ("input", "output", "session_id"):
                if not isinstance(obj.get(key), str):
                    raise fail(path, line, f"field {key!r} must be a string")
            rows.append(
                (
                    obj["session_id"],
                    get_int(obj, "timestamp", path, line),
                    line,
                    obj["input"],
                    obj["output"],
                )
            )
    if not rows:
        raise fail(paths[0], None, "no requests in file")
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return rows


class _Tokens:
    """Token counts and hash ids of texts: by the tokenizer when given, else estimated
    from UTF-8 bytes (``BYTES_PER_TOKEN``)."""

    def __init__(self, tok: Any, bs: int) -> None:
        self.tok = tok
        self.bs = bs

    def count(self, text: str) -> int:
        if self.tok is not None:
            return len(self.tok.encode(text, add_special_tokens=False).ids)
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)

    def how(self, name: str | None) -> str:
        """How tokens were counted, for the notes (``name``: the tokenizer's file)."""
        if self.tok is not None:
            return f"tokens counted with {name}"
        return f"tokens estimated as ceil(utf-8 bytes / {BYTES_PER_TOKEN}) (no --tokenizer)"

    def prompt(self, prompt: str) -> tuple[int, list[int]]:
        """(input tokens, hash ids) of a prompt."""
        if self.tok is not None:
            ids = self.tok.encode(prompt, add_special_tokens=False).ids
            return len(ids), hash_tokens(ids, self.bs)
        data = prompt.encode()
        return math.ceil(len(data) / BYTES_PER_TOKEN), hash_bytes(data, self.bs * BYTES_PER_TOKEN)


def _place(mine: list[_Chain], text_in: str) -> tuple[_Chain, str, str | None]:
    """(the conversation of the session an input continues, its prompt, how: None, or
    ``repeated``, ``flattened``, as counted in the notes); a new conversation when the
    input extends none of ``mine``."""
    chain = max(
        (c for c in mine if text_in.startswith(c.last_input)),
        key=lambda c: len(c.last_input),
        default=None,
    )
    if chain is None:
        chain = _Chain(len(mine))
        mine.append(chain)
        return chain, text_in, None
    if text_in == chain.last_input:
        return chain, chain.last_prompt, "repeated"  # the same prompt sent again
    new = text_in[len(chain.last_input) :]
    out_head = chain.last_output.strip()[:200]
    if out_head and out_head in new:
        return chain, text_in, "flattened"  # the input is the flattened conversation already
    return chain, chain.prompt + new, None


def _request(
    sid: str, ts_us: int, line: int, chain: _Chain, n_in: int, hashes: list[int], n_out: int
) -> Request:
    """A row continuing ``chain``; an empty output is sent as 1 token (estimated)."""
    r = Request(
        session=sid,
        key=(ts_us, line),
        parent_key=chain.last.key if chain.last is not None else None,
        arrival_abs_ns=ts_us * 1000,
        input_tokens=n_in,
        output_tokens=max(n_out, 1),
        hash_ids=hashes,
        api="chat",
        output_estimated=True if n_out == 0 else None,
    )
    r.extra["chain"] = chain.number
    return r


_NOTES = {
    "flattened": "{n} rows whose input already holds the conversation (kept as is)",
    "repeated": "{n} rows repeat their conversation's last input: sent with the same prompt again",
    "no_output": "{n} rows with an empty output (not logged by the source): replayed with 1 "
    "output token (output_estimated)",
    "interleaved": "{n} sessions interleave several LLMs: one chain (agent_id) each",
    "by_content": "{n} rows wait for an earlier row whose output their input holds",
    "empty": "{n} rows with an empty input left out (not replayed as 0-token prompts)",
}
"""The counted notes of an import, in the order shown (a count of 0 is not shown)."""


def load(paths: list[Path], opts: ImportOptions) -> ImportResult:
    bs = opts.block_size or BLOCK_SIZE
    tokens = _Tokens(_tokenizer(opts.tokenizer), bs)
    reqs: list[Request] = []
    counts: Counter[str] = Counter()
    chains: dict[str, list[_Chain]] = {}
    outputs: dict[str, list[tuple[object, str]]] = {}  # per session, in time order
    for sid, ts_us, line, text_in, text_out in _read_rows(paths):
        if not text_in.strip():
            counts["empty"] += 1
            continue
        chain, prompt, kind = _place(chains.setdefault(sid, []), text_in)
        if kind is not None:
            counts[kind] += 1
        n_in, hashes = tokens.prompt(prompt)
        n_out = tokens.count(text_out)
        if n_out == 0:
            counts["no_output"] += 1
        r = _request(sid, ts_us, line, chain, n_in, hashes, n_out)
        earlier = outputs.setdefault(sid, [])
        r.extra["content_dep"] = content_dependency(text_in, earlier, r.parent_key)
        earlier.append((r.key, text_out))
        reqs.append(r)
        chain.advance(prompt, text_in, text_out, r)
    if not reqs:
        raise fail(paths[0], None, "every row has an empty input")
    counts["interleaved"] = _streams(reqs, chains)
    counts["by_content"] = _wait_for_outputs(reqs)
    table, start = build_table(reqs)
    meta = TraceMeta(
        block_size=bs,
        source=f"imported:{NAME}",
        start_wall_ns=start,
        content_mode="hashed",
        tokenizer=opts.tokenizer,
        extra={"imported_from": [p.name for p in paths]},
    )
    notes = [
        "prompts rebuilt from earlier inputs and outputs; hash ids from content",
        tokens.how(opts.tokenizer),
    ]
    notes += [note.format(n=counts[key]) for key, note in _NOTES.items() if counts[key]]
    return ImportResult(table, meta, NAME, notes)


class _Chain:
    """One conversation of a session: its prompt so far and its last row."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.prompt = ""
        self.last_prompt = ""
        self.last_input = ""
        self.last_output = ""
        self.last: Request | None = None

    def advance(self, prompt: str, text_in: str, text_out: str, r: Request) -> None:
        """Row ``r`` (sent as ``prompt``) continued the conversation."""
        self.prompt, self.last_prompt = prompt + text_out, prompt
        self.last_input, self.last_output, self.last = text_in, text_out, r


def _wait_for_outputs(reqs: list[Request]) -> int:
    """Add each row's content dependency (``extra["content_dep"]``, see
    ``content_dependency``) to what it waits for, its prefix parent included. Returns how
    many rows that gave a dependency they did not have."""
    added = 0
    for r in reqs:
        dep = r.extra.pop("content_dep", None)
        if dep is None:
            continue
        had = set(r.depends_on_keys or ())
        keys = had | {k for k in (r.parent_key, dep) if k is not None}
        added += keys != had
        r.depends_on_keys = sorted(keys, key=lambda k: k)  # type: ignore[arg-type,return-value]
    return added


def _streams(reqs: list[Request], chains: dict[str, list[_Chain]]) -> int:
    """Sessions where more than one chain continues: each chain becomes an agent stream
    depending on its own previous turn and on the session's previous row. Returns how many
    sessions that was."""
    multi = {sid for sid, cs in chains.items() if _continued(cs) > 1}
    prev_row: dict[str, Request] = {}
    for r in sorted(reqs, key=lambda r: r.arrival_abs_ns):
        if r.session not in multi:
            continue
        n = int(r.extra["chain"])  # type: ignore[call-overload]
        r.agent_id = "main" if n == 0 else f"llm-{n}"
        prev = prev_row.get(r.session)
        deps = {k for k in (r.parent_key, None if prev is None else prev.key) if k is not None}
        r.depends_on_keys = sorted(deps, key=lambda k: k)  # type: ignore[arg-type,return-value]
        prev_row[r.session] = r
    return len(multi)


def _continued(chains: list[_Chain]) -> int:
    """How many of a session's conversations have more than one row."""
    return sum(1 for c in chains if c.last is not None and c.last.parent_key is not None)
