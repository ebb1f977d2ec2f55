"""OpenTelemetry imports: OTLP JSON files built here by hand from the specifications (GenAI
semantic conventions, OpenInference, Claude Code's and Codex's log events)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from agent_replay.errors import TraceError
from agent_replay.traces.importers import ImportOptions, detect, import_paths
from agent_replay.traces.stats import implied_cached_tokens

S = 1_000_000_000  # ns per second
T0 = 1_760_000_000 * S


def attr(key: str, v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"key": key, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": key, "value": {"intValue": str(v)}}
    if isinstance(v, float):
        return {"key": key, "value": {"doubleValue": v}}
    return {"key": key, "value": {"stringValue": v}}


def span(
    sid: str,
    name: str,
    start_s: float,
    end_s: float,
    parent: str | None = None,
    trace: str = "t" * 32,
    events: list[dict[str, Any]] | None = None,
    **attrs: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": trace,
        "spanId": sid,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(T0 + round(start_s * S)),
        "endTimeUnixNano": str(T0 + round(end_s * S)),
        "attributes": [attr(k.replace("__", "."), v) for k, v in attrs.items()],
    }
    if parent:
        out["parentSpanId"] = parent
    if events:
        out["events"] = events
    return out


def export(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attr("service.name", "agent")]},
                "scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}],
            }
        ]
    }


def lines(path: Path, *exports: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in exports))
    return path


def chat(
    sid: str,
    start: float,
    end: float,
    parent: str,
    n_in: int,
    n_out: int,
    cached: int | None = None,
    **more: Any,
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai__operation__name": "chat",
        "gen_ai__request__model": "m",
        "gen_ai__usage__input_tokens": n_in,
        "gen_ai__usage__output_tokens": n_out,
    }
    if cached is not None:
        attrs["gen_ai__usage__cache_read__input_tokens"] = cached
    attrs.update(more)
    return span(sid, "chat m", start, end, parent, **attrs)


def agent(
    sid: str, start: float, end: float, parent: str | None, name: str, **more: Any
) -> dict[str, Any]:
    return span(
        sid,
        f"invoke_agent {name}",
        start,
        end,
        parent,
        gen_ai__operation__name="invoke_agent",
        gen_ai__agent__name=name,
        **more,
    )


def tool(sid: str, start: float, end: float, parent: str) -> dict[str, Any]:
    return span(
        sid,
        "execute_tool grep",
        start,
        end,
        parent,
        gen_ai__operation__name="execute_tool",
        gen_ai__tool__name="grep",
    )


def rows(res: Any) -> list[dict[str, Any]]:
    return sorted(res.table.to_pylist(), key=lambda r: r["arrival_ns"])


def hasher(bs: int) -> Any:
    from agent_replay.replay.record.content import PromptHasher

    return PromptHasher(bs, secrets.randbits(63))


# A main agent: chat, a tool, chat, a subagent of two chats, then chat after the subagent.
GENAI = [
    export(
        agent("a0000000000000a0", 0, 10, None, "coder", gen_ai__conversation__id="conv-1"),
        chat(
            "c000000000000001",
            0.0,
            1.0,
            "a0000000000000a0",
            1000,
            50,
            0,
            gen_ai__response__time_to_first_chunk=0.25,
        ),
        tool("e000000000000001", 1.0, 2.9, "a0000000000000a0"),
        chat("c000000000000002", 3.0, 4.0, "a0000000000000a0", 1200, 60, 992),
    ),
    export(
        agent("a0000000000000b0", 4.0, 7.5, "a0000000000000a0", "explorer"),
        chat("c000000000000003", 4.1, 5.0, "a0000000000000b0", 300, 20, 0),
        chat("c000000000000004", 5.5, 7.0, "a0000000000000b0", 400, 30, 288),
        chat("c000000000000005", 8.5, 9.0, "a0000000000000a0", 1500, 70, 1184),
    ),
]


def test_genai_spans_agents_times_and_tokens(tmp_path: Path) -> None:
    p = lines(tmp_path / "spans.jsonl", *GENAI)
    assert detect(p) == "otel"
    res = import_paths([p])
    r = rows(res)
    assert res.format == "otel" and len(r) == 5
    assert {x["session_id"] for x in r} == {"conv-1"}  # the agent's conversation id
    assert [x["arrival_ns"] for x in r] == [0, 3 * S, 4_100_000_000, 5_500_000_000, 8_500_000_000]
    assert [x["end_ns"] for x in r] == [S, S, 900_000_000, 1_500_000_000, 500_000_000]
    assert r[0]["ttft_ns"] == 250_000_000 and r[1]["ttft_ns"] is None
    assert [x["input_tokens"] for x in r] == [1000, 1200, 300, 400, 1500]
    assert [x["output_tokens"] for x in r] == [50, 60, 20, 30, 70]
    assert [x["cached_tokens"] for x in r] == [0, 992, 0, 288, 1184]
    sub = "explorer-a0000000"
    assert [x["agent_id"] for x in r] == ["main", "main", sub, sub, "main"]
    idx = {x["arrival_ns"]: x["request_index"] for x in r}
    # the subagent starts from the main agent's latest request; the main agent's next
    # request waits for the subagent's last one
    assert r[2]["depends_on"] == [idx[3 * S]]
    assert r[4]["depends_on"] == sorted([idx[3 * S], idx[5_500_000_000]])
    assert r[4]["parent_index"] == idx[3 * S]
    # think time: the tool's gap (1 s to 3 s); after the subagent: 8.5 - 7.0
    assert r[1]["think_ns"] == 2 * S and r[4]["think_ns"] == 1_500_000_000
    assert r[3]["think_ns"] == 500_000_000
    # hash ids from cache counts: cached tokens are the parent's leading blocks
    assert res.meta.extra["hash_ids_from"] == "cache counts"
    h = [x["hash_ids"] for x in r]
    assert len(h[1]) == 75 and h[1][:62] == h[0][:62] and h[1][62] != h[0][62]
    assert h[4][:74] == h[1][:74] and h[4][74] not in h[1]
    assert h[3][:18] == h[2][:18] and h[3][18] != h[2][18]
    assert not set(h[2]) & set(h[0])
    # so a prefix cache replaying the trace hits what the server reported, block for block
    assert implied_cached_tokens(res.table, 16).tolist() == [0, 992, 0, 288, 1184]


def test_single_pretty_body_and_openinference(tmp_path: Path) -> None:
    first = {"timeUnixNano": str(T0 + 300_000_000), "name": "First Token Stream Event"}
    body = export(
        span(
            "b000000000000001",
            "Agent",
            0,
            6,
            None,
            openinference__span__kind="AGENT",
            session__id="sess-9",
        ),
        span(
            "b000000000000002",
            "ChatCompletion",
            0,
            2,
            "b000000000000001",
            events=[first],
            openinference__span__kind="LLM",
            llm__model_name="gpt-x",
            llm__token_count__prompt=640,
            llm__token_count__completion=12,
            llm__token_count__prompt_details__cache_read=0,
        ),
        span(
            "b000000000000003",
            "run_tests",
            2,
            3,
            "b000000000000001",
            openinference__span__kind="TOOL",
        ),
        span(
            "b000000000000004",
            "ChatCompletion",
            3.5,
            5,
            "b000000000000001",
            openinference__span__kind="LLM",
            llm__model_name="gpt-x",
            llm__token_count__prompt=700,
            llm__token_count__completion=8,
            llm__token_count__prompt_details__cache_read=640,
        ),
    )
    p = tmp_path / "body.json"
    p.write_text(json.dumps(body, indent=2))  # an OTLP/HTTP body, pretty-printed
    res = import_paths([p])
    r = rows(res)
    assert [x["session_id"] for x in r] == ["sess-9", "sess-9"]
    assert [x["input_tokens"] for x in r] == [640, 700]
    assert [x["cached_tokens"] for x in r] == [0, 640]
    assert r[0]["ttft_ns"] == 300_000_000 and r[0]["model"] == "gpt-x"
    assert r[1]["parent_index"] == 0 and r[1]["think_ns"] == 1_500_000_000
    assert r[1]["hash_ids"][:40] == r[0]["hash_ids"]
    assert any("1 tool spans" in n for n in res.notes)


def test_trace_id_is_the_session_without_a_conversation_id(tmp_path: Path) -> None:
    p = lines(
        tmp_path / "s.jsonl",
        export(
            span(
                "d000000000000001",
                "chat",
                0,
                1,
                None,
                trace="1" * 32,
                gen_ai__operation__name="chat",
                gen_ai__usage__input_tokens=10,
                gen_ai__usage__output_tokens=2,
            ),
            span(
                "d000000000000002",
                "chat",
                0,
                1,
                None,
                trace="2" * 32,
                gen_ai__operation__name="text_completion",
                gen_ai__usage__input_tokens=20,
                gen_ai__usage__output_tokens=3,
            ),
        ),
    )
    r = rows(import_paths([p]))
    assert sorted(x["session_id"] for x in r) == ["1" * 32, "2" * 32]


def test_captured_prompts_hash_as_the_recorder_does(tmp_path: Path) -> None:
    system = json.dumps([{"type": "text", "content": "You are a careful coder. " * 40}])
    m1 = [{"role": "user", "parts": [{"type": "text", "content": "fix the bug " * 60}]}]
    m2 = [
        *m1,
        {"role": "assistant", "parts": [{"type": "text", "content": "done " * 30}]},
        {"role": "user", "parts": [{"type": "text", "content": "now the tests " * 50}]},
    ]
    p = lines(
        tmp_path / "c.jsonl",
        export(
            chat(
                "c100000000000001",
                0,
                1,
                "",
                600,
                10,
                None,
                gen_ai__system_instructions=system,
                gen_ai__input__messages=json.dumps(m1),
            ),
            chat(
                "c100000000000002",
                2,
                3,
                "",
                900,
                10,
                None,
                gen_ai__system_instructions=system,
                gen_ai__input__messages=json.dumps(m2),
            ),
        ),
    )
    res = import_paths([p], options=ImportOptions(block_size=16, prompt_hasher=hasher))
    r = rows(res)
    assert res.meta.extra["hash_ids_from"] == "content"
    assert [len(x["hash_ids"]) for x in r] == [38, 57]
    # the second prompt starts with the first: it shares all of the first's blocks (the
    # partial last one too, as the recorder's hasher does); the rest are new
    h0, h1 = r[0]["hash_ids"], r[1]["hash_ids"]
    assert h1[:38] == h0 and not set(h1[38:]) & set(h0)
    # without a hasher the prompts are not used, and the note says so
    res = import_paths([p])
    assert res.meta.extra["hash_ids_from"] == "token counts"  # no cache counts either
    assert any("unused" in n for n in res.notes)


def http_span(sid: str, start: float, end: float, parent: str) -> dict[str, Any]:
    """An HTTP client span (opentelemetry-instrumentation-httpx) under a request span."""
    return span(
        sid,
        "POST",
        start,
        end,
        parent,
        http__request__method="POST",
        url__full="http://127.0.0.1:8000/v1/chat/completions",
    )


def test_an_http_client_child_span_is_the_send(tmp_path: Path) -> None:
    # the LLM span opens 12 ms before the HTTP request leaves (the client builds it); a
    # retry's second HTTP span is the one whose response came back
    p = lines(
        tmp_path / "h.jsonl",
        export(
            chat(
                "c200000000000001",
                0.0,
                1.0,
                "",
                1000,
                50,
                None,
                gen_ai__response__time_to_first_chunk=0.25,
            ),
            http_span("e200000000000001", 0.012, 0.99, "c200000000000001"),
            chat("c200000000000002", 2.0, 3.0, "", 1100, 50, None),
            http_span("e200000000000002", 2.010, 2.2, "c200000000000002"),
            http_span("e200000000000003", 2.500, 2.99, "c200000000000002"),
            chat("c200000000000003", 4.0, 5.0, "", 1200, 50, None),
            http_span("e200000000000004", 5.5, 5.6, "c200000000000003"),
        ),
    )  # outside its parent
    res = import_paths([p])
    r = rows(res)
    assert [x["arrival_ns"] for x in r] == [0, 2_488_000_000, 3_988_000_000]
    assert [x["end_ns"] for x in r] == [988_000_000, 500_000_000, S]
    assert r[0]["ttft_ns"] == 238_000_000  # from the span's start, now from the send
    assert (
        "2 requests sent when their HTTP client span started (the rest: when their LLM "
        "span started)" in res.notes
    )
    assert {x["parent_index"] for x in r[1:]} == {0, 1}  # still one stream


def _cc_span(
    sid: str,
    start: float,
    end: float,
    n_in: int,
    *,
    parent: str = "",
    attempt: float | None = None,
    agent: str | None = None,
    parent_agent: str | None = None,
    read: int = 0,
) -> dict[str, Any]:
    """Claude Code's ``claude_code.llm_request`` span (enhanced telemetry)."""
    more: dict[str, Any] = {"agent_id": agent} if agent else {}
    if parent_agent:
        more["parent_agent_id"] = parent_agent
    ev = (
        [
            {
                "timeUnixNano": str(T0 + round(attempt * S)),
                "name": "gen_ai.request.attempt",
                "attributes": [attr("attempt", 1)],
            }
        ]
        if attempt is not None
        else None
    )
    return span(
        sid,
        "claude_code.llm_request",
        start,
        end,
        parent or None,
        events=ev,
        span__type="llm_request",
        session__id="s-7",
        model="claude-x",
        gen_ai__system="anthropic",
        input_tokens=n_in,
        output_tokens=20,
        cache_read_tokens=read,
        cache_creation_tokens=0,
        ttft_ms=150.5,
        duration_ms=round((end - start) * 1000),
        **more,
    )


