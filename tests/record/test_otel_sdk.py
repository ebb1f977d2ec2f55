"""One session three ways: a real ``openai`` client program, instrumented with the real
``opentelemetry-instrumentation-openai-v2`` or ``openinference-instrumentation-openai`` and
its real OTLP/HTTP exporter pointed at the receiver, talks through the recorder to the
simulated engine. The receiver's trace must say what the recorder's says: request count,
token totals, send times."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.replay.record.otlp_receiver import OtlpReceiver
from agent_replay.traces.io import read_trace
from agent_replay.traces.stats import implied_cached_tokens

AGENT = Path(__file__).with_name("otel_agent.py")
TURNS = 4
SEND_TOLERANCE_NS = 250_000_000
"""Span start to the recorder's arrival stamp: the instrumentation's own work and the
client's: 5 to 40 ms on a loaded 2-core machine (benchmarks/journal/2026-12-06-otel-three-ways.md)."""


CAPTURE = {
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
    "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
}
"""openai-v2's switches that put the prompts on the span (``gen_ai.input.messages``)."""


HTTP_TOLERANCE_NS = 50_000_000
"""HTTP client span start to the recorder's arrival stamp: the loopback send and the
recorder's event loop; under 5 ms on a quiet host, bounded here for a loaded one."""


@pytest.mark.parametrize(
    "kind",
    [
        "openai-v2",
        "openai-v2+http",
        "openai-v2+content+http",
        "openinference",
        "openinference+http",
    ],
)
async def test_instrumented_sdk_matches_the_recorder(tmp_path: Path, kind: str) -> None:
    http = kind.endswith("+http")
    kind = kind.removesuffix("+http")
    content = kind.endswith("+content")
    kind = kind.removesuffix("+content")
    pytest.importorskip("opentelemetry.sdk")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    pytest.importorskip("opentelemetry.proto")
    pytest.importorskip(
        "opentelemetry.instrumentation.openai_v2"
        if kind == "openai-v2"
        else "openinference.instrumentation.openai"
    )
    if http:
        pytest.importorskip("opentelemetry.instrumentation.httpx")
    async with (
        SimServer("fast", seed=3) as sim,
        Recorder(sim.url, "127.0.0.1:0", tmp_path / "recorded", flush_interval_s=60) as rec,
    ):
        otlp = OtlpReceiver("127.0.0.1:0", tmp_path / "received", flush_interval_s=60)
        await otlp.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(AGENT),
                rec.url,
                otlp.url,
                kind + ("+http" if http else ""),
                str(TURNS),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **(CAPTURE if content else {})},
            )
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, err.decode()[-2000:]
        finally:
            await otlp.stop()
    client = [json.loads(x) for x in out.decode().splitlines()]
    recorded, rmeta = read_trace(tmp_path / "recorded")
    received, ometa = read_trace(tmp_path / "received")
    r_rows = sorted(recorded.to_pylist(), key=lambda r: r["arrival_ns"])
    o_rows = sorted(received.to_pylist(), key=lambda r: r["arrival_ns"])
    assert len(client) == len(r_rows) == len(o_rows) == TURNS
    assert len({r["session_id"] for r in o_rows}) == 1  # the root span's trace
    for key, col in (("input", "input_tokens"), ("output", "output_tokens")):
        assert [c[key] for c in client] == [r[col] for r in r_rows] == [o[col] for o in o_rows]
    assert [o["parent_index"] for o in o_rows] == [-1, 0, 1, 2]
    assert all(o["think_ns"] >= 150_000_000 for o in o_rows[1:])  # the tool's pause
    r_send = [rmeta.start_wall_ns + r["arrival_ns"] for r in r_rows]
    o_send = [ometa.start_wall_ns + o["arrival_ns"] for o in o_rows]
    gaps = [r - o for r, o in zip(r_send, o_send, strict=True)]
    # the LLM span opens before the client builds the request, the HTTP span as it sends
    # it; the recorder stamps it on arrival
    assert all(
        -1_000_000 <= g <= (HTTP_TOLERANCE_NS if http else SEND_TOLERANCE_NS) for g in gaps
    ), gaps
    assert otlp.collector.n_http_sent == (TURNS if http else 0)
    print(
        f"{kind}{'+http' if http else ''}: recorder arrival - OTel send, ms: "
        f"{[round(g / 1e6, 2) for g in gaps]}"
    )
    total = sum(r["input_tokens"] for r in r_rows)
    reuse = {
        n: 100 * int(implied_cached_tokens(t, m.block_size).sum()) / total
        for n, (t, m) in (("recorded", (recorded, rmeta)), ("received", (received, ometa)))
    }
    server = 100 * sum(r["cached_tokens"] or 0 for r in r_rows) / total
    print(
        f"{kind}: hash ids from {ometa.extra['hash_ids_from']}; implied reuse {reuse}; "
        f"server's cached {server:.2f} %"
    )
    # OpenInference captures the prompts (hashed as the recorder hashes them) and the cache
    # counts; openai-v2 neither unless told: its hash ids then follow the token counts
    assert ometa.extra["hash_ids_from"] == (
        "content" if kind == "openinference" or content else "token counts"
    )
    if kind == "openinference":
        assert [o["cached_tokens"] for o in o_rows] == [r["cached_tokens"] for r in r_rows]
    assert abs(reuse["received"] - reuse["recorded"]) <= 1
