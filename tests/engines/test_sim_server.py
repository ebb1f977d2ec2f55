"""The simulated engine's HTTP surface in this process: errors, faults, metrics, ground truth."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow.parquet as pq
import pytest

from agent_replay.engines.sim import SimProfile, SimServer
from agent_replay.engines.sim.faults import parse_faults
from agent_replay.engines.sse import SSEParser
from agent_replay.errors import InputError, OutputExistsError

FAST = SimProfile.load("fast").replace(eos_prob=0.0)


async def post(
    url: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as c:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with c.post(
            url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        ) as r:
            return r.status, await r.read()


def stream_body(n: int = 8, **kw: Any) -> dict[str, Any]:
    return {
        "prompt": list(range(1000, 1016)),
        "max_tokens": n,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
        **kw,
    }


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "JSON decode error"),
        (b"[1, 2]", 400, "JSON object"),
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": [1, 99999999]}, 400, "out of vocabulary"),
        ({"prompt": [1, 2], "max_tokens": 40000}, 400, "maximum context length"),
        ({"prompt": [1, 2], "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ({"prompt": [1, 2], "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens"),
        ({"prompt": [1, 2], "model": "other"}, 404, "does not exist"),
        ({"prompt": [1, 2], "ignore_eos": "yes"}, 400, "boolean"),
        ({"prompt": []}, 400, "empty"),
    ],
)
async def test_bad_requests_get_vllms_error_shape(body: Any, status: int, needle: str) -> None:
    async with SimServer(FAST) as s:
        code, raw = await post(s.url, "/v1/completions", body)
        assert code == status
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == status and needle in err["message"]
        # the server is still serving
        ok, _ = await post(s.url, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert ok == 200


async def test_chat_and_messages_validation() -> None:
    async with SimServer(FAST) as s:
        code, raw = await post(s.url, "/v1/chat/completions", {"messages": []})
        assert code == 400 and json.loads(raw)["error"]["code"] == 400
        code, raw = await post(
            s.url, "/v1/messages", {"messages": [{"role": "user", "content": "x"}]}
        )
        assert code == 400
        assert json.loads(raw) == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
        }


async def test_queue_limit_answers_503() -> None:
    prof = FAST.replace(max_num_seqs=1, max_num_queued_reqs=1, decode_base_ns=20_000_000)
    async with SimServer(prof) as s:
        body = {"prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True}
        results = await asyncio.gather(*[post(s.url, "/v1/completions", body) for _ in range(4)])
        codes = sorted(c for c, _ in results)
        assert 503 in codes and 200 in codes
        err = json.loads(next(r for c, r in results if c == 503))["error"]
        assert err["code"] == 503
        assert s.core.stats.admission_rejections == codes.count(503)


async def test_x_request_id_sets_the_id_and_is_echoed() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"X-Request-Id": "abc-1", "X-Session-ID": "s1"}
    async with (
        SimServer(FAST) as s,
        aiohttp.ClientSession() as c,
        c.post(s.url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.headers["X-Request-Id"] == "abc-1"
        data = await r.json()
    assert data["id"] == "chatcmpl-abc-1"
    assert data["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_min_tokens_without_ignore_eos_can_stop_early_but_not_before_min() -> None:
    prof = FAST.replace(eos_prob=0.3)
    async with SimServer(prof) as s:
        stops = []
        for i in range(5):
            code, raw = await post(
                s.url,
                "/v1/completions",
                {
                    "prompt": [100 + i, 7, 8],
                    "max_tokens": 50,
                    "min_tokens": 10,
                    "return_token_ids": True,
                },
            )
            assert code == 200
            out = json.loads(raw)
            n = out["usage"]["completion_tokens"]
            assert n >= 10 and len(out["choices"][0]["token_ids"]) == n
            stops.append(out["choices"][0]["finish_reason"])
    assert "stop" in stops


async def test_tokenize_counts_text_and_chat_template_overhead() -> None:
    async with SimServer(FAST) as s:
        code, raw = await post(s.url, "/tokenize", {"prompt": " abcd" * 7})
        assert code == 200 and json.loads(raw)["count"] == 7
        code, raw = await post(
            s.url, "/tokenize", {"messages": [{"role": "user", "content": " abcd" * 7}]}
        )
        out = json.loads(raw)
        assert out["count"] == 7 + 5 + 3 and out["max_model_len"] == FAST.max_model_len
        # and the chat endpoint agrees with /tokenize
        code, raw = await post(
            s.url,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": " abcd" * 7}], "max_tokens": 1},
        )
        assert json.loads(raw)["usage"]["prompt_tokens"] == 12 + 3
        code, raw = await post(s.url, "/tokenize", {"nothing": 1})
        assert code == 400


async def test_metrics_follow_vllm_names_and_semantics() -> None:
    prof = SimProfile.load("mtp").replace(
        decode_base_ns=500_000, prefill_tokens_per_s=1e6, eos_prob=0.0, spin_ns=200_000
    )
    async with SimServer(prof) as s:
        prompt = list(range(1000, 1100))
        for _ in range(2):
            code, _ = await post(
                s.url, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "ignore_eos": True}
            )
            assert code == 200
        async with aiohttp.ClientSession() as c, c.get(s.url + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            values[name] = float(v)
    lab = '{engine="0",model_name="sim-8b-mtp"}'
    assert values[f"vllm:prompt_tokens_total{lab}"] == 200
    assert values[f"vllm:generation_tokens_total{lab}"] == 40
    assert values[f"vllm:prefix_cache_queries_total{lab}"] == 200
    assert values[f"vllm:prefix_cache_hits_total{lab}"] == 96  # (100-1)//16 = 6 blocks
    assert (
        values[
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-8b-mtp"}'
        ]
        == 2
    )
    assert values[f"vllm:num_requests_running{lab}"] == 0
    assert values[f"vllm:time_to_first_token_seconds_count{lab}"] == 2
    drafts = values[f"vllm:spec_decode_num_drafts_total{lab}"]
    accepted = values[f"vllm:spec_decode_num_accepted_tokens_total{lab}"]
    per_pos = [
        values[
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="sim-8b-mtp",position="{i}"}}'
        ]
        for i in range(3)
    ]
    assert values[f"vllm:spec_decode_num_draft_tokens_total{lab}"] == 3 * drafts
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2]
    # one ITL sample per step per request, as vLLM does
    assert values[f"vllm:inter_token_latency_seconds_count{lab}"] == drafts
    assert f"vllm:kv_cache_usage_perc{lab}" in values
    assert f"vllm:num_preemptions_total{lab}" in values
    assert (
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="sim-8b-mtp"}'
        in values
    )


async def test_ground_truth_records_every_chunk(tmp_path: Path) -> None:
    gt = tmp_path / "gt.parquet"
    async with SimServer(FAST, ground_truth=gt) as s:
        code, _ = await post(s.url, "/v1/completions", stream_body(6), {"X-Request-Id": "g1"})
        assert code == 200
        code, _ = await post(
            s.url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True}
        )
    t = pq.read_table(gt).to_pylist()
    row = next(r for r in t if r["request_id"] == "g1")
    assert (
        sum(row["chunk_tokens"]) == 6
        and len(row["chunk_ns"]) == len(row["chunk_scheduled_ns"]) == 6
    )
    assert row["chunk_ns"] == sorted(row["chunk_ns"]) and row["received_ns"] < row["chunk_ns"][0]
    assert all(
        done >= sched
        for done, sched in zip(row["chunk_ns"], row["chunk_scheduled_ns"], strict=True)
    )
    assert row["prompt_tokens"] == 16 and row["finish_reason"] == "length"
    assert len(t) == 2
    with pytest.raises(OutputExistsError):
        SimServer(FAST, ground_truth=gt)
    # the self-check saw every step that wrote, and its worst lag bounds every write's lag
    st = s.core.stats
    steps_written = {sched for r in t for sched in r["chunk_scheduled_ns"]}
    assert st.written_steps == len(steps_written) and 0 <= st.late_steps <= st.written_steps
    assert st.max_write_lag_ns >= max(
        done - sched
        for r in t
        for done, sched in zip(r["chunk_ns"], r["chunk_scheduled_ns"], strict=True)
    )


@pytest.mark.parametrize("kernel_arrival", [False, True])
async def test_ground_truth_first_read_includes_the_engines_ingress_queue(
    tmp_path: Path, kernel_arrival: bool
) -> None:
    """Two requests whose bytes are read in the same loop iteration: the second one's handler
    runs only after the first one's (a long prompt to tokenize), so its ``received_ns`` is
    later than the moment its bytes were read (``first_byte_ns``); the wait in between is
    the engine's own queue, and the ground truth now shows it. With ``kernel_arrival`` the
    stamp is the kernel's receive time (a transport of our own): the same holds, and the
    server still answers both."""
    gt = tmp_path / f"gt-{kernel_arrival}.parquet"
    async with SimServer(FAST, ground_truth=gt, kernel_arrival=kernel_arrival) as s:
        heads = []
        for rid, prompt in (("big", "word " * 20000), ("small", "hi")):
            body = json.dumps(
                {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}
            ).encode()
            heads.append(
                (
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: {rid}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n"
                ).encode()
                + body
            )
        conns = [await asyncio.open_connection("127.0.0.1", s.port) for _ in heads]
        for (_, w), data in zip(conns, heads, strict=True):
            w.write(data)  # both written before the server's loop runs again
        for r, w in conns:
            await r.read()
            w.close()
    rows = {r["request_id"]: r for r in pq.read_table(gt).to_pylist()}
    assert set(rows) == {"big", "small"}
    for r in rows.values():
        assert r["first_byte_ns"] is not None and r["first_byte_ns"] <= r["received_ns"]
    # the small request waited for the big one's handler: 20,000 words to tokenize
    assert rows["small"]["received_ns"] - rows["small"]["first_byte_ns"] > 0
    assert rows["small"]["first_byte_ns"] <= rows["big"]["received_ns"]


def test_schedule_warning_above_one_percent_of_late_steps() -> None:
    from agent_replay.engines.sim.stats import SimStats, schedule_warning

    assert schedule_warning(SimStats()) is None
    assert (
        schedule_warning(SimStats(written_steps=200, late_steps=2, max_write_lag_ns=3_000_000))
        is None
    )
    line = schedule_warning(SimStats(written_steps=200, late_steps=3, max_write_lag_ns=2_500_000))
    assert line is not None
    assert "3 of 200 steps (2%)" in line and "worst 2.5 ms" in line and "--workers" in line


def test_fault_strings_parse_and_bad_ones_are_named() -> None:
    f = parse_faults("error=0.5; status=503, reset_after=3")
    assert (f.error, f.status, f.reset_after) == (0.5, 503, 3)
    with pytest.raises(InputError, match="bogus"):
        parse_faults("bogus=1")
    with pytest.raises(InputError, match="reset_after"):
        parse_faults("reset_after=x")


async def raw_stream(url: str, fault: str, n: int = 8) -> tuple[int, bytes, Exception | None]:
    buf = b""
    async with aiohttp.ClientSession() as c:
        try:
            async with c.post(
                url + "/v1/completions", json=stream_body(n), headers={"X-Sim-Fault": fault}
            ) as r:
                async for chunk in r.content.iter_any():
                    buf += chunk
                return r.status, buf, None
        except aiohttp.ClientError as exc:
            return 200, buf, exc


async def test_fault_injection_by_header() -> None:
    async with SimServer(FAST) as s:
        code, raw, _ = await raw_stream(s.url, "error=1.0;status=502")
        assert code == 502 and json.loads(raw)["error"]["code"] == 502
        code, raw, _ = await raw_stream(s.url, "error=0.0")
        assert raw.endswith(b"data: [DONE]\n\n")
        _, raw, exc = await raw_stream(s.url, "reset_after=3")
        assert exc is not None and raw.count(b"\n\n") == 3
        _, raw, exc = await raw_stream(s.url, "truncate_after=2")
        assert exc is not None and raw.count(b"\n\n") == 2 and not raw.endswith(b"\n\n")
        _, raw, exc = await raw_stream(s.url, "malformed_after=1")
        assert exc is None
        events = SSEParser().feed(raw)
        with pytest.raises(json.JSONDecodeError):
            json.loads(events[1].data)
        assert (
            sum(
                len(json.loads(e.data)["choices"][0]["token_ids"])
                for e in events
                if e.data.startswith(b'{"id":"cmpl')
            )
            == 8
        )
        code, raw, _ = await raw_stream(s.url, "nonsense")
        assert code == 400
        assert s.core.stats.request_success["abort"] == 2


@pytest.mark.timing
async def test_stall_fault_holds_the_stream_between_two_events() -> None:
    prof = FAST.replace(faults="stall_after=2;stall_ms=150")
    async with SimServer(prof) as s, aiohttp.ClientSession() as c:
        times = []
        async with c.post(s.url + "/v1/completions", json=stream_body(4)) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    times.append(time.monotonic_ns())
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    # the 150 ms stall, less what a late read of the event before it takes off; the gaps
    # around it are the fast profile's steps
    assert gaps[1] > 0.12 and max(gaps[0], gaps[2]) < 0.1


async def test_client_disconnect_aborts_the_request() -> None:
    prof = FAST.replace(decode_base_ns=5_000_000)
    async with SimServer(prof) as s:
        async with (
            aiohttp.ClientSession() as c,
            c.post(s.url + "/v1/completions", json=stream_body(500)) as r,
        ):
            await r.content.readline()
        for _ in range(100):
            if not s.core.has_work():
                break
            await asyncio.sleep(0.01)
        assert not s.core.has_work()
        assert s.core.stats.request_success["abort"] == 1


async def test_models_and_health_and_reset_prefix_cache() -> None:
    async with SimServer(FAST) as s, aiohttp.ClientSession() as c:
        async with c.get(s.url + "/v1/models") as r:
            card = (await r.json())["data"][0]
        assert [k for k in card][:7] == [
            "id",
            "object",
            "created",
            "owned_by",
            "root",
            "parent",
            "max_model_len",
        ]
        async with c.get(s.url + "/health") as r:
            assert r.status == 200
        await post(s.url, "/v1/completions", {"prompt": list(range(100, 140)), "max_tokens": 1})
        assert len(s.core.cache) == 2
        async with c.post(s.url + "/reset_prefix_cache") as r:
            assert r.status == 200
        assert len(s.core.cache) == 0