def test_claude_code_llm_request_spans(tmp_path: Path) -> None:
    # the main agent's turn; a subagent's two turns; a nested subagent of that one; the
    # main agent's next turn. The api_request events of the same session are read from the
    # spans instead (they say less: whole milliseconds, no agent id)
    p = lines(
        tmp_path / "cc.jsonl",
        export(
            _cc_span("c300000000000001", 0.0, 1.0, 4000, attempt=0.004),
            span(
                "e300000000000001",
                "claude_code.tool",
                1.0,
                6.0,
                None,
                span__type="tool",
                tool_name="Agent",
            ),
            _cc_span(
                "c300000000000002",
                1.5,
                2.0,
                3000,
                attempt=1.5023,
                agent="a1",
                parent="e300000000000001",
            ),
            _cc_span("c300000000000003", 2.5, 3.0, 3100, attempt=2.501, agent="a1", read=2992),
            _cc_span(
                "c300000000000004", 3.2, 3.6, 500, attempt=3.203, agent="a2", parent_agent="a1"
            ),
            _cc_span("c300000000000006", 4.0, 4.5, 3300, attempt=4.001, agent="a1", read=3088),
            _cc_span("c300000000000005", 7.0, 8.0, 4200, attempt=7.001, read=3984),
        ),
        logs(
            claude_event(
                1.0,
                session__id="s-7",
                input_tokens=4000,
                output_tokens=20,
                cache_read_tokens=0,
                cache_creation_tokens=0,
                duration_ms=1000,
            )
        ),
    )
    res = import_paths([p])
    r = rows(res)
    # arrival: the attempt event's time (the trace starts at the first, 4 ms in)
    assert [x["arrival_ns"] for x in r] == [
        0,
        1_498_300_000,
        2_497_000_000,
        3_199_000_000,
        3_997_000_000,
        6_997_000_000,
    ]
    assert [x["input_tokens"] for x in r] == [4000, 3000, 3100, 500, 3300, 4200]
    assert [x["cached_tokens"] for x in r] == [0, 0, 2992, 0, 3088, 3984]
    # ttft_ms counts from the span's start: 150.5 ms less the setup before the attempt
    assert [x["ttft_ns"] for x in r] == [
        146_500_000,
        148_200_000,
        149_500_000,
        147_500_000,
        149_500_000,
        149_500_000,
    ]
    assert [x["api"] for x in r] == ["messages"] * 6
    a1, a2 = "agent-a1", "agent-a2"
    assert [x["agent_id"] for x in r] == ["main", a1, a1, a2, a1, "main"]
    # the subagent is spawned by main's turn, the nested one by the subagent's latest;
    # each enclosing agent's next turn waits for its subagent's last
    assert [x["parent_index"] for x in r] == [-1, 0, 1, 2, 2, 0]
    assert [sorted(x["depends_on"]) for x in r] == [[], [0], [1], [2], [2, 3], [0, 4]]
    assert "sources: claude-code events, claude-code spans; 7 spans read" in res.notes


