"""mini-swe-agent's recorded prefix reuse at block size 64, taken apart: one recording
(content full) through the recorder of this checkout; its prompts hashed again by the
recorder of an older checkout (BASE, e.g. ``git archive 0f51ec6 | tar -x -C BASE``), each
id list counted by the rule ``traces.stats.implied_cached_tokens`` had there (matched
blocks * block size, capped at the prompt) and by ``traces.stats.implied_hits`` (server
blocks; a partial block counts for what it filled); then, per request, the server's cached
tokens beside both and the previous prompt's tokens past its last whole block.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/recorded_prefix_cause.py BASE
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from agent_replay.traces.io import read_trace
from agent_replay.traces.stats import implied_hits

ROOT = Path(__file__).resolve().parents[1]
BS = 64
OLD_HASHER = """
import json, sys
from agent_replay.replay.record.content import PromptHasher
rows = json.load(open(sys.argv[1]))
h = PromptHasher(int(sys.argv[2]), 1)
out = [None] * len(rows)
for i in sorted(range(len(rows)), key=lambda i: rows[i]["arrival_ns"] + rows[i]["end_ns"]):
    r = rows[i]
    out[i] = h.hash_ids(r["api"], json.loads(r["content"]), r["input_tokens"])[0]
print(json.dumps(out))
"""


def old_rule(ids: list[list[int]], inputs: np.ndarray) -> np.ndarray:
    seen: set[int] = set()
    out = []
    for lst in ids:
        m = 0
        while m < len(lst) and lst[m] in seen:
            m += 1
        out.append(m * BS)
        seen.update(lst)
    return np.minimum(np.array(out), inputs)


def new_rule(ids: list[list[int]], inputs: np.ndarray) -> np.ndarray:
    lengths = np.array([len(lst) for lst in ids])
    flat = np.array([h for lst in ids for h in lst], np.int64)
    return implied_hits(lengths, flat, inputs, np.arange(len(ids)), BS)


def main() -> None:
    base = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "bench", ROOT / "benchmarks" / "bench_recorded_prefix.py"
    )
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tmp = Path(tempfile.mkdtemp(prefix="recorded-prefix-cause-"))
    trace = asyncio.run(bench.record("mini", bench.program("mini"), tmp, 4, BS))
    rows = sorted(read_trace(trace)[0].to_pylist(), key=lambda r: r["arrival_ns"])
    rows = [r for r in rows if r["error"] is None]
    (tmp / "rows.json").write_text(
        json.dumps(
            [
                {k: r[k] for k in ("api", "content", "input_tokens", "arrival_ns", "end_ns")}
                for r in rows
            ]
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", OLD_HASHER, str(tmp / "rows.json"), str(BS)],
        env={"PYTHONPATH": base},
        cwd=base,
        capture_output=True,
        text=True,
        check=True,
    )
    old_ids = json.loads(done.stdout)
    new_ids = [r["hash_ids"] for r in rows]
    inputs = np.array([r["input_tokens"] for r in rows])
    server = np.array([r["cached_tokens"] for r in rows])
    total = inputs.sum()
    print(f"server cached: {server.sum() / total:.1%}")
    for name, ids in (("recorder before", old_ids), ("recorder after", new_ids)):
        for rule, f in (("matched blocks", old_rule), ("server blocks", new_rule)):
            print(f"{name}, counted in {rule}: {f(ids, inputs).sum() / total:.1%}")
    print(
        "input | server cached | before, matched blocks | after, server blocks | "
        f"previous input % {BS}"
    )
    prev: int | None = None
    for r, s, a, b in zip(
        rows, server, old_rule(old_ids, inputs), new_rule(new_ids, inputs), strict=True
    ):
        print(r["input_tokens"], s, a, b, "-" if prev is None else prev % BS, sep=" | ")
        prev = r["input_tokens"]


if __name__ == "__main__":
    main()
