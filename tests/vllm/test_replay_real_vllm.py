"""`agent-replay run` against a real vLLM (the server: tests/vllm/conftest.py): tokens
served, timing against vLLM's own histograms, prefix-cache hits against what the trace
implies, the official SDKs through the recorder. Last, stopping the server leaves no process
behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.metrics import request_metrics
from agent_replay.analysis.selfcheck import OTHERS_BUSY, Machine
from agent_replay.analysis.server_metrics import summarize
from agent_replay.engines.vllm.launcher import VllmServer
from agent_replay.traces.io import read_trace, write_trace
from tests.vllm.conftest import SERVED_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "samples" / "agent-small.parquet"


SESSIONS = 3
"""Sessions of the sample replayed: on 2 CPU cores the tiny model's prefill of their uncached
prompt tokens, not the trace's clock, sets how long the replay takes."""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's first ``SESSIONS`` sessions, as a trace of their own."""
    table, meta = read_trace(TRACE)
    keep = sorted(set(table.column("session_id").to_pylist()))[:SESSIONS]
    mask = pc.is_in(table.column("session_id"), value_set=pa.array(keep))
    return write_trace(table.filter(mask), tmp_path_factory.mktemp("trace") / "t.parquet", meta)


@pytest.fixture(scope="module")
def replayed(server: VllmServer, trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results") / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "run",
            str(trace),
            "--target",
            server.url,
            "--output",
            str(out),
            "--model",
            SERVED_NAME,
            "--speedup",
            "2",
            "--salt",
            "7",
            "--scrape-interval",
            "0.5",
            "--no-progress",
            "--loop",
            "asyncio",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out


def _requests(out: Path) -> dict[str, list[object]]:
    return pq.read_table(out / "requests").to_pydict()


def test_tokens_served_equal_the_trace(replayed: Path, trace: Path) -> None:
    table, _ = read_trace(trace)
    assert len(set(table.column("session_id").to_pylist())) == SESSIONS
    rows = _requests(replayed)
    assert len(rows["status"]) == table.num_rows
    assert set(rows["status"]) == {"ok"}
    assert sum(rows["prompt_tokens"]) == sum(table.column("input_tokens").to_pylist())  # type: ignore[arg-type]
    assert rows["completion_tokens"] == rows["expected_output_tokens"]
    assert rows["prompt_tokens"] == rows["expected_input_tokens"]
    for toks, n in zip(rows["chunk_tokens"], rows["completion_tokens"], strict=True):
        assert sum(toks) == n  # type: ignore[call-overload]


def _within_buckets(
    value: float, q: dict[str, float | None], les: list[float | None], slack: int
) -> bool:
    """``value`` lies in the server's bucket for this quantile, widened by ``slack`` buckets."""
    finite = [le for le in les if le is not None]
    lo, hi = q["lo"], q["hi"]
    i_lo = finite.index(lo) if lo in finite else -1
    i_hi = finite.index(hi) if hi in finite else len(finite)
    lo_b = finite[i_lo - slack] if i_lo - slack >= 0 else 0.0
    hi_b = finite[i_hi + slack] if i_hi + slack < len(finite) else float("inf")
    return lo_b <= value <= hi_b


@pytest.mark.timing
def test_ttft_and_tpot_agree_with_vllm_histograms(replayed: Path) -> None:
    rows = _requests(replayed)
    # With the host's CPUs busy, vLLM's API server waits for a CPU before the engine's
    # arrival stamp: client TTFT then exceeds the engine's by far more than its HTTP and
    # tokenization time (P50 0.65 s against 0.06 s with one core held by a busy loop), so
    # only its lower side is checked then. TPOT the same: the API server, in the engine's
    # process on these CPUs, streams each token late by its wait for a CPU (client P50 52 ms
    # against the engine's 10-25 ms bucket, with the core held busy), while the engine's
    # histogram times its own steps. The host counts as busy when the run's self-check saw
    # contention, or when other processes (the vLLM server's among them) kept the self-check's
    # share of its cores busy over the run: P90 TTFT 110 ms against the engine's 40-60 ms
    # bucket in one such run with no symptom on our side, where the self-check had not said
    # so (benchmarks/journal/2026-12-02-suite-streak.md).
    meta = json.loads((replayed / "run.json").read_text())
    machine = Machine.from_dict(meta.get("machine"))
    contended = bool(meta.get("machine_contention")) or (
        machine is not None and machine.others_cores >= OTHERS_BUSY * machine.cpus
    )
    server = summarize(pq.read_table(replayed / "server_metrics.parquet"))
    n = len(rows["status"])
    # TTFT as the product defines it: from the request's bytes sent (after any new connection)
    ttft = sorted(
        float(x) / 1e9 for x in request_metrics(pq.read_table(replayed / "requests")).ttft
    )
    tpot = []
    for cs, ks in zip(rows["chunk_ns"], rows["chunk_tokens"], strict=True):
        rest = sum(ks[1:])  # type: ignore[index]
        if rest >= 1:
            tpot.append((cs[-1] - cs[0]) / rest / 1e9)  # type: ignore[index]
    tpot.sort()
    hist_ttft, hist_tpot = server["histograms"]["ttft"], server["histograms"]["tpot"]
    assert hist_ttft["count"] == n
    assert hist_tpot["count"] == n
    report = {}
    for name, ours, hist in (("ttft", ttft, hist_ttft), ("tpot", tpot, hist_tpot)):
        les = [b[0] for b in hist["buckets"]]
        for q in (0.5, 0.9):
            value = ours[min(len(ours) - 1, int(q * len(ours)))]
            report[f"{name}_p{int(q * 100)}"] = (value, hist[f"p{int(q * 100)}"])
            # Client TTFT adds the API server's HTTP, tokenization and queueing time to the
            # engine's (vLLM's histogram starts at the engine's arrival): at P90 on this 2-core
            # machine that was 12-32 ms in three runs, more than the one bucket (20 ms) around
            # 0.08 s, so TTFT gets two buckets of slack and TPOT one.
            slack = 2 if name == "ttft" else 1
            if contended:
                assert _within_buckets(
                    value, hist[f"p{int(q * 100)}"] | {"hi": None}, les, slack=slack
                ), (report, machine)
                continue
            assert _within_buckets(value, hist[f"p{int(q * 100)}"], les, slack=slack), (
                report,
                machine,
            )
    print(json.dumps(report | {"host_contended": contended, "machine": meta.get("machine")}))