def logs(*records: dict[str, Any], service: str = "claude-code") -> dict[str, Any]:
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": [attr("service.name", service)]},
                "scopeLogs": [{"scope": {"name": service}, "logRecords": list(records)}],
            }
        ]
    }


def claude_event(t_s: float, **attrs: Any) -> dict[str, Any]:
    ts = T0 + round(t_s * S)
    iso = f"2025-10-09T08:53:{20 + t_s:09.6f}Z"
    return {
        "timeUnixNano": str(ts),
        "body": {"stringValue": "claude_code.api_request"},
        "attributes": [
            attr("event.name", "api_request"),
            attr("event.timestamp", iso),
            *(attr(k.replace("__", "."), v) for k, v in attrs.items()),
        ],
    }


def test_claude_code_api_request_events(tmp_path: Path) -> None:
    # Claude Code sends the counts as strings
    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            claude_event(
                2.0,
                session__id="s-1",
                prompt__id="p-1",
                model="claude-x",
                input_tokens="12",
                output_tokens="80",
                cache_read_tokens="0",
                cache_creation_tokens="4000",
                duration_ms="1500",
            ),
            claude_event(
                6.0,
                session__id="s-1",
                prompt__id="p-1",
                model="claude-x",
                input_tokens="30",
                output_tokens="40",
                cache_read_tokens="4000",
                cache_creation_tokens="90",
                duration_ms="2000",
            ),
            {
                "timeUnixNano": str(T0),
                "body": {"stringValue": "claude_code.user_prompt"},
                "attributes": [attr("event.name", "user_prompt"), attr("session.id", "s-1")],
            },
        ),
    )
    res = import_paths([p])
    r = rows(res)
    assert [x["input_tokens"] for x in r] == [4012, 4120]
    assert [x["cached_tokens"] for x in r] == [0, 4000]
    assert [x["output_tokens"] for x in r] == [80, 40]
    # arrival = the event's time - duration_ms
    assert [x["arrival_ns"] for x in r] == [0, 3_500_000_000]
    assert [x["end_ns"] for x in r] == [1_500_000_000, 2 * S]
    assert r[1]["parent_index"] == 0 and r[1]["think_ns"] == 2 * S
    assert [x["api"] for x in r] == ["messages", "messages"]
    assert r[1]["hash_ids"][:250] == r[0]["hash_ids"][:250]
    # cache reads above the request's own count: Anthropic's uncached counts
    assert any(
        "the uncached part (Anthropic's API: cache reads and writes added) in 1 sessions" in n
        for n in res.notes
    )


