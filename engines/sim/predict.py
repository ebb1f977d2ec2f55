"""Predict a recorded run with the simulated engine on a virtual clock.

The run's own rows are its plan: every request with its prompt tokens, its prefix hit and
its output length, and the dependencies between them. A request whose parent is in the
run is sent its measured think time after the parent's *predicted* end (closed loop, as
the replay sends it); one without is sent at its measured send time. The engine core
(``engines/sim/core.py``) steps on virtual time: no sockets, no sleeping.

The prediction is written as a results folder of the real format (the measured rows with
their timing columns replaced, and run.json marked ``prediction``), so ``agent-replay
report`` computes its figures with the same code as the measured run's.
"""

from __future__ import annotations

import heapq
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agent_replay.engines.sim.core import EngineCore, SimRequest
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError

BLOCK = 16
"""vLLM's default KV block size: a prefix hit is a whole number of blocks."""


def prefix_hits(rows: list[dict[str, Any]]) -> list[int]:
    """Each row's prefix-cache hit in tokens: the recorded one (``implied_cached_tokens``,
    else ``cached_tokens``); where neither was recorded, the previous request of the same
    session (in send order) is assumed cached whole, in full blocks, when this prompt is
    at least as long (no eviction), else the hit is 0."""
    order = sorted((i for i, r in enumerate(rows) if r.get("sent_ns") is not None),
                   key=lambda i: rows[i]["sent_ns"])
    last_prompt: dict[Any, int] = {}
    hits = [0] * len(rows)
    for i in order:
        r = rows[i]
        prompt = int(r.get("prompt_tokens") or 0)
        rec = r.get("implied_cached_tokens")
        if rec is None:
            rec = r.get("cached_tokens")
        if rec is None:
            prev = last_prompt.get(r["session_id"])
            rec = (prev // BLOCK) * BLOCK if prev is not None and prev <= prompt else 0
        hits[i] = min(int(rec), max(0, prompt - 1))
        last_prompt[r["session_id"]] = prompt
    return hits


def _arrival(row: dict[str, Any]) -> int:
    return int(row["sent_ns"]) + int(row["connect_ns"] or 0)


def simulate_rows(profile: SimProfile, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their timing replaced by the engine's on a virtual clock."""
    # the hits are given (prefix_hits): the engine's own prefix cache is not consulted
    profile = profile.replace(eos_prob=0.0, prefix_cache_blocks=0)
    core = EngineCore(profile)
    by_key = {(r["session_id"], r["clone"], r["request_index"]): i for i, r in enumerate(rows)}
    live = [i for i, r in enumerate(rows) if r["status"] == "ok" and r["first_token_ns"] is not None
            and r["sent_ns"] is not None and r["prompt_tokens"] is not None]
    live_set = set(live)
    parents: dict[int, list[int]] = {}
    children: dict[int, list[int]] = {}
    for i in live:
        r = rows[i]
        found = [by_key.get((r["session_id"], r["clone"], d)) for d in (r["depends_on"] or [])]
        ps = [p for p in found if p is not None and p in live_set]
        parents[i] = ps
        for p in ps:
            children.setdefault(p, []).append(i)
    pred_end: dict[int, int] = {}
    pred_send: dict[int, int] = {}
    chunks: dict[int, tuple[list[int], list[int]]] = {i: ([], []) for i in live}
    arrivals: list[tuple[int, int]] = []
    for i in live:
        if not parents[i]:
            pred_send[i] = _arrival(rows[i])
            heapq.heappush(arrivals, (pred_send[i], i))
    reqs: dict[int, SimRequest] = {}
    hits = prefix_hits(rows)
    now = 0
    while arrivals or core.has_work():
        if not core.has_work() and arrivals:
            now = max(now, arrivals[0][0])
        while arrivals and arrivals[0][0] <= now:
            t, i = heapq.heappop(arrivals)
            r = rows[i]
            prompt = int(r["prompt_tokens"])
            req = SimRequest(request_id=str(i), prompt_ids=range(prompt),
                             max_tokens=max(1, int(r["completion_tokens"] or 1)),
                             ignore_eos=True, seed=i, arrival_ns=t, known_cached=hits[i])
            reqs[i] = req
            core.add(req)
        res = core.step(now)
        if res is None:
            wake = core.next_wakeup_ns()
            nxt = [x for x in (wake, arrivals[0][0] if arrivals else None) if x is not None]
            if not nxt:
                raise InputError("prediction stalled: the engine cannot schedule the waiting requests")
            now = max(now + 1, min(nxt))
            continue
        for em in res.emissions:
            i = int(em.request.request_id)
            cs, ks = chunks[i]
            cs.append(res.end_ns)
            ks.append(len(em.token_ids))
            if em.finish_reason is not None:
                pred_end[i] = res.end_ns
                for c in children.get(i, []):
                    if all(p in pred_end for p in parents[c]):
                        r = rows[c]
                        gap = _arrival(r) - max(int(rows[p]["end_ns"]) for p in parents[c])
                        pred_send[c] = max(pred_end[p] for p in parents[c]) + gap
                        heapq.heappush(arrivals, (pred_send[c], c))
        now = res.end_ns
    out = []
    for i, r in enumerate(rows):
        r = dict(r)
        if i in pred_end:
            shift = pred_send[i] - _arrival(rows[i])
            cs, ks = chunks[i]
            r["intended_ns"] = int(r["intended_ns"]) + shift
            r["sent_ns"] = int(r["sent_ns"]) + shift
            if r["headers_ns"] is not None:
                r["headers_ns"] = min(int(r["headers_ns"]) + shift, cs[0])
            r["first_token_ns"] = cs[0]
            r["end_ns"] = cs[-1]
            r["chunk_ns"] = cs
            r["chunk_tokens"] = ks
            if parents.get(i):
                r["parent_end_ns"] = max(pred_end[p] for p in parents[i])
        out.append(r)
    return out


def predict_run(profile: SimProfile, source: str | Path, out: str | Path, *,
                profile_label: str = "") -> Path:
    """Write the prediction of the run in ``source`` to the results folder ``out``. The
    run's KV capacity (``vllm:cache_config_info`` in its /metrics series) replaces the
    profile's: it is a setting of the deployment that ran it."""
    source, out = Path(source), Path(out)
    req_dir = source / "requests"
    if not req_dir.is_dir() or not (source / "run.json").is_file():
        raise InputError(f"{source}: not a results folder (needs run.json and requests/)")
    from agent_replay.engines.sim.fit import cache_config

    cache = cache_config(source)  # the run's own KV capacity: a setting of its deployment
    if cache:
        profile = profile.replace(kv_cache_blocks=cache["num_gpu_blocks"],
                                  block_size=cache["block_size"])
    table = pq.read_table(req_dir)
    rows = simulate_rows(profile, table.to_pylist())
    if out.exists():
        shutil.rmtree(out)
    (out / "requests").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema),
                   out / "requests" / "part-000-00000.parquet")
    meta = json.loads((source / "run.json").read_text())
    meta["prediction"] = {
        "engine": "sim", "profile": profile_label or profile.name,
        "source_run": str(source), "clock": "virtual",
        "note": "a prediction of the simulated engine, not a measurement",
    }
    meta.pop("gpu_telemetry", None)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out
