from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent_replay.replay.cli import main
from agent_replay.traces.io import read_trace
from agent_replay.traces.samples import make_samples
from agent_replay.traces.stats import prefix_reuse
from agent_replay.traces.synth import SynthConfig, SynthModel, fit, synthesize
from agent_replay.traces.validate import validate

SAMPLES = Path(make_samples.__file__).resolve().parent


def test_synth_is_seeded_valid_and_shares_prefixes() -> None:
    model = SynthModel(system_prompt_tokens=256)
    a, meta = synthesize(model, SynthConfig(sessions=20, seed=3, block_size=16))
    b, _ = synthesize(model, SynthConfig(sessions=20, seed=3, block_size=16))
    c, _ = synthesize(model, SynthConfig(sessions=20, seed=4, block_size=16))
    assert a.equals(b) and not a.equals(c)
    assert validate(a, meta, "synth") == []
    r = a.to_pylist()
    by_key = {(x["session_id"], x["request_index"]): x for x in r}
    for x in r:
        if x["parent_index"] >= 0:
            p = by_key[(x["session_id"], x["parent_index"])]
            # context grows by the parent's output at least, and extends its full blocks
            assert x["input_tokens"] >= p["input_tokens"] + p["output_tokens"]
            full = p["input_tokens"] // 16
            assert x["hash_ids"][:full] == p["hash_ids"][:full]
            assert x["arrival_ns"] == p["arrival_ns"] + p["end_ns"] + x["think_ns"]
    firsts = [x["hash_ids"][:16] for x in r if x["request_index"] == 0]
    assert all(f == firsts[0] for f in firsts)  # the shared system prompt
    assert (prefix_reuse(a) or 0) > 0.5


def test_synth_duration_cut_and_fit_roundtrip() -> None:
    t, _ = synthesize(SynthModel(), SynthConfig(sessions=50, seed=1, duration_s=30))
    assert t.column("arrival_ns").to_numpy().max() <= 30e9
    src, _ = read_trace(SAMPLES / "agent-small.parquet")
    m = fit(src)
    out, meta = synthesize(m, SynthConfig(sessions=200, seed=5, block_size=16))
    assert validate(out, meta, "fit") == []
    # fitted outputs are drawn from the source's own values
    assert set(out.column("output_tokens").to_pylist()) <= set(
        src.column("output_tokens").to_pylist()
    )
    src_turns = np.bincount(src.column("request_index").to_numpy() == 0)
    assert src_turns.size > 0
    assert (
        out.column("input_tokens").to_numpy().max() <= src.column("input_tokens").to_numpy().max()
    )


def test_agent_small_sample_matches_its_contract() -> None:
    t, meta = read_trace(SAMPLES / "agent-small.parquet")
    assert validate(t, meta, "agent-small") == []
    assert meta.block_size in (16, 64)
    sessions = set(t.column("session_id").to_pylist())
    assert 6 <= len(sessions) <= 10 and 40 <= t.num_rows <= 80
    span = (t.column("arrival_ns").to_numpy().max()) / 1e9
    assert 20 <= span <= 40
    assert t.column("input_tokens").to_numpy().max() <= 3000
    outs = t.column("output_tokens").to_numpy()
    assert outs.min() >= 20 and outs.max() <= 300
    assert t.column("think_ns").null_count < t.num_rows
    assert (prefix_reuse(t) or 0) > 0.5
    for f in SAMPLES.glob("*.parquet"):
        assert f.stat().st_size < 200_000


def test_cli_import_inspect_validate_head_convert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "\n".join(
            json.dumps(
                {
                    "timestamp": i * 1000,
                    "input_length": 1100 + 512 * i,
                    "output_length": 5,
                    "hash_ids": list(range(3 + i)),
                }
            )
            for i in range(3)
        )
        + "\n"
    )
    out = tmp_path / "t.parquet"
    assert main(["traces", "import", str(src), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "format mooncake: 3 requests in 1 sessions, block size 512" in said
    assert main(["traces", "inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert "3 in 1 sessions" in said and "prefix reuse" in said
    assert main(["traces", "validate", str(out)]) == 0
    assert main(["traces", "head", str(out), "-n", "2"]) == 0
    back = tmp_path / "back.jsonl"
    assert main(["traces", "convert", str(out), "-o", str(back)]) == 0
    assert [json.loads(x) for x in back.read_text().splitlines()] == [
        json.loads(x) for x in src.read_text().splitlines()
    ]
    again = tmp_path / "again.parquet"
    assert main(["traces", "convert", str(back), "-o", str(again)]) == 0
    assert read_trace(again)[0].equals(read_trace(out)[0])


def test_cli_refuses_overwrite_and_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.parquet"
    out.write_bytes(b"keep me")
    good = tmp_path / "m.jsonl"
    good.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    assert main(["traces", "import", str(good), "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == b"keep me"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + "{garbage\n")
    out2 = tmp_path / "new.parquet"
    assert main(["traces", "import", str(bad), "-o", str(out2)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl: line 2: not valid JSON" in err[0]
    assert not out2.exists() and not list(tmp_path.glob(".*tmp"))
    assert main(["traces", "synth", "-o", str(out), "--sessions", "2"]) == 2
    assert (
        main(["traces", "synth", "-o", str(out), "--sessions", "2", "--force", "--seed", "1"]) == 0
    )
    assert read_trace(out)[0].num_rows > 2
    assert main(["traces", "validate", str(tmp_path / "missing.parquet")]) == 2


def test_inspect_every_shared_source(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = [
        shared_data / "mooncake" / "conversation_trace.jsonl",
        shared_data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv",
        shared_data / "tracelab" / "example_sessions" / "sanitized" / "round_trace.jsonl",
        shared_data / "lmcache_agent_trace" / "miniswe",
        shared_data / "claude_code_logs",
        shared_data / "tracelab" / "example_sessions" / "codex" / "trace.json",
    ]
    for i, src in enumerate(sources):
        out = tmp_path / f"{i}.parquet"
        assert main(["traces", "import", str(src), "-o", str(out)]) == 0, src
        assert main(["traces", "inspect", str(out)]) == 0
        said = capsys.readouterr().out
        assert "sessions" in said and "input tokens" in said