def _cc(seq: int, t_s: float, name: str, **attrs: Any) -> dict[str, Any]:
    ts = T0 + round(t_s * S)
    return {
        "timeUnixNano": str(ts),
        "body": {"stringValue": f"claude_code.{name}"},
        "attributes": [
            attr("event.name", name),
            attr("session.id", "s-3"),
            attr("event.sequence", seq),
            *(attr(k.replace("__", "."), v) for k, v in attrs.items()),
        ],
    }


def _call(seq: int, t: float, n_in: int, sub: str | None = None) -> dict[str, Any]:
    more = (
        {"agent__name": sub, "query_source": f"agent:builtin:{sub}"}
        if sub
        else {"query_source": "sdk"}
    )
    return _cc(
        seq,
        t,
        "api_request",
        input_tokens=n_in,
        output_tokens=10,
        cache_read_tokens=0,
        cache_creation_tokens=0,
        duration_ms=500,
        **more,
    )


def test_claude_code_subagents_from_its_events(tmp_path: Path) -> None:
    # main asks for an Agent call (its tool_decision is logged before the turn's
    # api_request); the subagent runs two turns, one of which spawns a nested subagent;
    # the nested one returns, then the first, then main goes on
    spawn = {"tool_name": "Agent", "decision": "accept"}
    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            _cc(1, 1.0, "tool_decision", tool_use_id="toolu_A0000001", **spawn),
            _call(2, 1.0, 1000),  # main 0.5-1.0, calls Agent A
            _cc(3, 2.0, "tool_decision", tool_use_id="toolu_B0000002", **spawn),
            _call(4, 2.0, 300, "explore"),  # A 1.5-2.0, calls Agent B
            _call(5, 3.0, 200, "explore"),  # B 2.5-3.0
            _cc(6, 3.1, "tool_result", tool_name="Agent", tool_use_id="toolu_B0000002"),
            _call(7, 4.0, 400, "explore"),  # A 3.5-4.0
            _cc(8, 4.1, "tool_result", tool_name="Agent", tool_use_id="toolu_A0000001"),
            _call(9, 5.0, 1100),
        ),
    )  # main 4.5-5.0
    r = rows(import_paths([p]))
    assert [x["agent_id"] for x in r] == [
        "main",
        "explore-A0000001",
        "explore-B0000002",
        "explore-A0000001",
        "main",
    ]
    assert [x["depends_on"] for x in r] == [[], [0], [1], [1, 2], [0, 3]]
    assert [x["parent_index"] for x in r] == [-1, 0, 1, 1, 0]
    # main waits from the first subagent's return (its last turn's end, 4.0) to 4.5
    assert r[4]["think_ns"] == 500_000_000


