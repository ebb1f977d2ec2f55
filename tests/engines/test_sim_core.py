"""The performance model and scheduler, without sockets or clocks (hand-computed numbers)."""

from __future__ import annotations

import pytest

from agent_replay.engines.sim.core import EngineCore, QueueFullError, SimRequest, StepResult
from agent_replay.engines.sim.prefix_cache import PrefixCache, block_hashes
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError

BASE = SimProfile(
    name="t",
    max_num_seqs=4,
    max_num_batched_tokens=128,
    block_size=16,
    kv_cache_blocks=1000,
    prefix_cache_blocks=1000,
    prefill_tokens_per_s=1e6,
    decode_base_ns=1_000_000,
    decode_per_seq_ns=100_000,
    decode_per_ctx_token_ns=10.0,
    eos_prob=0.0,
)


def req(
    n_prompt: int, max_tokens: int, *, first: int = 1000, rid: str = "r", **kw: object
) -> SimRequest:
    return SimRequest(
        request_id=rid,
        prompt_ids=list(range(first, first + n_prompt)),
        max_tokens=max_tokens,
        ignore_eos=True,
        **kw,
    )  # type: ignore[arg-type]


def run(core: EngineCore, t: int = 0, limit: int = 10_000) -> list[StepResult]:
    out = []
    for _ in range(limit):
        res = core.step(t)
        if res is None:
            break
        out.append(res)
        t = res.end_ns
    return out


def test_single_request_step_times_follow_the_equations() -> None:
    core = EngineCore(BASE)
    r = req(100, 3)
    core.add(r)
    steps = run(core)
    # prefill 100 tokens: base 1 ms + 100 tokens at 1 us = 1.1 ms; first token at its end
    assert steps[0].end_ns == 1_100_000
    assert [len(e.token_ids) for e in steps[0].emissions] == [1]
    # decode with 1 seq, context 101 then 102: 1 ms + 100 us + 10 ns * context
    assert steps[1].end_ns - steps[1].start_ns == 1_101_010
    assert steps[2].end_ns - steps[2].start_ns == 1_101_020
    assert steps[2].emissions[0].finish_reason == "length"
    assert len(steps) == 3 and r.num_generated == 3
    assert not core.has_work()


def test_chunked_prefill_respects_the_token_budget() -> None:
    core = EngineCore(BASE)
    core.add(req(300, 1))
    steps = run(core)
    assert [s.prefill_tokens for s in steps] == [128, 128, 44]
    assert [len(s.emissions) for s in steps] == [0, 0, 1]
    assert steps[0].end_ns == 1_000_000 + 128_000


def test_continuous_batching_caps_running_at_max_num_seqs() -> None:
    core = EngineCore(BASE.replace(max_num_seqs=2))
    for i in range(3):
        core.add(req(10, 2, first=1000 + 100 * i, rid=str(i)))
    s1 = core.step(0)
    assert s1 is not None and len(core.running) == 2 and len(core.waiting) == 1
    # decode of the two (1 token each, finishing) runs before the third is admitted
    s2 = core.step(s1.end_ns)
    assert s2 is not None and s2.decode_seqs == 2
    assert {e.finish_reason for e in s2.emissions} == {"length"}
    s3 = core.step(s2.end_ns)
    assert s3 is not None and s3.prefill_tokens == 10 and not core.waiting


def test_decode_step_grows_with_batch_and_context() -> None:
    p = BASE
    assert p.decode_step_ns(1, 0) == 1_100_000
    assert p.decode_step_ns(4, 1000) == 1_000_000 + 400_000 + 10_000
    spec = BASE.replace(num_speculative_tokens=3, spec_acceptance=(0.5, 0.5, 0.5))
    assert spec.decode_step_ns(2, 0) == 1_000_000 + 2 * 4 * 100_000


