"""Prefix-block hashes, secrets, and the raw-event splitter / usage-chunk filter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from agent_replay.redact import strip_secrets
from agent_replay.replay.record.content import (
    BYTES_PER_TOKEN,
    GRAIN_BYTES,
    PromptHasher,
    grain_digests,
    prefix_digests,
    prompt_parts,
    render,
)
from agent_replay.replay.record.observe import RawEventSplitter, ResponseObserver
from agent_replay.replay.record.wire import end_to_end_headers, inspect_request
from agent_replay.traces.hashing import hash_tokens


def _chat(*texts: str) -> dict:
    roles = ["user", "assistant"]
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]}


def test_token_id_prompts_hash_like_traces_hashing() -> None:
    h = PromptHasher(4, seed=7)
    ids, est = h.hash_ids("completions", {"prompt": list(range(10))}, None)
    assert est == 10
    assert ids == hash_tokens(list(range(10)), 4, seed=7)
    assert len(ids) == 3


def test_length_follows_reported_input_tokens() -> None:
    h = PromptHasher(4, seed=1)
    short, _ = h.hash_ids("completions", {"prompt": list(range(10))}, 5)
    assert short == hash_tokens(list(range(10)), 4, seed=1)[:2]
    longer, _ = h.hash_ids("completions", {"prompt": list(range(10))}, 21)
    assert len(longer) == 6 and longer[:3] == hash_tokens(list(range(10)), 4, seed=1)
    again, _ = h.hash_ids("completions", {"prompt": list(range(10))}, 21)
    assert again == longer  # the extension depends on the prompt only


def _server_count(body: dict, bytes_per_token: float) -> int:
    """A stand-in server's prompt length: 7 template tokens a message plus its rendered
    bytes at ``bytes_per_token`` (never the recorder's 4)."""
    return sum(
        7 + int(len(render(m).encode()) / bytes_per_token) for m in prompt_parts("messages", body)
    )


@pytest.mark.parametrize("ratio", [1.3, 2.5, 3.2, 4.0, 6.5])
def test_next_turn_shares_every_block_whatever_the_ratio(ratio: float) -> None:
    """A conversation grows turn by turn; the server counts more (or fewer) tokens than
    the bytes suggest. Every turn has ceil(n / block_size) ids and starts with all of the
    previous turn's ids, its last block included (partial there, longer here), so the
    trace implies what a block-level prefix cache serves."""
    bs = 16
    h = PromptHasher(bs, seed=3)
    sys_text = "You are a careful agent. " * 40
    msgs: list[dict] = []
    prev: list[int] = []
    for turn in range(8):
        msgs = [
            *msgs,
            {"role": "user", "content": f"turn {turn}: " + "run the tests " * (5 + turn)},
        ]
        body = {"system": sys_text, "messages": msgs}
        n = _server_count(body, ratio)
        ids, _ = h.hash_ids("messages", body, n)
        assert len(ids) == -(-n // bs)
        assert ids[: len(prev)] == prev, f"turn {turn}"
        assert len(set(ids)) == len(ids)
        msgs = [*msgs, {"role": "assistant", "content": f"ok {turn} " + "done " * 9}]
        prev = ids


def test_a_partial_last_block_is_continued_once() -> None:
    """A prompt ends with a partial block. The first longer prompt that continues all of
    its bytes takes that block's id; a second one (a sibling: the same start, other bytes
    after it) gets its own block there, so the two do not claim to share more than the
    partial block held; the first one sent again (a retry) keeps its ids."""
    bs = 16
    h = PromptHasher(bs, seed=5)
    base = [{"role": "user", "content": "list the files " * 20}]
    parent = {"messages": base}
    n = _server_count(parent, 3.0)
    assert n % bs
    p_ids, _ = h.hash_ids("chat", parent, n)
    a = {"messages": [*base, {"role": "assistant", "content": "here they are " * 12}]}
    b = {"messages": [*base, {"role": "assistant", "content": "nothing found " * 12}]}
    a_ids, _ = h.hash_ids("chat", a, _server_count(a, 3.0))
    b_ids, _ = h.hash_ids("chat", b, _server_count(b, 3.0))
    again, _ = h.hash_ids("chat", a, _server_count(a, 3.0))
    last = len(p_ids) - 1
    assert a_ids[: last + 1] == p_ids
    assert b_ids[:last] == p_ids[:last] and b_ids[last] != p_ids[last]
    assert again == a_ids
    # a prompt that does not hold the parent's last bytes does not continue it
    c = {
        "messages": [
            {"role": "user", "content": "list the files " * 19 + "list the fileZ "},
            {"role": "assistant", "content": "ok " * 40},
        ]
    }
    h2 = PromptHasher(bs, seed=5)
    p2, _ = h2.hash_ids("chat", parent, n)
    c_ids, _ = h2.hash_ids("chat", c, _server_count(c, 3.0))
    assert c_ids[last] != p2[last]


def test_sessions_sharing_a_prefix_share_its_blocks() -> None:
    """Two sessions with the same system prompt and tools: the second one's first turn
    reuses the first one's boundaries inside the common bytes, so the blocks that lie
    wholly in it are shared, however many tokens either prompt has."""
    bs = 16
    h = PromptHasher(bs, seed=9)
    system = "Shared system prompt with tools. " * 60
    a = {"system": system, "messages": [{"role": "user", "content": "fix the bug " * 30}]}
    b = {"system": system, "messages": [{"role": "user", "content": "write the docs " * 50}]}
    na = _server_count(a, 2.8)
    ids_a, _ = h.hash_ids("messages", a, na)
    ids_b, _ = h.hash_ids("messages", b, _server_count(b, 2.8))
    common = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    shared_bytes = len(render({"role": "system", "content": [{"type": "text", "text": system}]}))
    # a's blocks are spread at its own ratio: the common bytes hold this many whole blocks
    per_block = len("".join(render(m) for m in prompt_parts("messages", a)).encode()) / na * bs
    assert common == int(shared_bytes // per_block) or common == int(shared_bytes // per_block) - 1
    assert common > 20
    assert not set(ids_a[common:]) & set(ids_b[common:])


def test_length_is_the_count_given_and_estimates_leave_no_boundaries() -> None:
    h = PromptHasher(8, seed=3)
    body = _chat("x" * 100, "y" * 50)
    est = h.hash_ids("chat", body, None)[1]
    assert not h._next  # an estimate is not built upon
    assert est == -(
        -len("".join(render(m) for m in prompt_parts("chat", body)).encode()) // BYTES_PER_TOKEN
    )
    for n in (0, 1, 8, 9, est, 5 * est):
        ids, _ = h.hash_ids("chat", body, n)
        assert len(ids) == -(-n // 8) and len(set(ids)) == len(ids)
    again, _ = h.hash_ids("chat", body, 9)
    assert again == h.hash_ids("chat", body, 9)[0]
    other, _ = PromptHasher(8, seed=4).hash_ids("chat", body, 40)
    assert set(other).isdisjoint(PromptHasher(8, seed=3).hash_ids("chat", body, 40)[0])


def test_grain_and_prefix_digests() -> None:
    a = b"abc" * 100
    b = a + b"tail" * 40
    ga, gb = grain_digests(a), grain_digests(b)
    full = len(a) // GRAIN_BYTES
    assert len(ga) == -(-len(a) // GRAIN_BYTES)
    assert ga[:full].tolist() == gb[:full].tolist()
    assert ga[full] != gb[full]  # the partial grain differs from the completed one
    assert grain_digests(b"x")[0] != grain_digests(b"x\0")[0]  # the length counts
    pa_, pb = prefix_digests(ga), prefix_digests(gb)
    assert pa_[0] == 0 and len(pa_) == len(ga) + 1
    assert pa_[: full + 1].tolist() == pb[: full + 1].tolist()
    # P[e] = sum g[i] * K**(e-1-i) mod 2**64, checked with Python integers
    k = 0x9E3779B97F4A7C15
    want = [
        sum(int(g) * pow(k, e - 1 - i, 1 << 64) for i, g in enumerate(gb[:e])) % (1 << 64)
        for e in range(len(gb) + 1)
    ]
    assert pb.tolist() == want
    swapped = np.concatenate([gb[1:2], gb[:1], gb[2:]])
    assert prefix_digests(swapped)[-1] != pb[-1]  # order counts


def test_cache_control_and_string_vs_block_content_hash_the_same() -> None:
    h = PromptHasher(8, seed=3)
    s = {"system": "sys", "messages": [{"role": "user", "content": "hello"}]}
    b = {
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
                ],
            }
        ],
    }
    assert h.hash_ids("messages", s, 40) == h.hash_ids("messages", b, 40)


def test_tokenizer_units(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "user": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    h = PromptHasher(2, seed=0, tokenizer=tok)
    ids, est = h.hash_ids("chat", _chat("a b a b"), None)
    assert est == 5  # "user" + 4 words
    assert len(ids) == 3
    longer, _ = h.hash_ids("chat", _chat("a b a b", "a b", "b b b a"), 40)
    assert len(longer) == 20


def test_strip_secrets_at_any_depth() -> None:
    body = {
        "model": "m",
        "api_key": "sk-1",
        "extra": {
            "OpenAI-Api-Key": "sk-2",
            "nested": [{"x-api-key": "sk-3", "authorization": "Bearer sk-4", "keep": 1}],
        },
        "messages": [{"role": "user", "content": "my key is in text"}],
    }
    out = orjson.dumps(strip_secrets(body))
    for s in (b"sk-1", b"sk-2", b"sk-3", b"sk-4"):
        assert s not in out
    assert b'"keep":1' in out and b"my key is in text" in out


def test_hop_by_hop_headers() -> None:
    hs = [
        ("Connection", "close, X-A"),
        ("X-A", "1"),
        ("Keep-Alive", "t=5"),
        ("TE", "trailers"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "p"),
        ("Trailer", "x"),
        ("X-B", "2"),
        ("X-B", "3"),
        ("Host", "h"),
    ]
    assert end_to_end_headers(hs, frozenset({"host"})) == [("X-B", "2"), ("X-B", "3")]


def test_inject_usage_keeps_other_bytes() -> None:
    raw = b'{"model": "m",  "stream": true, "messages": []}'
    info, out = inspect_request("chat", raw)  # type: ignore[misc]
    assert info.injected_usage
    assert (
        out
        == b'{"stream_options":{"include_usage":true},"model": "m",  "stream": true, "messages": []}'
    )
    raw2 = b'{"stream":true,"stream_options":{"include_usage":true},"prompt":"x"}'
    info2, out2 = inspect_request("completions", raw2)  # type: ignore[misc]
    assert not info2.injected_usage and out2 == raw2
    info3, _ = inspect_request("messages", b'{"stream":true,"metadata":{"user_id":"u1"}}')  # type: ignore[misc]
    assert not info3.injected_usage and info3.session_hint == "u1"
    assert inspect_request("chat", b"[1]") is None and inspect_request("chat", b"{x") is None


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}],"usage":null}\r\n\r\n'
    b": keep-alive\n\n"
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
CLIENT_VIEW = (
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\r\n\r\n'
    b": keep-alive\n\n"
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("split", range(len(STREAM) + 1))
def test_usage_chunk_removed_at_every_split(split: int) -> None:
    obs = ResponseObserver("chat", injected_usage=True)
    obs.start(200, "text/event-stream; charset=utf-8", "", None)
    assert obs.filtering
    out = obs.feed(STREAM[:split], 1) + obs.feed(STREAM[split:], 2) + obs.end(3)
    assert out == CLIENT_VIEW
    assert obs.usage() == (3, 2, None)
    assert obs.token_counts == [1, 1] and not obs.exact_counts()


@pytest.mark.parametrize("split", range(0, len(STREAM) + 1, 7))
def test_splitter_keeps_every_byte(split: int) -> None:
    sp = RawEventSplitter()
    parts = sp.feed(STREAM[:split]) + sp.feed(STREAM[split:])
    assert b"".join(parts) + sp.rest() == STREAM
    assert len(parts) == 5


def test_not_injected_stream_is_forwarded_untouched() -> None:
    obs = ResponseObserver("chat", injected_usage=False)
    obs.start(200, "text/event-stream", "", None)
    assert obs.feed(STREAM, 1) == STREAM


def test_vllm_captured_stream_token_counts(shared_dir: Path) -> None:
    sample = shared_dir / "vllm-cpu" / "samples" / "sse_completions_return_token_ids.txt"
    if not sample.exists():
        pytest.skip("no vLLM sample")
    data = sample.read_bytes()
    obs = ResponseObserver("completions", injected_usage=False)
    obs.start(200, "text/event-stream", "", None)
    for i in range(0, len(data), 97):
        obs.feed(data[i : i + 97], i)
    obs.end(len(data))
    inp, out, _ = obs.usage()
    assert obs.exact_counts()
    assert sum(obs.token_counts) == out and out > 0 and inp == 8


def test_item_ids_the_model_never_reads_do_not_end_the_shared_prefix() -> None:
    """Codex gives its own Responses items fresh ids in every session: two sessions with
    the same instructions and messages hash alike however their item ids differ."""

    def body(item_id: str, text: str) -> dict:
        return {
            "instructions": "Be brief.",
            "input": [
                {
                    "type": "message",
                    "id": item_id,
                    "role": "developer",
                    "status": "completed",
                    "content": [{"type": "input_text", "text": "Sandbox on."}],
                },
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Sandbox rules. " * 80}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            ],
        }

    h = PromptHasher(16, seed=2)
    a, _ = h.hash_ids("responses", body("msg_1", "first task"), 400)
    b, _ = h.hash_ids("responses", body("msg_2", "second task"), 400)
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    assert common >= 20


def test_a_prompt_diverging_inside_an_earlier_one_shares_the_blocks_before() -> None:
    """aider's shape: the second prompt sends the first's user message back without what
    was appended to it. 3 bytes a token throughout (" ab" and " xy" words; the server's
    counts given as bytes // 3): the bytes differ from byte 1,814 on (token 604), so a
    server with 16-token blocks caches 37 blocks (592 tokens) of the second prompt. Block
    37's end, token 592, is byte 1,776, which goes on a grain boundary: with 32-byte
    grains byte 1,792, the start of the grain where the bytes differ, so the trace shares
    all 37 (64-byte grains put it at byte 1,856, past the difference: 36)."""
    system = {"role": "system", "content": " ab" * 600}
    first = {"messages": [system, {"role": "user", "content": "q" + " xy" * 100}]}
    second = {
        "messages": [
            system,
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": " ok" * 10},
            {"role": "user", "content": " more"},
        ]
    }
    data = ["".join(render(p) for p in prompt_parts("chat", b)).encode() for b in (first, second)]
    assert (len(data[0]), len(data[1])) == (2115, 1867)
    assert next(i for i, (x, y) in enumerate(zip(*data, strict=False)) if x != y) == 1814
    assert GRAIN_BYTES == 32
    h = PromptHasher(16, 1)
    a, _ = h.hash_ids("chat", first, 2115 // 3)
    b, _ = h.hash_ids("chat", second, 1867 // 3)
    assert next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y) == 37