def test_claude_code_side_by_side_subagents_stay_one_stream(tmp_path: Path) -> None:
    spawn = {"tool_name": "Agent", "decision": "accept"}
    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            _cc(1, 1.0, "tool_decision", tool_use_id="toolu_A", **spawn),
            _cc(2, 1.0, "tool_decision", tool_use_id="toolu_B", **spawn),
            _call(3, 1.0, 1000),
            _call(4, 2.0, 300, "explore"),
            _call(5, 2.1, 300, "explore"),
            _cc(6, 3.1, "tool_result", tool_name="Agent", tool_use_id="toolu_A"),
            _cc(7, 3.2, "tool_result", tool_name="Agent", tool_use_id="toolu_B"),
            _call(8, 5.0, 1100),
        ),
    )
    res = import_paths([p])
    # the two subagent turns ran side by side (1.5-2.0 and 1.6-2.1): the second runs in a
    # lane of its own, as the recorder's main/2, and main's next turn waits for both
    assert [x["agent_id"] for x in rows(res)] == ["main", "main", "main/2", "main"]
    assert [x["parent_index"] for x in rows(res)] == [-1, 0, -1, 1]
    assert [x["depends_on"] for x in rows(res)] == [[], [0], [], [1, 2]]
    assert (
        "1 Claude Code sessions ran subagents side by side, which its events do not tell "
        "apart: one stream each" in res.notes
    )


def test_claude_code_events_that_name_their_agent(tmp_path: Path) -> None:
    # Claude Code 2.1.3xx's events name the agent (agent_id, parent_agent_id): a
    # background subagent starts while main sends its next turn, and nests another
    def call(
        t: float, n_in: int, agent: str | None = None, parent: str | None = None, read: int = 0
    ) -> dict[str, Any]:
        more = {"agent_id": agent, "agent__name": "general-purpose"} if agent else {}
        if parent:
            more["parent_agent_id"] = parent
        return claude_event(
            t,
            session__id="s-8",
            input_tokens=n_in,
            output_tokens=9,
            cache_read_tokens=read,
            cache_creation_tokens=0,
            duration_ms=400,
            query_source="agent:builtin:general-purpose" if agent else "sdk",
            **more,
        )

    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            call(0.4, 12000),
            call(1.4, 12300, read=11984),
            call(1.41, 7000, "a1"),
            call(2.0, 8000, "a2", "a1"),
            call(3.0, 8200, "a2", "a1", read=7984),
            call(4.0, 7300, "a1", read=6992),
            call(5.0, 13000, read=12288),
        ),
    )
    r = rows(import_paths([p]))
    assert [x["agent_id"] for x in r] == [
        "main",
        "main",
        "agent-a1",
        "agent-a2",
        "agent-a2",
        "agent-a1",
        "main",
    ]
    # the subagent is spawned by main's turn that had ended (not the one still running)
    assert [x["depends_on"] for x in r] == [[], [0], [0], [2], [3], [2, 4], [1, 5]]


