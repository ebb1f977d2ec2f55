"""The official OpenAI and Anthropic SDKs through the recorder to the simulated engine,
streaming and not: the SDKs work as usual and every request is recorded with the usage
the engine reported."""

from __future__ import annotations

from pathlib import Path

from agent_replay.engines.sim import SimServer
from agent_replay.replay.record import Recorder
from agent_replay.traces.io import read_trace

KEY = "sk-test-DO-NOT-RECORD-4f9a2c"
MODEL = "sim-fast"


async def test_openai_and_anthropic_sdks(tmp_path: Path) -> None:
    import anthropic
    import openai

    seen: list[tuple[str, int, int]] = []  # (api, prompt tokens, completion tokens) per SDK
    async with (
        SimServer("fast", seed=1) as sim,
        Recorder(
            sim.url, "127.0.0.1:0", tmp_path / "trace", flush_interval_s=60, content="full"
        ) as rec,
    ):
        oa = openai.AsyncOpenAI(base_url=rec.url + "/v1", api_key=KEY, max_retries=0)
        msgs = [{"role": "user", "content": "write a haiku"}]
        r = await oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12)  # type: ignore[arg-type]
        assert r.usage is not None and r.choices[0].message.content
        seen.append(("chat", r.usage.prompt_tokens, r.usage.completion_tokens))

        # a stream that did not ask for usage: the SDK must not see the injected usage chunk
        chunks = [
            c
            async for c in await oa.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=12, stream=True
            )
        ]  # type: ignore[arg-type]
        assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
        seen.append(("chat", -1, -1))

        chunks = [
            c
            async for c in await oa.chat.completions.create(
                model=MODEL,
                messages=msgs,
                max_tokens=12,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )
        ]
        assert chunks[-1].usage is not None and chunks[-1].choices == []
        seen.append(("chat", chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens))

        c = await oa.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=9)
        assert c.usage is not None
        seen.append(("completions", c.usage.prompt_tokens, c.usage.completion_tokens))
        cs = [
            x
            async for x in await oa.completions.create(
                model=MODEL,
                prompt="hello there",
                max_tokens=9,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        assert cs[-1].usage is not None
        seen.append(("completions", cs[-1].usage.prompt_tokens, cs[-1].usage.completion_tokens))

        an = anthropic.AsyncAnthropic(base_url=rec.url, api_key=KEY, max_retries=0)
        m = await an.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        assert m.content
        seen.append(("messages", m.usage.input_tokens, m.usage.output_tokens))
        async with an.messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as st:
            text = "".join([t async for t in st.text_stream])
            final = await st.get_final_message()
        assert text
        seen.append(("messages", final.usage.input_tokens, final.usage.output_tokens))
        await oa.close()
        await an.close()
    table, meta = read_trace(tmp_path / "trace")
    rows = sorted(table.to_pylist(), key=lambda r: r["arrival_ns"])
    assert meta.content_mode == "full"
    assert [r["api"] for r in rows] == [s[0] for s in seen]
    for row, (api, p, c) in zip(rows, seen, strict=True):
        assert row["error"] is None and row["model"] == MODEL
        if p >= 0:
            assert (row["input_tokens"], row["output_tokens"]) == (p, c), api
        assert row["end_ns"] >= (row["ttft_ns"] or 0) > 0 or not row["stream"]
        if row["stream"]:
            assert row["ttft_ns"] > 0 and len(row["chunk_gaps_ns"]) >= 1
            assert sum(row["chunk_gaps_ns"]) <= row["end_ns"]
        assert KEY not in (row["content"] or "")
    # the stream that did not ask for usage is still recorded with exact counts
    assert rows[1]["output_tokens"] >= 1 and rows[1]["input_tokens"] == rows[0]["input_tokens"]
    # everything written is free of the key
    for f in (tmp_path / "trace").iterdir():
        assert KEY.encode() not in f.read_bytes()
