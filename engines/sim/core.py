"""The simulated engine's scheduler and performance model: a sans-I/O state machine.

``EngineCore.step(start_ns)`` runs one engine step that starts at ``start_ns``: it picks
the batch (continuous batching up to ``max_num_seqs``, decode first, then chunked prefill
within the ``max_num_batched_tokens`` budget), returns the step's duration from the profile's
equations, and the tokens each request gets at the end of the step. It never reads a clock
and never sleeps; the server (``server.py``) sleeps to each step's deadline and writes.
Equations: docs/sim-engine.md.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_replay.engines.sim.prefix_cache import PrefixCache, block_hashes
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.engines.sim.stats import SimStats
from agent_replay.engines.sim.tokenizer import FIRST_WORD_ID

NS = 1e-9
FRONTEND_BATCH = 32
"""Most requests in one front-end batch (vLLM's ``AsyncMicrobatchTokenizer.max_batch_size``)."""


def request_seed(seed: int, key: str) -> int:
    """A per-request RNG seed from the server seed and a stable key (never Python's hash)."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class QueueFullError(Exception):
    """The waiting queue is at ``max_num_queued_reqs``."""


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the engine. ``sink`` is the server's stream object (opaque here)."""

    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    seed: int = 0
    arrival_ns: int = 0
    sink: Any = None
    known_cached: int = -1  # a prefix hit given from outside (a recorded run); -1: look it up
    # state, owned by the core
    rng: random.Random = field(init=False)
    hashes: list[int] = field(default_factory=list)
    ready_ns: int = 0  # arrival + the front end's time: the engine may schedule it from here
    prefill_target: int = 0  # tokens to (re)compute before the next token; prompt + generated
    computed_tokens: int = 0
    cached_tokens: int = -1  # prefix-cache hit of the first admission; -1 before admission
    num_generated: int = 0
    finish_reason: str | None = None
    scheduled_ns: int = -1
    first_token_ns: int = -1
    last_token_ns: int = -1
    stall_until_ns: int = 0
    num_preemptions: int = 0
    aborted: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.prefill_target = len(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        return self.computed_tokens < self.prefill_target


@dataclass(slots=True)
class Emission:
    request: SimRequest
    token_ids: list[int]
    finish_reason: str | None


@dataclass(slots=True)
class StepResult:
    start_ns: int
    end_ns: int
    emissions: list[Emission]
    prefill_tokens: int
    decode_seqs: int


class EngineCore:
    """Waiting queue, running batch, prefix cache and the step-time equations."""

    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.cache = PrefixCache(profile.prefix_cache_blocks, profile.block_size)
        self.stats = SimStats(
            max_model_len=profile.max_model_len, num_spec_positions=profile.num_speculative_tokens
        )
        self._blocks_in_use = 0
        self._last_start_ns = -1
        # the front end's latest batch: start, end, its requests
        self._fe_batch: tuple[int, int, list[SimRequest]] = (0, 0, [])
        self._fe_costs: list[int] = []  # the front-end cost of each request of that batch

    # admission ------------------------------------------------------------------------

    def add(self, req: SimRequest) -> None:
        """Queue a request (raises QueueFullError above ``max_num_queued_reqs``)."""
        limit = self.profile.max_num_queued_reqs
        if limit and len(self.waiting) >= limit:
            self.stats.admission_rejections += 1
            raise QueueFullError
        if self.profile.prefix_cache_blocks > 0 and not req.hashes:  # given: kept
            req.hashes = block_hashes(req.prompt_ids, self.profile.block_size)
        cost = self.profile.frontend_ns(req.prompt_len)
        req.ready_ns = self._frontend(req, cost) if cost else req.arrival_ns
        self.waiting.append(req)
        s = self.stats
        s.hists["request_params_max_tokens"].observe(req.max_tokens)
        s.hists["request_params_n"].observe(1)

    def _frontend(self, req: SimRequest, cost: int) -> int:
        """When ``req`` leaves the front end. The front end works one batch at a time (vLLM's
        API server tokenizes on one thread, in micro-batches of up to ``FRONTEND_BATCH``):
        a request that arrives while a batch is at work joins the next batch, which starts
        when that one ends and releases all its requests together. A batch costs its
        largest request's cost plus (1 - ``frontend_batch_overlap``) times the others'."""
        start, end, members = self._fe_batch
        if req.arrival_ns >= end or not members:  # idle: a batch of its own, now
            self._fe_batch = (req.arrival_ns, req.arrival_ns + cost, [req])
            self._fe_costs = [cost]
        elif req.arrival_ns >= start or len(members) >= FRONTEND_BATCH:  # at work: the next
            self._fe_batch = (end, end + cost, [req])
            self._fe_costs = [cost]
        else:  # the next batch has not started: join it
            costs = self._fe_costs
            costs.append(cost)
            top = max(costs)
            end = (
                start
                + top
                + round((1.0 - self.profile.frontend_batch_overlap) * (sum(costs) - top))
            )
            members.append(req)
            for member in members:
                member.ready_ns = end
            self._fe_batch = (start, end, members)
        return self._fe_batch[1]

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); it emits nothing more."""
        if req.finish_reason is not None:
            return
        req.aborted = True
        req.finish_reason = "abort"
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.stats.request_success["abort"] += 1

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def earliest_arrival_ns(self, default: int) -> int:
        """When the earliest waiting request became (or becomes) schedulable."""
        return min((r.ready_ns for r in self.waiting), default=default)

    def next_wakeup_ns(self) -> int | None:
        """After a step found nothing to run: the earliest time one could run (a stall
        ending, the waiting head leaving the front end); None to wait for a new request."""
        stalls = [r.stall_until_ns for r in self.running]
        if self.waiting:
            head = self.waiting[0].ready_ns
            if head <= self._last_start_ns:
                return None
            return min([head, *stalls])
        return min(stalls) if stalls else None

    # KV accounting ----------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        bs = self.profile.block_size
        return (tokens + bs - 1) // bs

    def kv_usage(self) -> float:
        used = sum(
            self._blocks(r.computed_tokens if r.in_prefill else self._context(r))
            for r in self.running
        )
        return min(1.0, used / self.profile.kv_cache_blocks)

    def _context(self, r: SimRequest) -> int:
        return r.prompt_len + r.num_generated

    # the step ---------------------------------------------------------------------------

    def step(self, start_ns: int) -> StepResult | None:
        """Run one step starting at ``start_ns``; None when nothing can run now."""
        p = self.profile
        k = p.num_speculative_tokens
        budget = p.max_num_batched_tokens
        self._last_start_ns = start_ns
        self._preempt_if_needed()
        decode = [r for r in self.running if not r.in_prefill and r.stall_until_ns <= start_ns]
        budget -= len(decode) * (1 + k)
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if budget <= 0:
                break
            if r.in_prefill and r.stall_until_ns <= start_ns:
                take = min(budget, r.prefill_target - r.computed_tokens)
                chunks.append((r, take))
                budget -= take
        used_blocks = -1
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            r = self.waiting[0]
            if r.ready_ns > start_ns:
                break
            need = self._blocks(r.prefill_target + 1)
            if used_blocks < 0:
                used_blocks = sum(self._blocks(self._context(x)) for x in self.running)
            if used_blocks + need > p.kv_cache_blocks and self.running:
                break
            self.waiting.popleft()
            used_blocks += need
            self._admit(r, start_ns)
            self.running.append(r)
            take = min(budget, r.prefill_target - r.computed_tokens)
            chunks.append((r, take))
            budget -= take
        if not decode and not chunks:
            return None
        prefill_tokens = sum(t for _, t in chunks)
        context = sum(r.prompt_len + r.num_generated for r in decode)
        prefill_ctx = sum(p.chunk_context(r.computed_tokens + t, t) for r, t in chunks)
        duration = p.decode_step_ns(len(decode), context) + p.prefill_ns(
            prefill_tokens, len(chunks), prefill_ctx
        )
        end_ns = start_ns + max(1, duration)
        emissions: list[Emission] = []
        s = self.stats
        s.steps += 1
        step_tokens = prefill_tokens
        for r, take in chunks:
            r.computed_tokens += take
            if not r.in_prefill:
                if r.num_generated == 0:
                    self.cache.insert(r.hashes)
                ids, reason = self._sample(r, 1)
                emissions.append(self._emit(r, ids, reason, end_ns))
        for r in decode:
            n = 1
            if k:
                n += self._speculate(r)
            step_tokens += 1 + k
            ids, reason = self._sample(r, n)
            emissions.append(self._emit(r, ids, reason, end_ns))
        s.hists["iteration_tokens_total"].observe(step_tokens)
        if any(e.finish_reason for e in emissions):
            self.running = [r for r in self.running if r.finish_reason is None]
        return StepResult(start_ns, end_ns, emissions, prefill_tokens, len(decode))

    def _admit(self, r: SimRequest, now_ns: int) -> None:
        bs = self.profile.block_size
        target = r.prefill_target
        hit_tokens = 0
        if r.known_cached >= 0:
            hit_tokens = min(r.known_cached, target - 1) if r.cached_tokens < 0 else 0
        elif self.profile.prefix_cache_blocks > 0:
            # at least one token is always computed: the hit stops before the last token
            max_blocks = min(len(r.hashes), (target - 1) // bs)
            hit_tokens = self.cache.match(r.hashes, max_blocks) * bs
        r.computed_tokens = hit_tokens
        s = self.stats
        s.prefix_cache_queries += target
        s.prefix_cache_hits += hit_tokens
        if r.cached_tokens < 0:
            r.cached_tokens = hit_tokens
            r.scheduled_ns = now_ns
            s.hists["request_queue_time_seconds"].observe(max(0, now_ns - r.arrival_ns) * NS)

    def _preempt_if_needed(self) -> None:
        """Preempt the newest running request while the KV cache cannot hold the next step."""
        p = self.profile
        grow = 1 + p.num_speculative_tokens
        bs = p.block_size
        running = self.running
        # cheap bound first: ceil(x / bs) <= x / bs + 1
        total = sum(r.prompt_len + r.num_generated for r in running)
        if total + len(running) * (grow + bs) <= p.kv_cache_blocks * bs:
            return
        while len(running) > 1:
            need = sum(self._blocks(self._context(r) + grow) for r in running)
            if need <= p.kv_cache_blocks:
                return
            victim = running.pop()
            victim.num_preemptions += 1
            victim.computed_tokens = 0
            victim.prefill_target = self._context(victim)
            self.stats.num_preemptions += 1
            self.waiting.appendleft(victim)

    def _speculate(self, r: SimRequest) -> int:
        """Draft positions accepted this step (each needs all before it accepted)."""
        s = self.stats
        s.spec_num_drafts += 1
        s.spec_num_draft_tokens += self.profile.num_speculative_tokens
        accepted = 0
        rnd = r.rng.random
        for i, prob in enumerate(self.profile.spec_acceptance):
            if rnd() >= prob:
                break
            s.spec_accepted_per_pos[i] += 1
            accepted += 1
        s.spec_num_accepted_tokens += accepted
        return accepted

    def _sample(self, r: SimRequest, n: int) -> tuple[list[int], str | None]:
        p = self.profile
        n = min(n, r.max_tokens - r.num_generated)
        rnd = r.rng.random
        ids: list[int] = []
        lo, span = FIRST_WORD_ID, p.vocab_size - FIRST_WORD_ID
        check_eos = not r.ignore_eos and p.eos_prob > 0
        for _ in range(n):
            if check_eos and len(ids) + r.num_generated >= r.min_tokens and rnd() < p.eos_prob:
                ids.append(p.eos_token_id)
                r.num_generated += len(ids)
                return ids, "stop"
            ids.append(lo + int(rnd() * span))
        r.num_generated += len(ids)
        if r.num_generated >= r.max_tokens:
            return ids, "length"
        return ids, None

    def _emit(self, r: SimRequest, ids: list[int], reason: str | None, t_ns: int) -> Emission:
        s = self.stats
        h = s.hists
        s.generation_tokens += len(ids)
        if r.first_token_ns < 0:
            r.first_token_ns = t_ns
            s.prompt_tokens += r.prompt_len
            s.prompt_tokens_cached += r.cached_tokens
            s.prompt_tokens_computed += r.prompt_len - r.cached_tokens
            h["time_to_first_token_seconds"].observe((t_ns - r.arrival_ns) * NS)
            h["request_prefill_time_seconds"].observe((t_ns - r.scheduled_ns) * NS)
            h["request_prefill_kv_computed_tokens"].observe(r.prompt_len - r.cached_tokens)
        else:
            h["inter_token_latency_seconds"].observe((t_ns - r.last_token_ns) * NS)
        r.last_token_ns = t_ns
        if reason is not None:
            r.finish_reason = reason
            s.request_success[reason] += 1
            h["e2e_request_latency_seconds"].observe((t_ns - r.arrival_ns) * NS)
            h["request_inference_time_seconds"].observe((t_ns - r.scheduled_ns) * NS)
            h["request_decode_time_seconds"].observe((t_ns - r.first_token_ns) * NS)
            if r.num_generated > 1:
                h["request_time_per_output_token_seconds"].observe(
                    (t_ns - r.first_token_ns) * NS / (r.num_generated - 1)
                )
            h["request_prompt_tokens"].observe(r.prompt_len)
            h["request_generation_tokens"].observe(r.num_generated)
            h["request_max_num_generation_tokens"].observe(r.max_tokens)
            h["request_num_preemptions"].observe(r.num_preemptions)
        return Emission(r, ids, reason)