def _api_request(
    session: str, end: float, dur_ms: int, n_in: int, source: str, agent: str | None = None
) -> dict[str, Any]:
    """A Claude Code ``api_request`` event of 9 output tokens and no cache, ended at ``end``
    s; ``agent``: a subagent's (2.1.3xx names it)."""
    more = {"agent_id": agent, "agent__name": "general-purpose"} if agent else {}
    return claude_event(
        end,
        session__id=session,
        input_tokens=n_in,
        output_tokens=9,
        cache_read_tokens=0,
        cache_creation_tokens=0,
        duration_ms=dur_ms,
        query_source=source,
        **more,
    )


def test_claude_code_session_title_is_a_side_request(tmp_path: Path) -> None:
    # Claude Code asks for the session's title beside the first turn: nothing waits for it
    def call(t: float, dur_ms: int, n_in: int, source: str) -> dict[str, Any]:
        return _api_request("s-4", t, dur_ms, n_in, source)

    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            call(0.4, 400, 419, "generate_session_title"),
            call(1.1, 1000, 20000, "sdk"),
            call(2.0, 300, 20100, "sdk"),
            call(3.0, 300, 20200, "sdk"),
        ),
    )
    r = rows(import_paths([p]))
    assert [x["agent_id"] for x in r] == ["main", "main/2", "main/2", "main/2"]
    # the turns after the title came back wait for the turn before, not for the title
    assert [x["depends_on"] for x in r] == [[], [], [1], [2]]


def test_a_subagent_is_never_spawned_by_the_session_title(tmp_path: Path) -> None:
    # the title request (sent 0.0 s) came back at 1.5 s, after the first turn (0.05-1.0 s)
    # whose reply made the Agent call: the subagent's first request (1.6 s) is spawned by
    # that turn, the one of its agent that ended last before it but for the side request
    def call(
        end: float, dur_ms: int, n_in: int, source: str, agent: str | None = None
    ) -> dict[str, Any]:
        return _api_request("s-9", end, dur_ms, n_in, source, agent)

    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            call(1.5, 1500, 419, "generate_session_title"),
            call(1.0, 950, 20000, "sdk"),
            call(2.0, 400, 7000, "agent:builtin:general-purpose", "a1"),
            call(3.0, 400, 20300, "sdk"),
        ),
    )
    r = rows(import_paths([p]))
    assert [x["input_tokens"] for x in r] == [419, 20000, 7000, 20300]
    assert [x["agent_id"] for x in r][2] == "agent-a1"
    assert r[2]["depends_on"] == [1]
    assert 0 not in r[3]["depends_on"]


def test_claude_code_title_span_is_a_side_request_by_its_event(tmp_path: Path) -> None:
    # Claude Code 2.1.1xx's spans carry no query_source: the session is read from its
    # spans, and the span whose api_request event says generate_session_title (same
    # counts, ended within a second) is the side request; a look-alike in another
    # session and one of other counts are not
    def ev(t: float, n_in: int, source: str, session: str = "s-7") -> dict[str, Any]:
        return claude_event(
            t,
            session__id=session,
            input_tokens=n_in,
            output_tokens=20,
            cache_read_tokens=0,
            cache_creation_tokens=0,
            duration_ms=300,
            query_source=source,
        )

    p = lines(
        tmp_path / "cc.jsonl",
        export(
            _cc_span("c300000000000001", 0.0, 0.4, 419, attempt=0.004),
            _cc_span("c300000000000002", 0.05, 1.0, 20000, attempt=0.06),
            _cc_span("c300000000000003", 2.0, 3.0, 20100, attempt=2.001),
            _cc_span("c300000000000004", 4.0, 5.0, 20200, attempt=4.001),
        ),
        logs(
            ev(0.4003, 419, "generate_session_title"),
            ev(1.0004, 20000, "sdk"),
            ev(3.0, 20100, "sdk"),
            ev(5.0, 20200, "sdk"),
            ev(5.0, 20200, "generate_session_title", session="s-other"),
            ev(3.0, 777, "generate_session_title"),
        ),
    )
    r = [x for x in rows(import_paths([p])) if x["session_id"] == "s-7"]
    assert [x["input_tokens"] for x in r] == [419, 20000, 20100, 20200]
    # the turns wait for the turn before, never for the title
    assert [x["depends_on"] for x in r] == [[], [], [1], [2]]
    assert [x["agent_id"] for x in r] == ["main", "main/2", "main/2", "main/2"]


def test_claude_code_events_from_a_whole_prompt_server(tmp_path: Path) -> None:
    # vLLM (and the simulated engine) count the whole prompt in input_tokens on the
    # Messages API too: the cache reads never exceed it nor the previous prompt
    p = lines(
        tmp_path / "cc.jsonl",
        logs(
            claude_event(
                1.0,
                session__id="s-2",
                input_tokens=4000,
                output_tokens=9,
                cache_read_tokens=0,
                cache_creation_tokens=0,
                duration_ms=100,
            ),
            claude_event(
                3.0,
                session__id="s-2",
                input_tokens=4100,
                output_tokens=9,
                cache_read_tokens=3968,
                cache_creation_tokens=0,
                duration_ms=100,
            ),
        ),
    )
    res = import_paths([p])
    assert [x["input_tokens"] for x in rows(res)] == [4000, 4100]
    assert [x["cached_tokens"] for x in rows(res)] == [0, 3968]
    assert any(
        "the uncached part (Anthropic's API: cache reads and writes added) in 0 "
        "sessions, the whole prompt (a vLLM-like server) in 1" in n
        for n in res.notes
    )


