"""The warm-up's steadiness rule, a saturated run marked unreachable, the run config of a
point, and the capacity SLO grammar."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_replay.analysis.fixtures import synthetic_batches, write_results
from agent_replay.errors import InputError
from agent_replay.replay.sweep.capacity import Probe, _next, _state, meets, parse_slo
from agent_replay.replay.sweep.experiment import Target, Warmup, experiment_from_dict
from agent_replay.replay.sweep.runner import _outcome, run_config, steady


def test_steady_needs_two_close_bursts() -> None:
    w = Warmup(min_bursts=2, tolerance=0.1)
    assert not steady([10.0], w)
    assert not steady([20.0, 10.0], w)  # halved: the first burst was cold
    assert steady([20.0, 10.0, 10.5], w)
    assert not steady([10.0, None], w) and not steady([None, 10.0], w)
    assert not steady([10.0, 10.0], Warmup(min_bursts=3))


def test_saturated_run_is_unreachable_with_its_reason(tmp_path: Path) -> None:
    run_dir = write_results(tmp_path / "r", synthetic_batches(300, 1), {
        "load_generator_bottleneck": True,
        "load_generator_warning": "load generator saturated: schedule lag p99 30.0 ms"})
    status, reason, figures, bottleneck, _, _ = _outcome(run_dir, SimpleNamespace(interrupted=False),
                                                      Target("a", "sim", "fast"))
    assert (status, bottleneck) == ("unreachable", True)
    assert "could not hold this load" in str(reason) and "30.0 ms" in str(reason)
    assert figures["p90_tps"] is not None  # the figures are kept, marked by the status
    meta = json.loads((run_dir / "run.json").read_text())
    meta["load_generator_bottleneck"] = False
    (run_dir / "run.json").write_text(json.dumps(meta))
    assert _outcome(run_dir, SimpleNamespace(interrupted=False), Target("a", "sim", "fast"))[0] == "complete"


def test_run_config_of_a_point_is_shared_by_targets(tmp_path: Path) -> None:
    (tmp_path / "t.parquet").write_bytes(b"")
    raw = {"trace": "t.parquet", "load": {"axis": "rate", "points": [0.5, 2]},
           "run": {"speedup": 3, "arrival": "constant"},
           "targets": [{"name": "a", "sim": "fast"}, {"name": "b", "sim": "mtp"}]}
    exp = experiment_from_dict(raw, tmp_path / "e.toml")
    a = run_config(exp, "http://127.0.0.1:1", tmp_path / "x", 2.0, 1)
    b = run_config(exp, "http://127.0.0.1:2", tmp_path / "y", 2.0, 1)
    assert (a.rate, a.arrival, a.speedup, a.salt, a.arrival_seed) == (2.0, "constant", 3, b.salt, b.arrival_seed)
    assert run_config(exp, "http://127.0.0.1:1", tmp_path / "x", 2.0, 2).salt != a.salt
    c = experiment_from_dict(raw | {"load": {"axis": "concurrency", "points": [4]}, "run": {}},
                             tmp_path / "e.toml")
    cfg = run_config(c, "http://127.0.0.1:1", tmp_path / "z", 4.0, 0)
    assert (cfg.concurrency, cfg.timing) == (4, "max-rate")


def test_slo_terms_and_bisection_state() -> None:
    slo = parse_slo("p90_tps>=20, ttft_p99<=2s,tpot_p90<=50")
    assert [(t.column, t.op, t.bound) for t in slo] == [
        ("p90_tps", ">=", 20.0), ("ttft_p99_ms", "<=", 2000.0), ("tpot_p90_ms", "<=", 50.0)]
    assert meets([{"p90_tps": 25, "ttft_p99_ms": 1500, "tpot_p90_ms": 40},
                  {"p90_tps": 16, "ttft_p99_ms": 1700, "tpot_p90_ms": 45}], slo)  # mean 20.5
    assert not meets([{"p90_tps": 25, "ttft_p99_ms": None, "tpot_p90_ms": 40}], slo)
    for bad in ("p90_tps>20", "speed>=3", "ttft_p99<=2h", "p90_tps>=3ms"):
        with pytest.raises(InputError):
            parse_slo(bad)
    probes = [Probe(2, 3, 3, True, {}), Probe(32, 3, 0, False, {}), Probe(17, 3, 1, False, {})]
    assert _state(probes) == (2, 17) and _next(2, 17, True) == 9.0 and _next(8, 9, True) is None
    assert _next(1.0, 1.04, False) is None and _next(1.0, 4.0, False) == pytest.approx(2.0)


def test_an_invalid_agentx_run_is_a_failed_point_with_its_reason(tmp_path: Path) -> None:
    run_dir = write_results(tmp_path / "r", synthetic_batches(300, 1), {
        "status": "invalid", "agentx": {"invalid_reason": "measured 60 s, below the minimum of 900 s"}})
    status, reason, figures, _, _, _ = _outcome(run_dir, SimpleNamespace(interrupted=False),
                                                Target("a", "sim", "fast"))
    assert status == "failed" and reason == "invalid AgentX run: measured 60 s, below the minimum of 900 s"
    assert figures["p90_tps"] is not None
