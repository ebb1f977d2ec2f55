from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent_replay.errors import InputError, TraceError
from agent_replay.traces.importers import ImportOptions, detect, import_paths
from agent_replay.traces.importers.mooncake import infer_sessions
from agent_replay.traces.stats import implied_cached_tokens, prefix_reuse


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def rows(result: object) -> list[dict[str, object]]:
    return result.table.to_pylist()  # type: ignore[attr-defined]


# --- small fixtures of our own ---------------------------------------------------------

MOONCAKE = (
    "\n".join(
        json.dumps(r)
        for r in [
            {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 5]},
            {"timestamp": 3000, "input_length": 1600, "output_length": 7, "hash_ids": [0, 1, 3, 4]},
            {
                "timestamp": 6000,
                "input_length": 2100,
                "output_length": 9,
                "hash_ids": [0, 1, 3, 4, 6],
            },
        ]
    )
    + "\n"
)


def test_mooncake_sessions_from_prefix_chains(tmp_path: Path) -> None:
    res = import_paths([write(tmp_path / "m.jsonl", MOONCAKE)])
    assert res.format == "mooncake" and res.meta.block_size == 512
    r = rows(res)
    # row 2 extends row 0's two full blocks [0, 1]; row 3 extends row 2's three [0, 1, 3];
    # row 1 shares only block 0 (a shared system prompt): a session of its own
    assert [x["session_id"] for x in r] == ["mc-0", "mc-1", "mc-0", "mc-0"]
    assert [x["request_index"] for x in r] == [0, 0, 1, 2]
    assert [x["parent_index"] for x in r] == [-1, -1, 0, 1]
    assert [x["arrival_ns"] for x in r] == [0, 0, 3_000_000_000, 6_000_000_000]
    # row 3 finds row 2's three full blocks and its partial last one, which held 64 tokens
    # (1600 - 3 * 512): 3 * 512 + 64
    assert implied_cached_tokens(res.table, 512).tolist() == [0, 512, 1024, 1600]


def test_mooncake_popular_prefix_stops_linking() -> None:
    # six prompts of the same length sharing a 2-block context: siblings on a shared prompt,
    # none extends another by a block, so none links
    hashes = [[7, 8, 9]] + [[7, 8, 10 + i] for i in range(5)]
    assert infer_sessions(hashes, [1100] * 6, 512) == [-1] * 6
    # five continuations one block longer: the first MAX_CHILDREN (4) link, then it stops
    hashes = [[7, 8, 9]] + [[7, 8, 10 + i, 20 + i] for i in range(5)]
    assert infer_sessions(hashes, [1100] + [1600] * 5, 512) == [-1, 0, 0, 0, 0, -1]


def test_azure_keeps_100ns_digits(tmp_path: Path) -> None:
    p = write(
        tmp_path / "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319601,3180,8\n",
    )
    res = import_paths([p])
    assert res.format == "azure"
    assert [x["arrival_ns"] for x in rows(res)] == [0, 52_000_100]
    assert {x["session_id"] for x in rows(res)} == {"az-0", "az-1"}


def test_burstgpt_with_and_without_sessions(tmp_path: Path) -> None:
    plain = write(
        tmp_path / "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n7.5,GPT-4,50,0,50,API log\n",
    )
    res = import_paths([plain])
    assert res.format == "burstgpt"
    assert [(x["arrival_ns"], x["input_tokens"], x["parent_index"]) for x in rows(res)] == [
        (0, 100, -1),
        (2_500_000_000, 50, -1),
    ]
    sess = write(
        tmp_path / "s.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,"
        "Response tokens,Total tokens,Log Type\n"
        "10,s1,2,ChatGPT,100,20,120,Conversation log\n"
        "11,s2,1,ChatGPT,30,5,35,Conversation log\n"
        "15,s1,1,ChatGPT,140,9,149,Conversation log\n",
    )
    r = rows(import_paths([sess]))
    s1 = [x for x in r if x["session_id"] == "bg-s1"]
    assert [(x["request_index"], x["parent_index"]) for x in s1] == [(0, -1), (1, 0)]
    assert s1[1]["think_ns"] == 3_000_000_000  # 15 - (10 + 2)