def test_codex_sse_events(tmp_path: Path) -> None:
    def rec(t: float, name: str, **attrs: Any) -> dict[str, Any]:
        return {
            "timeUnixNano": str(T0 + round(t * S)),
            "attributes": [
                attr("event.name", name),
                attr("conversation.id", "cv"),
                attr("model", "gpt-5-codex"),
                *(attr(k.replace("__", "."), v) for k, v in attrs.items()),
            ],
        }

    p = lines(
        tmp_path / "codex.jsonl",
        logs(
            rec(0.4, "codex.api_request", duration_ms=400, http__response__status_code=200),
            rec(3.0, "codex.sse_event", event__kind="response.output_text.delta"),
            rec(
                3.1,
                "codex.sse_event",
                event__kind="response.completed",
                input_token_count=5000,
                output_token_count=300,
                cached_token_count=0,
                reasoning_token_count=100,
            ),
            rec(5.5, "codex.api_request", duration_ms=500),
            rec(
                7.0,
                "codex.sse_event",
                event__kind="response.completed",
                input_token_count=5400,
                output_token_count=100,
                cached_token_count=5248,
            ),
            service="codex_cli_rs",
        ),
    )
    r = rows(import_paths([p]))
    assert [x["arrival_ns"] for x in r] == [0, 5 * S]
    assert [x["end_ns"] for x in r] == [3_100_000_000, 2 * S]
    assert [x["input_tokens"] for x in r] == [5000, 5400]
    assert [x["cached_tokens"] for x in r] == [0, 5248]
    assert {x["session_id"] for x in r} == {"cv"} and r[0]["api"] == "responses"


def test_codex_endpoint_span_named_by_its_api_request(tmp_path: Path) -> None:
    # with Codex's trace_exporter on, its api_request record names the endpoint span it
    # was logged in: the span's start, to the nanosecond, is the send
    def rec(t: float, name: str, span_id: str = "", **attrs: Any) -> dict[str, Any]:
        out = {
            "timeUnixNano": "0",
            "spanId": span_id,
            "attributes": [
                attr("event.name", name),
                attr("conversation.id", "cv"),
                attr("event.timestamp", f"2025-10-09T08:53:{20 + t:06.3f}Z"),
                *(attr(k.replace("__", "."), v) for k, v in attrs.items()),
            ],
        }
        return out

    endpoint = span(
        "8500a194d55989c0",
        "endpoint_session.stream_encoded_json_with",
        0.3997,
        0.8,
        "49b32e2e765eeb4f",
        http__method="POST",
        api__path="/responses",
    )
    p = lines(
        tmp_path / "codex.jsonl",
        export(endpoint),
        logs(
            rec(0.8, "codex.api_request", "8500a194d55989c0", duration_ms=400),
            rec(
                3.1,
                "codex.sse_event",
                event__kind="response.completed",
                input_token_count=5000,
                output_token_count=300,
                cached_token_count=0,
            ),
            rec(5.5, "codex.api_request", "1c4c70a042abc0a0", duration_ms=500),  # span not sent
            rec(
                7.0,
                "codex.sse_event",
                event__kind="response.completed",
                input_token_count=5400,
                output_token_count=100,
                cached_token_count=5248,
            ),
            service="codex_cli_rs",
        ),
    )
    res = import_paths([p])
    r = rows(res)
    iso0 = res.meta.start_wall_ns
    assert iso0 is not None and iso0 % 1_000_000 == 700_000  # the span's start, not whole ms
    assert [x["arrival_ns"] for x in r] == [0, 4_600_300_000]
    assert [x["end_ns"] for x in r] == [2_700_300_000, 2 * S]
    assert (
        "1 Codex requests sent when the endpoint span their api_request event names "
        "started (the rest: its time - duration_ms)" in res.notes
    )


# --- bad input: one line naming the span, the rest imported ---------------------------


def test_span_without_token_counts(tmp_path: Path) -> None:
    bad = span(
        "f000000000000001",
        "chat broken",
        1,
        2,
        None,
        gen_ai__operation__name="chat",
        gen_ai__usage__input_tokens=5,
    )
    p = lines(tmp_path / "x.jsonl", export(chat("c000000000000001", 0, 1, "", 10, 1), bad))
    res = import_paths([p])
    assert res.table.num_rows == 1
    assert (
        "  x.jsonl line 1: span f000000000000001 (chat broken): no output token count: "
        "skipped" in res.notes
    )


def test_span_ending_before_it_starts(tmp_path: Path) -> None:
    bad = chat("f000000000000002", 5, 4.5, "", 10, 1)
    p = lines(tmp_path / "x.jsonl", export(chat("c000000000000001", 0, 1, "", 10, 1)), export(bad))
    res = import_paths([p])
    assert res.table.num_rows == 1
    assert (
        "  x.jsonl line 2: span f000000000000002 (chat m): ends 500.000 ms before it "
        "starts: skipped" in res.notes
    )