def test_prefix_cache_skips_cached_prefill_but_always_computes_one_token() -> None:
    core = EngineCore(BASE.replace(max_num_batched_tokens=4096))
    a = req(160, 1, rid="a")  # exactly 10 blocks
    core.add(a)
    first = run(core)
    assert a.cached_tokens == 0 and first[0].prefill_tokens == 160
    b = req(160, 1, rid="b")
    core.add(b)
    second = run(core)
    # the last block is not a hit: at most (160 - 1) // 16 = 9 blocks = 144 tokens
    assert b.cached_tokens == 144 and second[0].prefill_tokens == 16
    assert second[0].end_ns - second[0].start_ns == 1_000_000 + 16_000
    c = req(170, 1, rid="c")  # 10 full blocks + 10 tokens: all 10 blocks hit
    core.add(c)
    run(core)
    assert c.cached_tokens == 160
    assert core.stats.prefix_cache_queries == 160 + 160 + 170
    assert core.stats.prefix_cache_hits == 144 + 160


def test_prefix_cache_is_an_lru_with_a_capacity_in_blocks() -> None:
    cache = PrefixCache(capacity_blocks=3, block_size=2)
    a = block_hashes([1, 2, 3, 4, 5, 6], 2)  # 3 blocks
    b = block_hashes([9, 9, 9, 9], 2)  # 2 blocks
    assert len(a) == 3 and len(block_hashes([1, 2, 3], 2)) == 1
    assert block_hashes([1, 2, 3, 4], 2) == a[:2]  # chained: a prefix has the same hashes
    cache.insert(a)
    assert cache.match(a, 3) == 3
    cache.insert(b)  # evicts the two least recently used blocks of a
    assert len(cache) == 3
    assert cache.match(a, 3) == 0  # a[0] is gone, so nothing after it counts
    assert cache.match(b, 2) == 2
    assert PrefixCache(0, 2).match(a, 3) == 0


def test_speculative_decoding_emits_accepted_plus_one_tokens_per_step() -> None:
    always = BASE.replace(num_speculative_tokens=3, spec_acceptance=(1.0, 1.0, 1.0))
    core = EngineCore(always)
    core.add(req(10, 9))
    steps = run(core)
    assert [len(e.token_ids) for s in steps for e in s.emissions] == [1, 4, 4]
    st = core.stats
    assert st.spec_num_drafts == 2 and st.spec_num_draft_tokens == 6
    assert st.spec_num_accepted_tokens == 6 and st.spec_accepted_per_pos == [2, 2, 2]
    never = BASE.replace(num_speculative_tokens=2, spec_acceptance=(0.0, 1.0))
    core = EngineCore(never)
    core.add(req(10, 5))
    assert [len(e.token_ids) for s in run(core) for e in s.emissions] == [1, 1, 1, 1, 1]


def test_mean_tokens_per_step_matches_the_acceptance_model() -> None:
    p = SimProfile.load("mtp").replace(eos_prob=0.0)
    assert p.expected_tokens_per_step == pytest.approx(2.52)
    core = EngineCore(p)
    for i in range(8):
        core.add(req(32, 2000, first=100 + 40 * i, rid=str(i), seed=i))
    counts = [len(e.token_ids) for s in run(core) for e in s.emissions if e.finish_reason is None]
    decode_counts = counts[8:]
    mean = sum(decode_counts) / len(decode_counts)
    assert mean == pytest.approx(2.52, rel=0.05)


def test_eos_stops_early_after_min_tokens_and_never_with_ignore_eos() -> None:
    p = BASE.replace(eos_prob=0.5)
    core = EngineCore(p)
    free = SimRequest(request_id="a", prompt_ids=[5] * 20, max_tokens=200, seed=1)
    floor = SimRequest(request_id="b", prompt_ids=[6] * 20, max_tokens=200, min_tokens=50, seed=2)
    forced = SimRequest(request_id="c", prompt_ids=[7] * 20, max_tokens=60, ignore_eos=True, seed=3)
    for r in (free, floor, forced):
        core.add(r)
    run(core)
    assert free.finish_reason == "stop" and free.num_generated < 200
    assert floor.finish_reason == "stop" and 50 < floor.num_generated < 200
    assert forced.finish_reason == "length" and forced.num_generated == 60