def test_qwen_chat_trees(tmp_path: Path) -> None:
    lines = [
        {
            "chat_id": 1,
            "parent_chat_id": -1,
            "timestamp": 1.0,
            "input_length": 20,
            "output_length": 3,
            "type": "text",
            "turn": 1,
            "hash_ids": [11, 12],
        },
        {
            "chat_id": 2,
            "parent_chat_id": -1,
            "timestamp": 1.5,
            "input_length": 5,
            "output_length": 3,
            "type": "text",
            "turn": 1,
            "hash_ids": [13],
        },
        {
            "chat_id": 3,
            "parent_chat_id": 1,
            "timestamp": 2.25,
            "input_length": 40,
            "output_length": 3,
            "type": "text",
            "turn": 2,
            "hash_ids": [11, 12, 14],
        },
    ]
    res = import_paths([write(tmp_path / "q.jsonl", "\n".join(map(json.dumps, lines)))])
    assert res.format == "qwen" and res.meta.block_size == 16
    r = rows(res)
    assert [(x["session_id"], x["request_index"], x["parent_index"]) for x in r] == [
        ("qw-1", 0, -1),
        ("qw-2", 0, -1),
        ("qw-1", 1, 0),
    ]
    assert r[2]["arrival_ns"] == 1_250_000_000
    # chat 3 shares chat 1's first block; chat 1's second held 4 tokens (20 - 16), no
    # whole server block
    assert implied_cached_tokens(res.table, 16).tolist() == [0, 0, 16]


def test_lmcache_rebuilds_prompt_and_sorts(tmp_path: Path) -> None:
    a = "x" * 100
    lines = [
        {"timestamp": 3_000_000, "input": a + "y" * 20, "output": "O" * 8, "session_id": "s"},
        {"timestamp": 1_000_000, "input": a, "output": "o" * 40, "session_id": "s"},
    ]
    res = import_paths([write(tmp_path / "l.jsonl", "\n".join(map(json.dumps, lines)))])
    r = rows(res)
    assert res.format == "lmcache"
    # request 1's prompt = input_0 + output_0 + the new part of input_1 = 100 + 40 + 20 bytes
    assert [x["input_tokens"] for x in r] == [25, 40]
    assert [x["output_tokens"] for x in r] == [10, 2]
    assert [x["arrival_ns"] for x in r] == [0, 2_000_000_000]
    assert r[1]["parent_index"] == 0
    # 64-byte blocks: the first (100 // 64) = 1 full block of request 0 is shared
    assert implied_cached_tokens(res.table, 16).tolist() == [0, 16]


def test_lmcache_magagent_flattened_inputs_and_empty_rows(tmp_path: Path) -> None:
    # magagent: each input already holds the whole conversation, earlier outputs included
    sys_, out0 = "S" * 100, "answer-zero " * 4  # 48-byte output
    lines = [
        {"timestamp": 1_000_000, "input": sys_, "output": out0, "session_id": "m"},
        {
            "timestamp": 2_000_000,
            "input": "",
            "output": "o" * 8,
            "session_id": "m",
        },  # screenshot dropped
        {
            "timestamp": 3_000_000,
            "input": sys_ + out0 + "U" * 40,
            "output": "o" * 8,
            "session_id": "m",
        },
    ]
    res = import_paths([write(tmp_path / "m.jsonl", "\n".join(map(json.dumps, lines)))])
    r = rows(res)
    assert len(r) == 2  # the empty-input row is left out, not a 0-token prompt
    # prompt of row 2 = its input as it is: (100 + 48 + 40) / 4 bytes per token = 47, not
    # 47 + 12 (the output appended a second time)
    assert [x["input_tokens"] for x in r] == [25, 47]
    assert r[1]["parent_index"] == 0
    assert any("1 rows with an empty input left out" in n for n in res.notes)
    assert any("already holds the conversation" in n for n in res.notes)