def test_cycle_in_parent_ids(tmp_path: Path) -> None:
    p = lines(
        tmp_path / "x.jsonl",
        export(
            span(
                "a000000000000001",
                "invoke_agent x",
                0,
                9,
                "a000000000000002",
                gen_ai__operation__name="invoke_agent",
            ),
            span(
                "a000000000000002",
                "invoke_agent y",
                0,
                9,
                "a000000000000001",
                gen_ai__operation__name="invoke_agent",
            ),
            chat("c000000000000001", 1, 2, "a000000000000001", 10, 1),
            chat("c000000000000002", 3, 4, "", 10, 1),
        ),
    )
    res = import_paths([p])
    assert res.table.num_rows == 2
    assert {x["agent_id"] for x in rows(res)} == {"main"}
    assert (
        "  span c000000000000001 (chat m): its parent ids form a cycle: imported outside "
        "any agent, in its trace's session" in res.notes
    )


def test_garbled_line_is_named_and_skipped(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text(
        json.dumps(export(chat("c000000000000001", 0, 1, "", 10, 1)))
        + "\n"
        + '{"resourceSpans": [{"scopeSpans"\n'
    )
    res = import_paths([p])
    assert res.table.num_rows == 1
    assert any(n.startswith("  x.jsonl line 2: not valid JSON") for n in res.notes)


def test_nothing_usable_is_an_error_naming_the_file(tmp_path: Path) -> None:
    p = lines(tmp_path / "x.jsonl", export(span("f000000000000001", "GET /", 0, 1, None)))
    with pytest.raises(TraceError, match=r"x\.jsonl: no LLM spans"):
        import_paths([p])


_PEAK = """
import resource, sys
from agent_replay.traces.importers import import_paths
res = import_paths([sys.argv[1]])
print(res.table.num_rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print("\\n".join(res.notes))
"""


def _many_spans(path: Path, n_lines: int, per_line: int) -> None:
    """Traces of 100 spans each, a chain of HTTP spans, one in 100 a chat request and one
    in 1,000 a chat span without token counts."""
    plain = (
        '{{"traceId":"{t:032x}","spanId":"{s:016x}","parentSpanId":"{p}","name":"GET /",'
        '"startTimeUnixNano":"{a}","endTimeUnixNano":"{b}","attributes":[{{"key":'
        '"http.method","value":{{"stringValue":"GET"}}}}]}}'
    )
    llm = (
        '{{"traceId":"{t:032x}","spanId":"{s:016x}","parentSpanId":"{p}","name":"chat",'
        '"startTimeUnixNano":"{a}","endTimeUnixNano":"{b}","attributes":[{{"key":'
        '"gen_ai.operation.name","value":{{"stringValue":"chat"}}}},{{"key":'
        '"gen_ai.usage.input_tokens","value":{{"intValue":"100"}}}}{more}]}}'
    )
    out = ', {"key":"gen_ai.usage.output_tokens","value":{"intValue":"10"}}'
    k = 0
    with path.open("w") as fh:
        for _ in range(n_lines):
            spans = []
            for _ in range(per_line):
                k += 1
                f = dict(
                    t=k // 100,
                    s=k,
                    p=f"{k - 1:016x}" if k % 100 else "",
                    a=T0 + k * 1000,
                    b=T0 + k * 1000 + 500,
                )
                if k % 1000 == 7:
                    spans.append(llm.format(more="", **f))
                elif k % 100 == 50:
                    spans.append(llm.format(more=out, **f))
                else:
                    spans.append(plain.format(**f))
            fh.write(
                '{"resourceSpans":[{"resource":{},"scopeSpans":[{"spans":['
                + ",".join(spans)
                + "]}]}]}\n"
            )


@pytest.mark.slow
def test_a_million_spans_in_bounded_memory(tmp_path: Path) -> None:
    import subprocess
    import sys

    peaks = {}
    for n_lines in (100, 1000):
        p = tmp_path / f"spans-{n_lines}.jsonl"
        _many_spans(p, n_lines, 1000)
        run = subprocess.run(
            [sys.executable, "-c", _PEAK, str(p)], capture_output=True, text=True, check=True
        )
        first, *notes = run.stdout.splitlines()
        n_rows, peak_kb = map(int, first.split())
        assert n_rows == n_lines * 10
        assert f"sources: gen_ai; {n_lines * 1000:,} spans read" in notes
        # one line each for the first problems, then a count
        assert notes.count(f"{n_lines:,} problems, the rest imported:") == 1
        assert (
            f"  spans-{n_lines}.jsonl line 1: span 0000000000000007 (chat): no output "
            "token count: skipped" in notes
        )
        assert notes[-1] == f"  ... and {n_lines - 20:,} more"
        peaks[n_lines] = peak_kb
        p.unlink()
    # 900,000 more spans (and 9,000 more requests) cost their 16-byte parent links and the
    # requests' rows, not their JSON: a dict of the links as strings took 200 MB more
    assert peaks[1000] - peaks[100] < 90_000, peaks
