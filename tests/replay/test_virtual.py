"""``run TRACE --engine sim:PROFILE --virtual``: the real drivers on a virtual clock against the
simulated engine's core; hand-timed rows, the results folder and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.report import build_report
from agent_replay.engines.sim.profile import SimProfile
from agent_replay.errors import InputError
from agent_replay.replay.config import RunConfig
from agent_replay.replay.virtual import T0_NS, parse_engine, run_virtual
from tests.replay.helpers import MS, chain_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]


def _profile(tmp: Path, **kw: object) -> Path:
    fields: dict[str, object] = {
        "name": "hand",
        "decode_base_ns": 2 * MS,
        "decode_per_seq_ns": 0,
        "decode_per_ctx_token_ns": 0.0,
        "prefill_tokens_per_s": 1e6,
        "frontend_base_ns": 1 * MS,
        "prefix_cache_blocks": 0,
        **kw,
    }
    p = SimProfile.from_dict(fields)
    path = tmp / "p.json"
    path.write_text(json.dumps(p.to_dict()))
    return path


def test_one_session_timed_by_hand(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(1, 2, think_ns=50 * MS))
    out = tmp_path / "out"
    summary = run_virtual(
        RunConfig(trace=str(trace), target="http://x", output=str(out), api="completions"),
        f"sim:{_profile(tmp_path)}",
    )
    assert summary.exit_code == 0
    rows = sorted(pq.read_table(out / "requests").to_pylist(), key=lambda r: r["request_index"])
    a, b = rows
    # request 0: 100 prompt tokens, 8 out. Ready 1 ms after sending; one step of 2 ms +
    # 100 us of prefill gives the first token, then 7 steps of 2 ms
    assert a["sent_ns"] == 0
    assert a["first_token_ns"] == 3_100_000
    assert a["chunk_ns"] == [3_100_000 + 2 * MS * i for i in range(8)]
    assert a["end_ns"] == 17_100_000 and a["completion_tokens"] == 8
    # request 1 (140 tokens, 9 out) goes its think time after request 0's end
    assert b["sent_ns"] == a["end_ns"] + 50 * MS
    assert b["first_token_ns"] == b["sent_ns"] + 1 * MS + 2 * MS + 140_000
    assert len(b["chunk_ns"]) == 9
    meta = json.loads((out / "run.json").read_text())
    assert meta["prediction"]["clock"] == "virtual" and meta["prediction"]["profile_name"] == "hand"
    assert meta["clock"]["t0_monotonic_ns"] == T0_NS and meta["status"] == "ok"
    rep = build_report(out)  # the report reads it as any results folder
    assert rep.stats.latency["ttft"].count == 2


def test_agentx_lanes_run_on_the_virtual_clock(tmp_path: Path) -> None:
    trace = write_rows(tmp_path / "t.parquet", chain_rows(6, 5, think_ns=2_000 * MS))
    out = tmp_path / "ax"
    cfg = RunConfig(
        trace=str(trace),
        target="http://x",
        output=str(out),
        api="completions",
        timing="agentx",
        concurrency=3,
        duration_s=30.0,
    )
    summary = run_virtual(cfg, f"sim:{_profile(tmp_path)}")
    assert summary.exit_code == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["options"]["timing"] == "agentx" and "agentx" in meta
    rows = pq.read_table(out / "requests").to_pylist()
    assert rows and all(r["status"] == "ok" for r in rows)
    assert build_report(out).headline  # the AgentX headline is computed


def test_engine_spec_errors(tmp_path: Path) -> None:
    assert parse_engine("sim:fast") == "fast"
    with pytest.raises(InputError, match="sim:PROFILE"):
        parse_engine("vllm:x")
    trace = write_rows(tmp_path / "t.parquet", chain_rows(1, 1))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "run",
            str(trace),
            "--engine",
            "sim:fast",
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode != 0 and "--virtual" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_replay",
            "run",
            str(trace),
            "--engine",
            "sim:nope.json",
            "--virtual",
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode != 0 and "nope.json" in r.stderr and "Traceback" not in r.stderr


def test_gpus_what_if_is_data_parallel_and_labelled(tmp_path: Path) -> None:
    # two overlapping sessions of one 60-token answer each; a step is 2 ms + 1 ms per
    # decoding sequence. One engine: while both decode, 4 ms steps. Three copies: the
    # sessions' keys s0 and s1 go to copies crc32 % 3 = 2 and 1, so each decodes alone: 3 ms.
    assert [zlib.crc32(k.encode()) % 3 for k in ("s0", "s1")] == [2, 1]
    trace = write_rows(tmp_path / "t.parquet", chain_rows(2, 1, gap_ns=20 * MS, output_tokens=60))
    profile = _profile(tmp_path, decode_per_seq_ns=1 * MS)
    gaps = {}
    for gpus in (1, 3):
        out = tmp_path / f"g{gpus}"
        run_virtual(
            RunConfig(
                trace=str(trace), target="http://x", output=str(out), api="completions", gpus=gpus
            ),
            f"sim:{profile}",
        )
        rows = pq.read_table(out / "requests").to_pylist()
        gaps[gpus] = {
            b - a for r in rows for a, b in zip(r["chunk_ns"][:-1], r["chunk_ns"][1:], strict=True)
        }
        meta = json.loads((out / "run.json").read_text())
        assert meta["gpus"] == gpus
        assert ("extrapolation" in meta["prediction"]) == (gpus > 1)
    # one engine: alone 3 ms; the step where s1's 100-token prefill joins s0's decode
    # 2 + 1 + 0.1 ms; both decoding 4 ms
    assert gaps[1] == {3 * MS, 3_100_000, 4 * MS}
    assert gaps[3] == {3 * MS}
    assert "an extrapolation" in meta["prediction"]["extrapolation"]["rule"]