def test_lmcache_taubench_two_llms_get_one_chain_each(tmp_path: Path) -> None:
    # taubench: the user simulator (U...) and the agent (A...) take turns under one session
    u, a = "U" * 64, "A" * 64
    lines = [
        {"timestamp": 1_000_000, "input": a, "output": "a1", "session_id": "t"},
        {"timestamp": 2_000_000, "input": u, "output": "u1", "session_id": "t"},
        {"timestamp": 3_000_000, "input": a + "q2", "output": "a2", "session_id": "t"},
        {"timestamp": 4_000_000, "input": u + "r2", "output": "u2", "session_id": "t"},
    ]
    res = import_paths([write(tmp_path / "t.jsonl", "\n".join(map(json.dumps, lines)))])
    r = rows(res)
    assert [x["agent_id"] for x in r] == ["main", "llm-1", "main", "llm-1"]
    assert [x["parent_index"] for x in r] == [-1, -1, 0, 1]
    # each turn waits for its own chain's previous turn and for the other LLM's last turn
    assert [x["depends_on"] for x in r] == [[], [0], [0, 1], [1, 2]]
    # prompts continue their own chain: agent turn 2 = a + a1 + q2 = 68 bytes -> 17 tokens
    assert r[2]["input_tokens"] == 17 and r[3]["input_tokens"] == 17
    assert any("interleave several LLMs" in n for n in res.notes)


def test_detection_and_bad_input(tmp_path: Path) -> None:
    assert detect(write(tmp_path / "m.jsonl", MOONCAKE)) == "mooncake"
    with pytest.raises(TraceError, match=r"x\.txt.*unrecognized format"):
        detect(write(tmp_path / "x.txt", "hello\n"))
    with pytest.raises(TraceError, match=r"e\.jsonl.*empty"):
        detect(write(tmp_path / "e.jsonl", ""))
    trunc = write(tmp_path / "t.jsonl", MOONCAKE + '{"timestamp": 9, "input_le')
    with pytest.raises(TraceError, match=r"t\.jsonl: line 5: not valid JSON \(truncated\?\)"):
        import_paths([trunc])
    bad = write(
        tmp_path / "b.jsonl", MOONCAKE.replace('"input_length": 600', '"input_length": "six"')
    )
    with pytest.raises(
        TraceError, match=r"b\.jsonl: line 2: field 'input_length' must be an integer"
    ):
        import_paths([bad])
    with pytest.raises(InputError, match="mix formats"):
        import_paths(
            [
                tmp_path / "m.jsonl",
                write(
                    tmp_path / "a.csv",
                    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,1,1\n",
                ),
            ]
        )
    with pytest.raises(TraceError, match=r"c\.csv: line 3: field 'ContextTokens'"):
        import_paths(
            [
                write(
                    tmp_path / "c.csv",
                    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.97,1,1\n2023-11-16 18:17:04,x,1\n",
                )
            ]
        )


# --- fidelity against the real public traces ---------------------------------------------


def test_mooncake_real_trace_fidelity(shared_data: Path) -> None:
    src = shared_data / "mooncake" / "conversation_trace.jsonl"
    raw = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    res = import_paths([src])
    t = res.table
    assert t.num_rows == len(raw) == 12_031
    assert sum(t.column("input_tokens").to_pylist()) == sum(r["input_length"] for r in raw)
    assert sum(t.column("output_tokens").to_pylist()) == sum(r["output_length"] for r in raw)
    assert t.column("arrival_ns").to_pylist() == [r["timestamp"] * 1_000_000 for r in raw]
    seen: set[int] = set()
    hit = total = 0
    for r in raw:  # an unbounded prefix cache, replayed by hand in file (= time) order
        ids = r["hash_ids"]
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit, total = hit + k, total + len(ids)
        seen.update(ids)
    assert prefix_reuse(t) == pytest.approx(hit / total, abs=1e-12)
    sess = t.column("session_id").to_pylist()
    assert len(set(sess)) < len(raw)  # conversations were found


