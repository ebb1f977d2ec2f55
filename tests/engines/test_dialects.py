"""The wire dialects: request bodies, exact token counting per chunk, on captured vLLM streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from agent_replay.engines.dialects import (
    MessagesStreamDecoder,
    StreamDecoder,
    build_request,
    count_token_ids,
    encode_body,
)
from agent_replay.engines.sse import SSEParser

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "vllm-cpu" / "samples"

# A stream in vLLM's completions shape (captured layout, shortened): first chunk carries
# prompt_token_ids, later chunks carry several token ids (speculative decoding).
STREAM = (
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" a","prompt_token_ids":[5,6,7],"token_ids":[1000]}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" \\"token_ids\\":[1,2]","prompt_token_ids":null,"token_ids":[1000,29336,7]}],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"","token_ids":[]}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" b","finish_reason":"length","token_ids":[12]}],"usage":{"prompt_tokens":3,"total_tokens":8,"completion_tokens":5}}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":3,"total_tokens":8,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":2}}}\n\n'
    b"data: [DONE]\n\n"
)


def decode_all(raw: bytes) -> tuple[list[int], StreamDecoder]:
    p, d = SSEParser(), StreamDecoder()
    ks = [d.feed(ev.data) for ev in p.feed(raw)]
    return ks, d


def test_counts_from_token_ids_and_usage():
    ks, d = decode_all(STREAM)
    assert ks == [1, 3, 0, 1, 0, 0]
    assert d.done and d.exact and d.error is None
    assert d.result_usage() == (3, 5, 2)


def test_fast_count_equals_full_parse():
    p = SSEParser()
    for ev in p.feed(STREAM):
        if ev.data == b"[DONE]":
            continue
        obj = orjson.loads(ev.data)
        want = len(obj["choices"][0]["token_ids"]) if obj["choices"] else -1
        assert count_token_ids(ev.data) == want


def test_count_in_place_equals_feed_of_the_copy():
    """``count_span`` on an event inside a larger buffer (a chunked frame around it) gives
    what ``feed`` gives on the event's bytes, or -1 and no change where ``feed`` must parse."""
    events = SSEParser().feed(STREAM)
    by_span, by_feed = StreamDecoder(), StreamDecoder()
    got = []
    for ev in events:
        buf = b"3b7\r\ndata: " + ev.data + b"\n\n\r\n"
        start, end = 11, 11 + len(ev.data)
        before = by_span.tokens
        k = by_span.count_span(buf, start, end)
        if k < 0:
            assert by_span.tokens == before
            k = by_span.feed(buf[start:end])
        got.append(k)
        assert k == by_feed.feed(ev.data)
    assert got == [1, 3, 0, 1, 0, 0]  # the string '\"token_ids\":[1,2]' in event 2 is not counted
    assert by_span.tokens == by_feed.tokens == 5
    assert StreamDecoder().count_span(b'{"token_ids":[1,2,3]}', 0, 15) == -1  # "]" past the end


@pytest.mark.parametrize(
    "name",
    [
        "sse_completions_return_token_ids.txt",
        "sse_dsv3_mtp_engineered_peak0.917_temp1.txt",
        "sse_completions_tokenids.txt",
        "sse_chat.txt",
        "sse_ngram_specdecode.txt",
    ],
)
def test_real_vllm_captures(name):
    path = SAMPLES / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    raw = path.read_bytes()
    ks, d = decode_all(raw)
    assert d.done and d.exact
    _prompt, completion, _ = d.result_usage()
    assert sum(ks) == completion  # exact, whichever way the tokens were reported
    events = [e for e in SSEParser().feed(raw) if e.data != b"[DONE]"]
    for ev in events:  # the fast path agrees with orjson wherever it applies
        obj = orjson.loads(ev.data)
        if obj["choices"] and isinstance(obj["choices"][0].get("token_ids"), list):
            assert count_token_ids(ev.data) == len(obj["choices"][0]["token_ids"])
    if "ngram" in name or "mtp" in name:
        assert max(ks) > 1  # speculative decoding: several tokens in one chunk


