"""The simulated engine's parameters: one JSON profile per simulated deployment.

Every number here is a model parameter, not a measurement: the shipped profiles derive
their decode step times from first principles (bytes read per decode step divided by an
assumed memory bandwidth), and say so in their ``notes`` field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agent_replay.errors import InputError

PROFILE_NAMES = ("default", "fast", "mtp")


@dataclass(frozen=True, slots=True)
class SimProfile:
    """Parameters of the simulated engine's performance model (see docs/sim-engine.md)."""

    name: str = "custom"
    model_name: str = "sim-model"
    notes: str = ""
    # scheduler
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    max_num_queued_reqs: int = 0  # 0: unlimited; above it new requests get HTTP 503
    # KV cache and prefix cache
    block_size: int = 16
    kv_cache_blocks: int = 65536  # total KV capacity in blocks (kv_cache_usage_perc, preemption)
    prefix_cache_blocks: int = 32768  # LRU capacity of the prefix cache, in blocks; 0 disables
    # step time model, all in nanoseconds
    prefill_tokens_per_s: float = 20000.0
    decode_base_ns: int = 10_000_000
    decode_per_seq_ns: int = 20_000
    decode_per_ctx_token_ns: float = 0.1
    # prefill cost in the step beyond the new tokens: per request prefilled, per context token
    prefill_base_ns: int = 0
    prefill_per_ctx_token_ns: float = 0.0
    # a chunk of q new tokens counts its context times min(1, q / this) (0: always whole)
    prefill_ctx_full_chunk: int = 0
    # the server's front end (HTTP, prompt processing) before the engine sees a request
    frontend_base_ns: int = 0
    frontend_per_prompt_token_ns: float = 0.0
    # a front-end batch costs its largest request's cost + (1 - this) x the others' costs
    frontend_batch_overlap: float = 0.0
    # speculative decoding: per-position conditional acceptance probabilities
    num_speculative_tokens: int = 0
    spec_acceptance: tuple[float, ...] = ()
    # sampling
    vocab_size: int = 32000
    eos_token_id: int = 2
    eos_prob: float = 0.002  # chance per token of a natural stop (without ignore_eos)
    # timing of the engine loop
    spin_ns: int = 1_500_000  # sleep to (deadline - spin_ns), then yield-spin to the deadline
    rebase_ns: int = 50_000_000  # if the loop falls behind by more than this, restart the schedule
    # fault injection applied to every request (same syntax as the X-Sim-Fault header)
    faults: str = ""
    enable_prompt_tokens_details: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "block_size",
            "kv_cache_blocks",
            "vocab_size",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.prefill_tokens_per_s <= 0:
            problems.append("prefill_tokens_per_s must be > 0")
        for name in (
            "decode_base_ns",
            "decode_per_seq_ns",
            "decode_per_ctx_token_ns",
            "max_num_queued_reqs",
            "prefix_cache_blocks",
            "spin_ns",
            "frontend_base_ns",
            "frontend_per_prompt_token_ns",
            "prefill_base_ns",
            "prefill_per_ctx_token_ns",
            "prefill_ctx_full_chunk",
            "num_speculative_tokens",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if len(self.spec_acceptance) != self.num_speculative_tokens:
            problems.append(
                f"spec_acceptance needs {self.num_speculative_tokens} entries "
                f"(one per draft position), has {len(self.spec_acceptance)}"
            )
        if any(not 0.0 <= p <= 1.0 for p in self.spec_acceptance):
            problems.append("spec_acceptance entries must be within [0, 1]")
        if not 0.0 <= self.frontend_batch_overlap <= 1.0:
            problems.append("frontend_batch_overlap must be within [0, 1]")
        if not 0.0 <= self.eos_prob <= 1.0:
            problems.append("eos_prob must be within [0, 1]")
        if not 0 <= self.eos_token_id < self.vocab_size:
            problems.append("eos_token_id must be within [0, vocab_size)")
        if self.max_num_batched_tokens < self.max_num_seqs * (1 + self.num_speculative_tokens):
            problems.append("max_num_batched_tokens must cover one decode step of a full batch")
        if problems:
            raise InputError(f"sim profile {self.name!r}: " + "; ".join(problems))

    @property
    def expected_tokens_per_step(self) -> float:
        """Mean tokens one decode step emits per sequence: 1 + sum_i prod_{j<=i} a_j."""
        total, run = 1.0, 1.0
        for p in self.spec_acceptance:
            run *= p
            total += run
        return total

    def decode_step_ns(self, batch: int, context_tokens: int) -> int:
        """Decode step time for ``batch`` sequences holding ``context_tokens`` in total."""
        return int(
            self.decode_base_ns
            + self.decode_per_seq_ns * batch * (1 + self.num_speculative_tokens)
            + self.decode_per_ctx_token_ns * context_tokens
        )

    def frontend_ns(self, prompt_tokens: int) -> int:
        """Time from a request's arrival until the engine can schedule it."""
        return int(self.frontend_base_ns + self.frontend_per_prompt_token_ns * prompt_tokens)

    def chunk_context(self, context_end: int, chunk: int) -> float:
        """What a prefill chunk of ``chunk`` new tokens ending at ``context_end`` tokens adds
        to ``prefill_ns``'s ``context_tokens``: the context, times ``chunk /
        prefill_ctx_full_chunk`` for a chunk smaller than that."""
        full = self.prefill_ctx_full_chunk
        return context_end if full <= 0 or chunk >= full else context_end * chunk / full

    def prefill_ns(self, tokens: int, requests: int = 0, context_tokens: float = 0) -> int:
        """Prefill time of ``tokens`` new tokens in ``requests`` chunks whose contexts (cached
        and new tokens up to each chunk's end) add up to ``context_tokens``."""
        return int(
            tokens * 1e9 / self.prefill_tokens_per_s
            + self.prefill_base_ns * requests
            + self.prefill_per_ctx_token_ns * context_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["spec_acceptance"] = list(self.spec_acceptance)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> SimProfile:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in data if k not in known and not k.startswith("_"))
        if unknown:
            raise InputError(f"sim profile {source}: unknown field(s) {', '.join(unknown)}")
        kwargs = {k: v for k, v in data.items() if k in known}
        if "spec_acceptance" in kwargs:
            kwargs["spec_acceptance"] = tuple(float(p) for p in kwargs["spec_acceptance"])
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise InputError(f"sim profile {source}: {exc}") from exc

    @classmethod
    def load(cls, name_or_path: str | Path) -> SimProfile:
        """A shipped profile by name (``default``, ``fast``, ``mtp``) or a JSON file."""
        text: str
        source = str(name_or_path)
        if isinstance(name_or_path, str) and name_or_path in PROFILE_NAMES:
            text = (
                resources.files("agent_replay.engines.sim") / "profiles" / f"{name_or_path}.json"
            ).read_text()
        else:
            path = Path(name_or_path)
            if not path.is_file():
                raise InputError(
                    f"sim profile {source}: no such file (shipped profiles: {', '.join(PROFILE_NAMES)})"
                )
            text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"sim profile {source}: invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InputError(f"sim profile {source}: expected a JSON object")
        return cls.from_dict(data, source=source)

    def replace(self, **changes: Any) -> SimProfile:
        return dataclasses.replace(self, **changes)