def test_azure_real_trace_fidelity(shared_data: Path) -> None:
    src = shared_data / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    lines = src.read_text().splitlines()[1:]

    def ns(ts: str) -> int:
        day, clock = ts.split(" ")
        h, m, s = clock.split(":")
        return int(day.split("-")[2]) * 86_400 * 10**9 + int(
            (Decimal(h) * 3600 + Decimal(m) * 60 + Decimal(s)) * 10**9
        )

    stamps = sorted(ns(line.split(",")[0]) for line in lines)
    t = import_paths([src]).table
    assert t.num_rows == len(lines) == 8_819
    assert t.column("arrival_ns").to_pylist() == [s - stamps[0] for s in stamps]
    assert sum(t.column("input_tokens").to_pylist()) == sum(int(x.split(",")[1]) for x in lines)
    assert sum(t.column("output_tokens").to_pylist()) == sum(int(x.split(",")[2]) for x in lines)


def test_tracelab_fidelity(shared_data: Path) -> None:
    src = shared_data / "tracelab" / "example_sessions" / "derived" / "round_trace.jsonl"
    raw = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    res = import_paths([src])
    r = rows(res)
    assert res.format == "tracelab"
    assert {x["session_id"] for x in r} == {x["session_id"] for x in raw}
    assert len(r) == len(raw)
    assert sum(x["input_tokens"] for x in r) == sum(x["input_tokens_total"] for x in raw)
    assert sum(x["output_tokens"] for x in r) == sum(x["output_tokens"] for x in raw)
    assert sum(x["cached_tokens"] for x in r) == sum(x["prefix_tokens"] for x in raw)
    claude = [x for x in r if str(x["session_id"]).startswith("claude")]
    # round 1 opens with tool results; last at 05:40:50.938, round 0's last event 05:40:31.647
    assert claude[1]["think_ns"] == 19_291_000_000
    # append-only context: every later round reuses its parent's full 16-token blocks
    implied = implied_cached_tokens(res.table, 16)
    for i, x in enumerate(r):
        if x["parent_index"] >= 0:
            p = next(
                y
                for y in r
                if y["session_id"] == x["session_id"] and y["request_index"] == x["parent_index"]
            )
            want = (
                (
                    p["input_tokens"]
                    if x["input_tokens"] >= p["input_tokens"]
                    else x["cached_tokens"]
                )
                // 16
                * 16
            )
            assert implied[i] == want


def test_claude_code_and_codex_match_tracelab_rounds(shared_data: Path) -> None:
    ex = shared_data / "tracelab" / "example_sessions"
    raw = [
        json.loads(line) for line in (ex / "derived" / "round_trace.jsonl").read_text().splitlines()
    ]
    for log, provider, fmt in (
        (ex / "claude" / "trace.json", "claude", "claude-code"),
        (ex / "codex" / "trace.json", "codex", "codex"),
    ):
        res = import_paths([log])
        assert res.format == fmt
        want = [
            (x["input_tokens_total"], x["output_tokens"], x["prefix_tokens"])
            for x in raw
            if x["provider"] == provider
        ]
        got = [(x["input_tokens"], x["output_tokens"], x["cached_tokens"]) for x in rows(res)]
        assert got == want
        assert len(set(res.table.column("session_id").to_pylist())) == 1


