"""What a real server's prefix cache already held when a recorded run began.

Runs of a ladder replay the same sessions one after another on one vLLM server, and vLLM
keeps the blocks of every finished request in its prefix cache until it needs the room.
So a run's request may read its whole prompt from the cache because an earlier run (with
the same prompt salt) sent the same request: the rows of that run say nothing of it.

Which runs went before on the same server comes from the server's own counter:
``vllm:prefix_cache_queries_total`` (prompt tokens looked up since the server started) at
a run's first scrape equals its value at the last scrape of the run just before it on the
same server, and is below one prompt of the run on a server that had served nothing before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

QUERIES = "vllm:prefix_cache_queries_total"
Key = tuple[Any, Any, Any]


def queries_span(folder: str | Path) -> tuple[float, float] | None:
    """``vllm:prefix_cache_queries_total`` at a run's first and last scrape; None when the
    run has no such series."""
    path = Path(folder) / "server_metrics.parquet"
    if not path.is_file():
        return None
    t = pq.read_table(path, columns=["t_ns", "name", "value"]).to_pydict()
    pts = sorted(
        (ts, v) for ts, n, v in zip(t["t_ns"], t["name"], t["value"], strict=True) if n == QUERIES
    )
    return (pts[0][1], pts[-1][1]) if pts else None


def _salt(folder: Path) -> Any:
    try:
        return json.loads((folder / "run.json").read_text()).get("salt")
    except (OSError, json.JSONDecodeError):
        return None


def sibling_runs(folder: str | Path) -> list[Path]:
    """The results folders beside ``folder`` in a sweep's layout (``PROFILE/POINT/REPEAT``):
    the runs that may have gone before it on the same server."""
    folder = Path(folder)
    return sorted(p.parent for p in folder.parent.parent.glob("*/*/run.json"))


def earlier_runs(folder: str | Path, candidates: list[Path] | None = None) -> list[Path] | None:
    """The runs served before ``folder`` by the same server, oldest first: each one's last
    ``QUERIES`` value equals the next one's first. None when that chain does not reach a
    run that began on a server that had served less than one of its prompts (the cache
    before it is then unknown)."""
    folder = Path(folder)
    pool = sibling_runs(folder) if candidates is None else [Path(c) for c in candidates]
    ends: dict[float, Path] = {}
    for other in pool:
        span = queries_span(other)
        if span is not None and other.resolve() != folder.resolve():
            ends.setdefault(span[1], other)
    chain: list[Path] = []
    cur = folder
    while True:
        span = queries_span(cur)
        if span is None:
            return None
        if span[0] < _smallest_prompt(cur):
            return chain[::-1]
        prev = ends.pop(span[0], None)
        if prev is None:
            return None
        chain.append(prev)
        cur = prev


def _smallest_prompt(folder: Path) -> float:
    t = pq.read_table(folder / "requests", columns=["prompt_tokens"]).column(0).to_pylist()
    return min((p for p in t if p), default=0)


def served_prompts(
    folder: str | Path, candidates: list[Path] | None = None
) -> dict[Key, int] | None:
    """The prompts the server had computed before ``folder`` began, with the run's prompt
    salt: (session, clone, request index) -> prompt tokens, from every earlier run on the
    same server (``earlier_runs``) with the same salt (another salt makes other prompts).
    None when the earlier runs are unknown."""
    folder = Path(folder)
    runs = earlier_runs(folder, candidates)
    if runs is None:
        return None
    salt = _salt(folder)
    seen: dict[Key, int] = {}
    for run in runs:
        if _salt(run) != salt:
            continue
        cols = ["session_id", "clone", "request_index", "prompt_tokens", "first_token_ns"]
        rows = pq.read_table(run / "requests", columns=cols).to_pylist()
        for row in rows:
            if row["first_token_ns"] is not None and row["prompt_tokens"]:
                seen[(row["session_id"], row["clone"], row["request_index"])] = int(
                    row["prompt_tokens"]
                )
    return seen