def test_continuous_usage_without_token_ids():
    raw = (
        b"".join(
            b"data: "
            + orjson.dumps(
                {
                    "choices": [{"index": 0, "text": "x"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": c},
                }
            )
            + b"\n\n"
            for c in (2, 3, 6)
        )
        + b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":6}}\n\ndata: [DONE]\n\n'
    )
    ks, d = decode_all(raw)
    assert ks == [2, 1, 3, 0, 0] and d.exact


def test_no_counts_is_flagged_inexact():
    raw = b'data: {"choices":[{"index":0,"text":"x"}]}\n\ndata: [DONE]\n\n'
    ks, d = decode_all(raw)
    assert ks == [1, 0] and not d.exact


def test_error_event():
    ks, d = decode_all(b'data: {"error":{"message":"boom","code":500}}\n\n')
    assert ks == [0] and "boom" in (d.error or "")


def test_bad_json_raises():
    with pytest.raises(orjson.JSONDecodeError):
        StreamDecoder().feed(b'{"choices": [')


def test_messages_stream():
    raw = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":0}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"a"},"usage":{"output_tokens":2}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"b"},"usage":{"output_tokens":3}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":3}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    d = MessagesStreamDecoder()
    ks = [d.feed(e.data, e.event) for e in SSEParser().feed(raw)]
    assert ks == [0, 2, 1, 0, 0]
    assert d.done and d.exact and d.finish_reason == "max_tokens"
    assert d.result_usage() == (12, 3, None)


def test_messages_stream_without_per_delta_usage():
    def stream(n_deltas: int, final: int) -> bytes:
        return (
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":0}}}\n\n'
            + b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"a"}}\n\n'
            * n_deltas
            + b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":5,"output_tokens":'
            + str(final).encode()
            + b',"cache_read_input_tokens":4}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
        )

    d = MessagesStreamDecoder()
    ks = [d.feed(e.data, e.event) for e in SSEParser().feed(stream(3, 3))]
    assert ks == [0, 1, 1, 1, 0, 0] and d.exact and d.result_usage() == (5, 3, 4)
    d = MessagesStreamDecoder()
    for e in SSEParser().feed(stream(3, 4)):  # one delta carried two tokens: which one?
        d.feed(e.data, e.event)
    assert not d.exact


def test_build_request_bodies():
    ids = np.array([1001, 1002], dtype=np.int64)
    body = build_request("completions", model="m", prompt=ids, max_tokens=7)
    wire = orjson.loads(encode_body(body))
    assert wire["prompt"] == [1001, 1002] and wire["max_tokens"] == 7 and wire["min_tokens"] == 7
    assert wire["ignore_eos"] and wire["return_token_ids"] and wire["stream"]
    assert wire["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chat = build_request("chat", model="m", prompt="hi", max_tokens=3)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 3 and "max_tokens" not in chat
    msg = build_request("messages", model="m", prompt="hi", max_tokens=3, vllm_extras=False)
    assert msg["max_tokens"] == 3 and "ignore_eos" not in msg and "stream_options" not in msg
    replayed = build_request(
        "chat",
        model="m",
        prompt=None,
        max_tokens=5,
        base={"messages": [{"role": "system", "content": "s"}], "max_tokens": 99, "stream": False},
    )
    assert replayed["messages"] == [{"role": "system", "content": "s"}]
    assert replayed["stream"] and "max_tokens" not in replayed
    resp = build_request(
        "responses",
        model="m",
        prompt="x",
        max_tokens=4,
        base={"input": "old", "previous_response_id": "resp_1", "max_tokens": 9},
    )
    assert resp["input"] == [{"role": "user", "content": "x"}] and resp["max_output_tokens"] == 4
    assert "previous_response_id" not in resp and "max_tokens" not in resp
    assert resp["store"] is False and "stream_options" not in resp and resp["ignore_eos"]
    with pytest.raises(ValueError):
        build_request("batch", model="m", prompt="x", max_tokens=1)
    with pytest.raises(ValueError):
        build_request("chat", model="m", prompt=[1, 2], max_tokens=1)