def test_claude_code_native_logs_sessions(shared_data: Path) -> None:
    for d in sorted((shared_data / "claude_code_logs").iterdir()):
        if not d.is_dir():
            continue
        recs = [
            json.loads(line)
            for line in (d / "trace.jsonl").read_text().splitlines()
            if line.strip()
        ]
        sessions = {x["sessionId"] for x in recs if x.get("sessionId")}
        msg_ids = {x["message"]["id"] for x in recs if x.get("type") == "assistant"}
        res = import_paths([d])
        r = rows(res)
        assert {x["session_id"] for x in r} == sessions
        assert len(r) == len(msg_ids)
        assert all(x["think_ns"] is None or x["think_ns"] >= 0 for x in r)
        if "haiku" in d.name:
            # usage logged at stream start reads ~2 output tokens: estimated from content
            assert min(x["output_tokens"] for x in r) > 2


def test_lmcache_real_trace_fidelity(shared_data: Path) -> None:
    files = sorted((shared_data / "lmcache_agent_trace" / "miniswe").glob("*.jsonl"))
    raw = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    res = import_paths(files)
    r = rows(res)
    assert len(r) == len(raw)
    assert {x["session_id"] for x in r} == {x["session_id"] for x in raw}
    t0 = min(x["timestamp"] for x in raw)
    assert sorted(x["arrival_ns"] for x in r) == sorted((x["timestamp"] - t0) * 1000 for x in raw)
    assert sum(x["output_tokens"] for x in r) == sum(
        math.ceil(len(x["output"].encode()) / 4) for x in raw
    )


def test_tokenizer_option_counts_with_a_real_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    lines = [
        {"timestamp": 1, "input": "a b a", "output": "b b", "session_id": "s"},
        {"timestamp": 2, "input": "a b a b", "output": "a", "session_id": "s"},
    ]
    res = import_paths(
        [write(tmp_path / "l.jsonl", "\n".join(map(json.dumps, lines)))],
        options=ImportOptions(tokenizer=str(tmp_path / "tok.json"), block_size=2),
    )
    # prompt 1 = "a b a" + "b b" + " b" = "a b ab b b": the joined "ab" is one unknown word
    assert [x["input_tokens"] for x in rows(res)] == [3, 5]
    assert [x["output_tokens"] for x in rows(res)] == [2, 1]


@pytest.mark.shared_data
def test_claude_code_sidechains_are_subagents(shared_data: Path) -> None:
    """Recomputed from the raw records: sidechain messages become one subagent spawned by
    the message with the Task call and joined by the one whose prompt holds its result."""
    for name in (
        "haiku__prefab-cloud__prefab-cloud-python-62",
        "haiku__wemake-services__wemake-python-styleguide-3117",
    ):
        src = shared_data / "claude_code_logs" / name / "trace.jsonl"
        recs = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
        side_ids = {
            r["message"]["id"]
            for r in recs
            if r.get("type") == "assistant" and r.get("isSidechain")
        }
        task = next(
            (r["message"]["id"], b["id"])
            for r in recs
            if r.get("type") == "assistant"
            for b in r["message"]["content"]
            if b.get("type") == "tool_use" and b.get("name") == "Task"
        )
        result_uuid = next(
            r["uuid"]
            for r in recs
            if r.get("type") == "user"
            and isinstance(r["message"]["content"], list)
            and any(b.get("tool_use_id") == task[1] for b in r["message"]["content"])
        )
        joiner = next(r["message"]["id"] for r in recs if r.get("parentUuid") == result_uuid)
        logged: dict[str, int] = {}
        for r in recs:
            if r.get("type") == "assistant":
                m_id = r["message"]["id"]
                logged[m_id] = max(logged.get(m_id, 0), r["message"]["usage"]["output_tokens"])
        no_stop = set(logged) - {
            r["message"]["id"]
            for r in recs
            if r.get("type") == "assistant" and r["message"].get("stop_reason")
        }
        stream_start = {m for m in no_stop if logged[m] <= 4}
        res = import_paths([src])
        t = res.table.to_pylist()
        ids = list(t)  # rows in arrival order; message ids by first timestamp
        msg_order = []
        for r in recs:
            if r.get("type") == "assistant" and r["message"]["id"] not in msg_order:
                msg_order.append(r["message"]["id"])
        row_of = dict(
            zip(
                sorted(
                    msg_order,
                    key=lambda m: next(
                        x["timestamp"]
                        for x in recs
                        if x.get("type") == "assistant" and x["message"]["id"] == m
                    ),
                ),
                ids,
                strict=True,
            )
        )
        sub = [row_of[m] for m in side_ids]
        assert {r["agent_id"] for r in sub} == {task[1]}
        assert sum(r["agent_id"] != "main" for r in t) == len(side_ids)
        first = min(sub, key=lambda r: r["arrival_ns"])
        last = max(sub, key=lambda r: r["arrival_ns"])
        assert first["depends_on"] == [row_of[task[0]]["request_index"]]
        assert last["request_index"] in row_of[joiner]["depends_on"]
        # no stop_reason: estimated where the content says more than the log, whatever the
        # logged figure (the 1-4 token stream-start figures among them)
        flagged = {m for m, r in row_of.items() if r["output_estimated"]}
        assert stream_start <= flagged <= no_stop
        assert all(row_of[m]["output_tokens"] > logged[m] for m in flagged)
        assert all(row_of[m]["output_tokens"] == logged[m] for m in set(logged) - flagged)
        # think time of the join: from the subagent's end, not from the spawning turn's
        j = row_of[joiner]
        assert j["think_ns"] == j["arrival_ns"] - (last["arrival_ns"] + last["end_ns"])


