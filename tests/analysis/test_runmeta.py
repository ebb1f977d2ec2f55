"""run.json as a typed, versioned record (``agent_replay.runmeta``): every layout written so
far reads, unknown keys survive, and the readers get the same answers from either form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_replay.runmeta import RUN_META_VERSION, RunMeta

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED = sorted(RESULTS.rglob("run.json"))


def test_every_committed_run_json_reads() -> None:
    assert len(COMMITTED) >= 100  # the committed benchmark results (version 1: the next test)
    versions = set()
    for f in COMMITTED:
        raw = json.loads(f.read_text())
        m = RunMeta.from_json(raw)
        versions.add(raw.get("results_schema_version"))
        assert m.version == raw.get("run_meta_version", 0)
        assert m.trace.sha256 == raw["trace"]["sha256"] and m.status == raw["status"]
        assert m.summary is not None and m.summary.ok == raw["summary"]["ok"]
        assert m.timing == (raw["options"].get("timing") or "session")
        assert m.self_check is not None
        assert m.self_check.kind == raw["self_check"].get("kind")
        again = m.to_json()  # nothing read is lost: every key is written back, unchanged
        for k, v in raw.items():
            if isinstance(v, dict):
                assert {kk: vv for kk, vv in again[k].items() if kk in v} == v, (f, k)
            else:
                assert again[k] == v, (f, k)
    assert 2 in versions and versions <= {1, 2}


def test_hand_made_record_old_and_new() -> None:
    old = {
        "results_schema_version": 1,
        "status": "complete",
        "options": {"speedup": 2},
        "self_check": {"cpu_fraction": 0.5, "loop_lag_p99_ns": 1000, "warnings": []},
        "load_generator_bottleneck": True,
        "load_generator_warning": "CPU 99%",
        "gpus": 0,
        "scrape": {"interval_s": 1},
    }
    m = RunMeta.from_json(old)
    assert m.version == 0 and m.timing == "session" and m.gpus is None  # 0 GPUs: unknown
    assert m.self_check is not None and m.self_check.kind is None  # before the one policy
    assert m.self_check.cpu_fraction == 0.5 and m.load_generator_bottleneck
    assert m.extra == {"scrape": {"interval_s": 1}} and m.summary is None
    new = RunMeta.from_json(
        {
            **old,
            "run_meta_version": RUN_META_VERSION,
            "gpus": 8,
            "options": {"timing": "agentx", "warmed_up": True},
            "agentx": {"valid": False, "invalid_reason": "too short"},
        }
    )
    assert new.version == 1 and new.gpus == 8 and new.timing == "agentx" and new.warmed_up
    assert new.invalid_reason == "too short"
    assert RunMeta.from_json({}).summary is None and RunMeta.from_json(None).options == {}


@pytest.mark.parametrize(
    "bad", [{"gpus": True}, {"gpus": "8"}, {"trace": "x.parquet"}, {"warnings": "one"}]
)
def test_wrong_kinds_read_as_defaults(bad: dict[str, object]) -> None:
    m = RunMeta.from_json(bad)
    assert m.gpus is None and m.trace.sha256 is None and m.warnings == []
