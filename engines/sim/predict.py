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

from agent_replay.engines.sim.core import EngineCore, SimRequest, StepResult
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError

BLOCK = 16
"""vLLM's default KV block size: a prefix hit is a whole number of blocks."""


def prefix_hits(
    rows: list[dict[str, Any]],
    cached_below_ns_per_token: float | None = None,
    served: dict[Any, int] | None = None,
) -> list[int]:
    """Each row's prefix-cache hit in tokens.

    With ``served`` (``server_cache.served_prompts``: what the server computed before the
    run, (session, clone, request index) -> prompt tokens), the server's cache is known:
    a row's hit is the server-reported ``cached_tokens`` where recorded, else vLLM's
    block rule on what the server had computed by then (``served_hit``).

    Without it: the recorded hit (``implied_cached_tokens``, else ``cached_tokens``);
    where neither was recorded, the previous request of the same session (in send order)
    is assumed cached whole, in full blocks, when this prompt is at least as long (no
    eviction), else the hit is 0. A session's first request without a recorded hit meets
    whatever the server's cache held when the run began: with
    ``cached_below_ns_per_token``, such a request whose measured TTFT per prompt token was
    below it is taken as cached whole (``cache_split`` finds the value), else as cold."""
    order = sorted(
        (i for i, r in enumerate(rows) if r.get("sent_ns") is not None),
        key=lambda i: rows[i]["sent_ns"],
    )
    if served is not None:
        return _served_hits(rows, order, served)
    last_prompt: dict[Any, int] = {}
    hits = [0] * len(rows)
    for i in order:
        r = rows[i]
        prompt = int(r.get("prompt_tokens") or 0)
        rec = _recorded_hit(r)
        if rec is None:
            prev = last_prompt.get(r["session_id"])
            if prev is None and _cached_start(r, cached_below_ns_per_token):
                prev = prompt - 1
            rec = (prev // BLOCK) * BLOCK if prev is not None and prev <= prompt else 0
        hits[i] = min(int(rec), max(0, prompt - 1))
        last_prompt[r["session_id"]] = prompt
    return hits


def _key(row: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (row["session_id"], row.get("clone"), row.get("request_index"))


def served_hit(served: dict[Any, int], key: tuple[Any, Any, Any], prompt: int) -> int:
    """vLLM's prefix-cache hit of a prompt of ``prompt`` tokens (request ``key``: session,
    clone, request index) on a server that computed the prompts in ``served``: the same
    request's prompt again is all of it but the last token; else the longest prompt
    computed of the same session and play that is no longer (a turn's prompt extends the
    turns before it; the output the server generated is not the recorded one, so only
    prompts are shared); in whole ``BLOCK``-token blocks."""
    if served.get(key) == prompt:
        hit = prompt - 1
    else:
        session, clone = key[0], key[1]
        hit = max(
            (
                p
                for (s2, c2, _), p in served.items()
                if s2 == session and c2 == clone and p <= prompt
            ),
            default=0,
        )
    return min((hit // BLOCK) * BLOCK, max(0, prompt - 1))


def _served_hits(rows: list[dict[str, Any]], order: list[int], served: dict[Any, int]) -> list[int]:
    """``prefix_hits`` on a known server cache: rows in send order, each one's prompt
    computed once it has its first token."""
    seen = dict(served)
    hits = [0] * len(rows)
    for i in order:
        r = rows[i]
        prompt = int(r.get("prompt_tokens") or 0)
        rec = r.get("cached_tokens")
        hits[i] = (
            min(int(rec), max(0, prompt - 1))
            if rec is not None
            else served_hit(seen, _key(r), prompt)
        )
        if r.get("first_token_ns") is not None and prompt:
            seen[_key(r)] = prompt
    return hits


def _recorded_hit(r: dict[str, Any]) -> int | None:
    rec = r.get("implied_cached_tokens")
    return r.get("cached_tokens") if rec is None else rec


def _ns_per_prompt_token(r: dict[str, Any]) -> float | None:
    if r.get("first_token_ns") is None or r.get("sent_ns") is None or not r.get("prompt_tokens"):
        return None
    return (int(r["first_token_ns"]) - int(r["sent_ns"])) / int(r["prompt_tokens"])


def _cached_start(r: dict[str, Any], below: float | None) -> bool:
    v = _ns_per_prompt_token(r)
    return below is not None and v is not None and v < below


def unrecorded_starts(rows: list[dict[str, Any]]) -> list[float]:
    """TTFT per prompt token (ns) of each session's first request (in send order) without a
    recorded hit: the requests whose hit ``prefix_hits`` cannot know."""
    seen: set[Any] = set()
    out = []
    for r in sorted((r for r in rows if r.get("sent_ns") is not None), key=lambda r: r["sent_ns"]):
        v = _ns_per_prompt_token(r)
        if r["session_id"] not in seen and _recorded_hit(r) is None and v is not None:
            out.append(v)
        seen.add(r["session_id"])
    return out


CACHE_SPLIT_RATIO = 4.0
"""Two regimes of TTFT per prompt token at least this far apart: cached and computed."""


def cache_split(ns_per_token: list[float]) -> float | None:
    """The value that parts cached from computed first requests (``unrecorded_starts``): the
    geometric middle of the widest gap between neighbouring sorted values, when that gap is
    a ratio of at least ``CACHE_SPLIT_RATIO`` (a prompt read from cache costs its front end
    only, one computed costs its prefill: an order of magnitude more per token); None when
    the values form one regime (all taken as cold)."""
    v = sorted(x for x in ns_per_token if x > 0)
    if len(v) < 2:
        return None
    ratio, j = max((v[i + 1] / v[i], i) for i in range(len(v) - 1))
    return (v[j] * v[j + 1]) ** 0.5 if ratio >= CACHE_SPLIT_RATIO else None


def cached_below(profile: SimProfile) -> float | None:
    """The fitted ``cache_split`` of a profile (``extra.fit.cached_below_ns_per_token``)."""
    v = (profile.extra.get("fit") or {}).get("cached_below_ns_per_token")
    return None if v is None else float(v)


def _arrival(row: dict[str, Any]) -> int:
    return int(row["sent_ns"]) + int(row["connect_ns"] or 0)


def _dependencies(
    rows: list[dict[str, Any]], live: list[int]
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Each live row's parents in the run and each row's children (``depends_on``)."""
    by_key = {(r["session_id"], r["clone"], r["request_index"]): i for i, r in enumerate(rows)}
    live_set = set(live)
    parents: dict[int, list[int]] = {}
    children: dict[int, list[int]] = {}
    for i in live:
        row = rows[i]
        found = [
            by_key.get((row["session_id"], row["clone"], d)) for d in (row["depends_on"] or [])
        ]
        ps = [p for p in found if p is not None and p in live_set]
        parents[i] = ps
        for parent in ps:
            children.setdefault(parent, []).append(i)
    return parents, children


def warmup_gates(
    rows: list[dict[str, Any]], live: list[int], parents: dict[int, list[int]], turns: int
) -> dict[int, list[int]]:
    """AgentX's phases as waits (``replay/agentx.py``): every stream's warm-up first; when
    the last of those has ended, each lane's ``turns`` warm-up turns back to back; when the
    last warm-up has ended, the measured phase, every lane at once. Returns, for each row
    that starts a phase, the rows it waits for: a lane's first warm-up turn waits for the
    stream warm-ups, and a measured request without a measured parent in the run waits for
    every warm-up. The lane's warm-up turns are its last ``turns`` warm-ups in send order
    that were sent after the stream warm-ups had all ended."""
    warm = [i for i in live if rows[i].get("warmup")]
    if not warm:
        return {}
    lanes: dict[tuple[Any, Any], list[int]] = {}
    for i in sorted(warm, key=lambda i: int(rows[i]["sent_ns"])):
        lanes.setdefault((rows[i]["session_id"], rows[i]["clone"]), []).append(i)
    first, second = _warmup_phases(rows, warm, lanes, turns)
    gates = _lane_gates(lanes, first, second)
    warm_set = set(warm)
    gates.update(
        {i: warm for i in live if i not in warm_set and all(p in warm_set for p in parents[i])}
    )
    return gates


def _lane_gates(
    lanes: dict[Any, list[int]], first: list[int], second: set[int]
) -> dict[int, list[int]]:
    """Each lane's first warm-up turn waits for every stream warm-up (``first``)."""
    if not first:
        return {}
    heads = (next((i for i in lane if i in second), None) for lane in lanes.values())
    return {i: first for i in heads if i is not None}


def _warmup_phases(
    rows: list[dict[str, Any]], warm: list[int], lanes: dict[Any, list[int]], turns: int
) -> tuple[list[int], set[int]]:
    """The stream warm-ups and the lanes' warm-up turns (``warmup_gates``): each lane's last
    ``turns`` warm-ups, those sent after every stream warm-up had ended."""
    second = {i for lane in lanes.values() for i in lane[max(0, len(lane) - turns) :]}
    first = [i for i in warm if i not in second]
    if not first:
        return first, second
    end1 = max(int(rows[i]["end_ns"]) for i in first)
    late = {i for i in second if int(rows[i]["sent_ns"]) >= end1}
    return [i for i in warm if i not in late], late


def _served(row: dict[str, Any]) -> bool:
    """A row the server answered: ok, with its first token, send time and prompt."""
    return (
        row["status"] == "ok"
        and row["first_token_ns"] is not None
        and row["sent_ns"] is not None
        and row["prompt_tokens"] is not None
    )


def _children(waits: dict[int, list[int]]) -> dict[int, list[int]]:
    """Who waits for each row: ``waits`` turned round, in row order."""
    children: dict[int, list[int]] = {}
    for i, parents in waits.items():
        for parent in parents:
            children.setdefault(parent, []).append(i)
    return children


class _Plan:
    """The closed loop of a recorded run on the engine: who is sent when, and what came back."""

    def __init__(
        self,
        profile: SimProfile,
        rows: list[dict[str, Any]],
        served: dict[Any, int] | None,
        warmup_turns: int | None = None,
    ) -> None:
        self.rows = rows
        self.core = EngineCore(profile)
        self.live = [i for i, r in enumerate(rows) if _served(r)]
        self.parents, _ = _dependencies(rows, self.live)
        # what each row waits for: its parents, or the phase it starts (warmup_gates)
        gates = (
            {}
            if warmup_turns is None
            else warmup_gates(rows, self.live, self.parents, warmup_turns)
        )
        self.waits = {i: gates.get(i, self.parents[i]) for i in self.live}
        self.children = _children(self.waits)
        self.hits = prefix_hits(rows, cached_below(profile), served)
        self.pred_end: dict[int, int] = {}
        self.pred_send: dict[int, int] = {}
        self.chunks: dict[int, tuple[list[int], list[int]]] = {i: ([], []) for i in self.live}
        self.arrivals: list[tuple[int, int]] = []
        for i in self.live:
            if not self.waits[i]:
                self.pred_send[i] = _arrival(rows[i])
                heapq.heappush(self.arrivals, (self.pred_send[i], i))

    def admit(self, now: int) -> None:
        while self.arrivals and self.arrivals[0][0] <= now:
            t, i = heapq.heappop(self.arrivals)
            r = self.rows[i]
            self.core.add(
                SimRequest(
                    request_id=str(i),
                    prompt_ids=range(int(r["prompt_tokens"])),
                    max_tokens=max(1, int(r["completion_tokens"] or 1)),
                    ignore_eos=True,
                    seed=i,
                    arrival_ns=t,
                    known_cached=self.hits[i],
                )
            )

    def finished(self, i: int, end_ns: int) -> None:
        """Request i ended: send each row whose waits (parents, or the phase before it) have
        all ended, its recorded time after the last of them."""
        self.pred_end[i] = end_ns
        for c in self.children.get(i, []):
            if all(p in self.pred_end for p in self.waits[c]):
                r = self.rows[c]
                gap = _arrival(r) - max(int(self.rows[p]["end_ns"]) for p in self.waits[c])
                self.pred_send[c] = max(self.pred_end[p] for p in self.waits[c]) + gap
                heapq.heappush(self.arrivals, (self.pred_send[c], c))

    def run(self) -> None:
        core, now = self.core, 0
        while self.arrivals or core.has_work():
            if not core.has_work() and self.arrivals:
                now = max(now, self.arrivals[0][0])
            self.admit(now)
            res = core.step(now)
            if res is None:
                now = self._wake(now)
                continue
            self._record(res)
            now = res.end_ns

    def _wake(self, now: int) -> int:
        """Nothing could run at ``now``: the next instant something can."""
        nxt = [
            x
            for x in (self.core.next_wakeup_ns(), self.arrivals[0][0] if self.arrivals else None)
            if x is not None
        ]
        if not nxt:
            raise InputError("prediction stalled: the engine cannot schedule the waiting requests")
        return max(now + 1, min(nxt))

    def _record(self, res: StepResult) -> None:
        for em in res.emissions:
            i = int(em.request.request_id)
            cs, ks = self.chunks[i]
            cs.append(res.end_ns)
            ks.append(len(em.token_ids))
            if em.finish_reason is not None:
                self.finished(i, res.end_ns)

    def row(self, i: int) -> dict[str, Any]:
        """Row i with its timing replaced by the prediction's (as recorded if not predicted)."""
        r = dict(self.rows[i])
        if i not in self.pred_end:
            return r
        shift = self.pred_send[i] - _arrival(self.rows[i])
        cs, ks = self.chunks[i]
        r["intended_ns"] = int(r["intended_ns"]) + shift
        r["sent_ns"] = int(r["sent_ns"]) + shift
        if r["headers_ns"] is not None:
            r["headers_ns"] = min(int(r["headers_ns"]) + shift, cs[0])
        r.update(first_token_ns=cs[0], end_ns=cs[-1], chunk_ns=cs, chunk_tokens=ks)
        if self.parents.get(i):
            r["parent_end_ns"] = max(self.pred_end[p] for p in self.parents[i])
        return r


def simulate_rows(
    profile: SimProfile,
    rows: list[dict[str, Any]],
    served: dict[Any, int] | None = None,
    warmup_turns: int | None = None,
) -> list[dict[str, Any]]:
    """The rows with their timing replaced by the engine's on a virtual clock (``served``:
    what the server had served before the run, ``server_cache.served_prompts``;
    ``warmup_turns``: an AgentX run's ``warmup_requests``, whose phases ``warmup_gates``
    keeps; None for another run, whose warm-up is a time window with no phases)."""
    # the hits are given (prefix_hits): the engine's own prefix cache is not consulted
    plan = _Plan(profile.replace(eos_prob=0.0, prefix_cache_blocks=0), rows, served, warmup_turns)
    plan.run()
    return [plan.row(i) for i in range(len(rows))]


def predict_run(
    profile: SimProfile, source: str | Path, out: str | Path, *, profile_label: str = ""
) -> Path:
    """Write the prediction of the run in ``source`` to the results folder ``out``. The
    run's KV capacity (``vllm:cache_config_info`` in its /metrics series) replaces the
    profile's: it is a setting of the deployment that ran it."""
    source, out = Path(source), Path(out)
    req_dir = source / "requests"
    if not req_dir.is_dir() or not (source / "run.json").is_file():
        raise InputError(f"{source}: not a results folder (needs run.json and requests/)")
    from agent_replay.engines.sim.fit import cache_config
    from agent_replay.engines.sim.server_cache import served_prompts

    cache = cache_config(source)  # the run's own KV capacity: a setting of its deployment
    if cache:
        profile = profile.replace(
            kv_cache_blocks=cache["num_gpu_blocks"], block_size=cache["block_size"]
        )
    table = pq.read_table(req_dir)
    meta = json.loads((source / "run.json").read_text())
    agentx = (meta.get("options") or {}).get("agentx")
    turns = int(agentx.get("warmup_requests") or 0) if agentx else None
    rows = simulate_rows(profile, table.to_pylist(), served_prompts(source), turns)
    if out.exists():
        shutil.rmtree(out)
    (out / "requests").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=table.schema), out / "requests" / "part-000-00000.parquet"
    )
    meta = json.loads((source / "run.json").read_text())
    meta["prediction"] = {
        "engine": "sim",
        "profile": profile_label or profile.name,
        "source_run": str(source),
        "clock": "virtual",
        "note": "a prediction of the simulated engine, not a measurement",
    }
    meta.pop("gpu_telemetry", None)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out