def test_claude_code_stream_start_estimate_by_hand() -> None:
    from agent_replay.traces.importers.claude_code import estimate_output

    class Tok:  # counts words: a stand-in for a tokenizers.Tokenizer
        def encode(self, text: str, add_special_tokens: bool = False) -> Any:
            return type("Enc", (), {"ids": text.split()})()

    texts = ["a" * 10, '{"file_path": "/x"}']  # 10 + 19 characters, one tool call
    assert estimate_output(texts, 1) == 8 + 40  # ceil(29 / 4) + 40 per tool call
    assert estimate_output(texts, 0) == 8
    assert estimate_output(["one two three", "four"], 2, Tok()) == 4 + 80


LMCACHE_FIXTURES = Path(__file__).parent / "fixtures" / "lmcache"


def test_lmcache_magagent_repeated_prompt_is_not_inflated() -> None:
    # real rows: the orchestrator sends the same 3,790-byte ledger prompt three times; each
    # call's prompt is that input, not the input with the earlier outputs appended
    path = LMCACHE_FIXTURES / "magagent-1aa87db6-rows2-5.jsonl"
    raw = [json.loads(x) for x in path.read_text().splitlines()]
    res = import_paths([path])
    r = rows(res)
    assert [x["input_tokens"] for x in r] == [math.ceil(len(o["input"].encode()) / 4) for o in raw]
    assert [x["input_tokens"] for x in r[1:]] == [948, 948, 948]  # ceil(3790 / 4)
    assert [x["parent_index"] for x in r] == [-1, -1, 1, 2]
    # a resend shares its whole prompt (every hash block) with the call before it, all
    # but the last token, which a server always computes: (948 - 1) // 16 * 16
    assert implied_cached_tokens(res.table, 16).tolist()[2:] == [944, 944]
    assert any("2 rows repeat their conversation's last input" in n for n in res.notes)


def test_lmcache_taubench_empty_outputs_replay_as_one_estimated_token() -> None:
    path = LMCACHE_FIXTURES / "taubench-09867e5c-rows0-4.jsonl"
    res = import_paths([path])
    r = rows(res)
    assert [x["output_tokens"] for x in r] == [33, 1, 1, 16, 57]
    assert [x["output_estimated"] for x in r] == [None, True, True, None, None]
    assert any("2 rows with an empty output" in n for n in res.notes)