def test_same_seed_same_tokens_and_different_seed_different_tokens() -> None:
    def tokens(seed: int) -> list[int]:
        core = EngineCore(BASE)
        core.add(req(10, 20, seed=seed))
        return [t for s in run(core) for e in s.emissions for t in e.token_ids]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)


def test_queue_limit_rejects_and_counts() -> None:
    core = EngineCore(BASE.replace(max_num_queued_reqs=2))
    core.add(req(10, 1, rid="1"))
    core.add(req(10, 1, rid="2"))
    with pytest.raises(QueueFullError):
        core.add(req(10, 1, rid="3"))
    assert core.stats.admission_rejections == 1


def test_preemption_when_the_kv_cache_is_full() -> None:
    # 10 blocks of 16 tokens; two requests of 60 + 40 output tokens cannot both fit
    p = BASE.replace(kv_cache_blocks=10, prefix_cache_blocks=0, max_num_batched_tokens=4096)
    core = EngineCore(p)
    a, b = req(60, 40, rid="a"), req(60, 40, first=5000, rid="b")
    core.add(a)
    core.add(b)
    run(core)
    assert core.stats.num_preemptions >= 1
    assert b.num_preemptions >= 1
    assert a.num_generated == 40 and b.num_generated == 40


def test_abort_removes_the_request() -> None:
    core = EngineCore(BASE)
    r = req(10, 100)
    core.add(r)
    core.step(0)
    core.abort(r)
    assert not core.has_work() and core.stats.request_success["abort"] == 1


def test_stalled_requests_are_skipped_until_their_stall_ends() -> None:
    core = EngineCore(BASE)
    r = req(10, 5)
    core.add(r)
    s1 = core.step(0)
    assert s1 is not None
    r.stall_until_ns = s1.end_ns + 50_000_000
    assert core.step(s1.end_ns) is None
    assert core.next_wakeup_ns() == r.stall_until_ns
    assert core.step(r.stall_until_ns) is not None


def test_kv_usage_and_metrics_histograms() -> None:
    core = EngineCore(BASE)
    core.add(req(32, 4))
    s = core.step(0)
    assert s is not None
    assert core.kv_usage() == pytest.approx(3 / 1000)  # 33 tokens = 3 blocks of 16
    run(core, s.end_ns)
    h = core.stats.hists
    assert h["time_to_first_token_seconds"].count == 1
    assert h["time_to_first_token_seconds"].sum == pytest.approx(0.001032)
    assert h["inter_token_latency_seconds"].count == 3
    assert h["e2e_request_latency_seconds"].count == 1
    assert core.stats.generation_tokens == 4 and core.stats.prompt_tokens == 32


@pytest.mark.parametrize(
    "change",
    [
        {"max_num_seqs": 0},
        {"num_speculative_tokens": 2, "spec_acceptance": (0.5,)},
        {"eos_prob": 2.0},
        {"prefill_tokens_per_s": 0.0},
        {"max_num_batched_tokens": 3},
    ],
)
def test_invalid_profiles_are_rejected(change: dict[str, object]) -> None:
    with pytest.raises(InputError):
        BASE.replace(**change)


def test_shipped_profiles_load_and_unknown_fields_are_named(tmp_path: object) -> None:
    from pathlib import Path

    for name in ("default", "fast", "mtp"):
        p = SimProfile.load(name)
        assert p.name == name and p.notes
    bad = Path(str(tmp_path)) / "bad.json"
    bad.write_text('{"max_num_seq": 3}')
    with pytest.raises(InputError, match="max_num_seq"):
        SimProfile.load(str(bad))
    bad.write_text("{not json")
    with pytest.raises(InputError, match="invalid JSON"):
        SimProfile.load(str(bad))