def test_prefix_cache_hits_match_the_trace(replayed: Path) -> None:
    rows = _requests(replayed)
    server = summarize(pq.read_table(replayed / "server_metrics.parquet"))
    implied = sum(rows["implied_cached_tokens"]) / sum(rows["prompt_tokens"])  # type: ignore[arg-type]
    seen = server["prefix_cache"]["hit_rate"]
    per_request = sum(rows["cached_tokens"]) / sum(rows["prompt_tokens"])  # type: ignore[arg-type]
    print(json.dumps({"implied": implied, "server": seen, "usage_cached": per_request}))
    assert server["prefix_cache"]["queries"] == sum(rows["prompt_tokens"])  # type: ignore[arg-type]
    assert abs(seen - implied) <= 0.05
    assert abs(per_request - seen) <= 0.01
    assert server["generation_tokens"] == sum(rows["completion_tokens"])  # type: ignore[arg-type]


KEY = "sk-test-DO-NOT-RECORD-real-vllm"


async def _sdk_traffic(base: str, seen: list[tuple[str, int, int]]) -> None:
    import anthropic
    import openai

    oa = openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "write a haiku about caches"}]
    extra = {"ignore_eos": True}
    r = await oa.chat.completions.create(
        model=SERVED_NAME,
        messages=msgs,
        max_tokens=12,  # type: ignore[arg-type]
        extra_body=extra,
    )
    assert r.usage is not None
    seen.append(("chat", r.usage.prompt_tokens, r.usage.completion_tokens))
    # a stream that did not ask for usage: the SDK must not see the usage chunk the proxy adds
    chunks = [
        c
        async for c in await oa.chat.completions.create(
            model=SERVED_NAME,
            messages=msgs,
            max_tokens=12,
            stream=True,  # type: ignore[arg-type]
            extra_body=extra,
        )
    ]
    assert chunks and all(c.usage is None for c in chunks)
    seen.append(("chat", r.usage.prompt_tokens, 12))
    cs = [
        x
        async for x in await oa.completions.create(
            model=SERVED_NAME,
            prompt=[11, 12, 13, 14, 15],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    ]
    assert cs[-1].usage is not None
    seen.append(("completions", cs[-1].usage.prompt_tokens, cs[-1].usage.completion_tokens))
    an = anthropic.AsyncAnthropic(base_url=base, api_key=KEY, max_retries=0)
    async with an.messages.stream(
        model=SERVED_NAME,
        max_tokens=10,
        messages=[{"role": "user", "content": "hi"}],
        extra_body=extra,
    ) as st:
        _ = [t async for t in st.text_stream]
        final = await st.get_final_message()
    seen.append(("messages", final.usage.input_tokens, final.usage.output_tokens))
    await oa.close()
    await an.close()


async def test_recorder_in_front_of_real_vllm(server: VllmServer, tmp_path: Path) -> None:
    """The official SDKs through `agent-replay record` to the real vLLM: they work as usual,
    and each request becomes a trace row with the server's usage and its stream timing."""
    from agent_replay.replay.record import Recorder

    seen: list[tuple[str, int, int]] = []
    async with Recorder(server.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60) as rec:
        await _sdk_traffic(rec.url, seen)
    table, _ = read_trace(tmp_path / "trace")
    rows = sorted(table.to_pylist(), key=lambda r: r["arrival_ns"])
    assert [r["api"] for r in rows] == [s[0] for s in seen]
    for row, (api, prompt, completion) in zip(rows, seen, strict=True):
        assert row["error"] is None, (api, row["error"])
        assert (row["input_tokens"], row["output_tokens"]) == (prompt, completion), api
        if row["stream"]:
            assert 0 < row["ttft_ns"] <= row["end_ns"]
            if row["chunk_tokens"] is not None:
                assert sum(row["chunk_tokens"]) == completion
    for f in (tmp_path / "trace").iterdir():
        assert KEY.encode() not in f.read_bytes()


def test_stop_leaves_no_process_behind(server: VllmServer) -> None:
    """The last test of the last module here: it stops the shared server."""
    assert server.running() and server.pid is not None
    family = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    server.stop()
    assert not server.running()
    alive = [
        pid
        for pid in family
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
