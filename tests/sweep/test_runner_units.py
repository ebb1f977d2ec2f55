"""The warm-up's steadiness rule, a saturated run marked unreachable, the run config of a
point, and the capacity SLO grammar."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_replay.analysis.fixtures import synthetic_batches, write_results
from agent_replay.errors import InputError
from agent_replay.replay.sweep.capacity import (
    MIN_TURNS,
    Probe,
    _next,
    _state,
    check_axis,
    meets,
    parse_slo,
    run_length,
    sure_bracket,
    surely,
    turn_period_s,
)
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
    run_dir = write_results(
        tmp_path / "r",
        synthetic_batches(300, 1),
        {
            "load_generator_bottleneck": True,
            "load_generator_warning": "load generator saturated: schedule lag p99 30.0 ms",
        },
    )
    status, reason, figures, bottleneck, _, _ = _outcome(
        run_dir, SimpleNamespace(interrupted=False), Target("a", "sim", "fast")
    )
    assert (status, bottleneck) == ("unreachable", True)
    assert "could not hold this load" in str(reason) and "30.0 ms" in str(reason)
    assert figures["p90_tps"] is not None  # the figures are kept, marked by the status
    meta = json.loads((run_dir / "run.json").read_text())
    meta["load_generator_bottleneck"] = False
    (run_dir / "run.json").write_text(json.dumps(meta))
    assert (
        _outcome(run_dir, SimpleNamespace(interrupted=False), Target("a", "sim", "fast"))[0]
        == "complete"
    )


def test_run_config_of_a_point_is_shared_by_targets(tmp_path: Path) -> None:
    (tmp_path / "t.parquet").write_bytes(b"")
    raw = {
        "trace": "t.parquet",
        "load": {"axis": "rate", "points": [0.5, 2]},
        "run": {"speedup": 3, "arrival": "constant"},
        "targets": [{"name": "a", "sim": "fast"}, {"name": "b", "sim": "mtp"}],
    }
    exp = experiment_from_dict(raw, tmp_path / "e.toml")
    a = run_config(exp, "http://127.0.0.1:1", tmp_path / "x", 2.0, 1)
    b = run_config(exp, "http://127.0.0.1:2", tmp_path / "y", 2.0, 1)
    assert (a.rate, a.arrival, a.speedup, a.salt, a.arrival_seed) == (
        2.0,
        "constant",
        3,
        b.salt,
        b.arrival_seed,
    )
    assert run_config(exp, "http://127.0.0.1:1", tmp_path / "x", 2.0, 2).salt != a.salt
    c = experiment_from_dict(
        raw | {"load": {"axis": "concurrency", "points": [4]}, "run": {}}, tmp_path / "e.toml"
    )
    cfg = run_config(c, "http://127.0.0.1:1", tmp_path / "z", 4.0, 0)
    assert (cfg.concurrency, cfg.timing) == (4, "max-rate")


def test_slo_terms_and_bisection_state() -> None:
    slo = parse_slo("p90_tps>=20, ttft_p99<=2s,tpot_p90<=50")
    assert [(t.column, t.op, t.bound) for t in slo] == [
        ("p90_tps", ">=", 20.0),
        ("ttft_p99_ms", "<=", 2000.0),
        ("tpot_p90_ms", "<=", 50.0),
    ]
    # the mean of replicate runs is mean_ci's (geometric): sqrt(25 x 18) = 21.2 >= 20
    assert meets(
        [
            {"p90_tps": 25, "ttft_p99_ms": 1500, "tpot_p90_ms": 40},
            {"p90_tps": 18, "ttft_p99_ms": 1700, "tpot_p90_ms": 45},
        ],
        slo,
    )
    # sqrt(25 x 15.8) = 19.87 < 20 though the arithmetic mean is 20.4
    assert not meets(
        [
            {"p90_tps": 25, "ttft_p99_ms": 1500, "tpot_p90_ms": 40},
            {"p90_tps": 15.8, "ttft_p99_ms": 1700, "tpot_p90_ms": 45},
        ],
        slo,
    )
    assert not meets([{"p90_tps": 25, "ttft_p99_ms": None, "tpot_p90_ms": 40}], slo)
    for bad in ("p90_tps>20", "speed>=3", "ttft_p99<=2h", "p90_tps>=3ms"):
        with pytest.raises(InputError):
            parse_slo(bad)
    probes = [Probe(2, 3, 3, True, {}), Probe(32, 3, 0, False, {}), Probe(17, 3, 1, False, {})]
    assert _state(probes) == (2, 17) and _next(2, 17, True) == 9.0 and _next(8, 9, True) is None
    assert _next(1.0, 1.04, False) is None and _next(1.0, 4.0, False) == pytest.approx(2.0)


def test_an_invalid_agentx_run_is_a_failed_point_with_its_reason(tmp_path: Path) -> None:
    run_dir = write_results(
        tmp_path / "r",
        synthetic_batches(300, 1),
        {
            "status": "invalid",
            "agentx": {"invalid_reason": "measured 60 s, below the minimum of 900 s"},
        },
    )
    status, reason, figures, _, _, _ = _outcome(
        run_dir, SimpleNamespace(interrupted=False), Target("a", "sim", "fast")
    )
    assert (
        status == "failed"
        and reason == "invalid AgentX run: measured 60 s, below the minimum of 900 s"
    )
    assert figures["p90_tps"] is not None


def test_surely_widens_the_bracket_by_the_run_to_run_spread() -> None:
    slo = parse_slo("p90_tps>=100")

    def runs(*v: float) -> list[dict[str, float]]:
        return [{"p90_tps": x} for x in v]

    # 95% interval of the geometric mean, exp(mean log +- 4.303 sd(log) / sqrt 3):
    assert surely(runs(104, 106, 108), slo) == "meets"  # 101.1 to 111.1: all >= 100
    assert surely(runs(110, 120, 130), slo) == "uncertain"  # 97.3 to 147.3: the mean meets
    assert surely(runs(80, 90, 100), slo) == "uncertain"  # 67.9 to 118.3
    assert surely(runs(80, 82, 84), slo) == "fails"  # wholly below 100
    assert surely(runs(150), slo) == "uncertain"  # one run: no interval
    assert surely([{"p90_tps": None}], slo) == "fails"
    probes = [
        Probe(2, 3, 3, True, {}, "meets"),
        Probe(8, 3, 3, True, {}, "uncertain"),
        Probe(12, 3, 2, True, {}, "uncertain"),
        Probe(13, 3, 1, False, {}, "uncertain"),
        Probe(16, 3, 0, False, {}, "fails"),
    ]
    assert _state(probes) == (12, 13)  # by the means
    assert sure_bracket(probes) == (2, 16)  # with the spread: only 2 surely meets, 16 surely fails


def test_capacity_needs_a_paced_axis_and_enough_turns(tmp_path: Path) -> None:
    from tests.replay.helpers import chain_rows, write_rows

    # 2 sessions of 3 turns: intended sends 0, 1, 3 s (session 1) and 0, 2, 4 s (session 2):
    # periods (3 - 0) / 2 = 1.5 and (4 - 0) / 2 = 2.0: median 1.75 s
    rows = chain_rows(2, 3, output_tokens=4)
    starts = {(0, 0): 0, (0, 1): 1, (0, 2): 3, (1, 0): 0, (1, 1): 2, (1, 2): 4}
    for r in rows:
        r["arrival_ns"] = starts[(int(str(r["session_id"])[1:]), int(r["request_index"]))] * 10**9
    write_rows(tmp_path / "t.parquet", rows)
    assert turn_period_s(str(tmp_path / "t.parquet")) == pytest.approx(1.75)
    raw = {
        "trace": "t.parquet",
        "load": {"axis": "concurrent_sessions", "points": [1, 4]},
        "run": {"speedup": 2, "duration_s": 3},
        "targets": [{"sim": "fast"}],
    }
    exp = experiment_from_dict(raw, tmp_path / "e.toml")
    # 1 session at the lowest point: 10 turns for a P90's 10 requests (more than 5);
    # 10 x 1.75 s / speedup 2 + 1 s ramp = 9.75 s > the file's 3 s
    assert MIN_TURNS == 5 and run_length(exp)[0] == pytest.approx(9.8)
    exp = experiment_from_dict(
        raw | {"load": {"axis": "concurrent_sessions", "points": [4, 8]}}, tmp_path / "e.toml"
    )
    # 4 sessions send 10 requests in 3 turns: 5 turns x 1.75 / 2 + 1 = 5.375 s
    assert run_length(exp)[0] == pytest.approx(5.4)
    exp = experiment_from_dict(raw | {"run": {"speedup": 2, "duration_s": 12}}, tmp_path / "e.toml")
    assert run_length(exp)[0] == 12.0
    check_axis(exp)
    sped = experiment_from_dict(
        raw | {"load": {"axis": "speedup", "points": [1, 4]}, "run": {}}, tmp_path / "e.toml"
    )
    with pytest.raises(InputError, match="needs a load the server paces"):
        check_axis(sped)


def test_capacity_table_flags_contention_warmup_and_few_samples() -> None:
    from agent_replay.replay.sweep.capacity import Capacity, _probe, to_markdown

    slo = parse_slo("p90_tps>=100,ttft_p99<=2s")
    rows = {
        ("capacity", "a", 4.0, r): {
            "status": "complete",
            "p90_tps": v,
            "ttft_p99_ms": 500.0,
            "requests_ok": 30,
            "tpot_n": 30,
            "ttft_n": 30,
            "machine_contention": r == 0,
            "warmup_steady": r != 1,
        }
        for r, v in enumerate((110.0, 120.0, 130.0))
    }
    p = _probe(rows, "a", 4.0, slo)
    assert (p.runs, p.passed_runs, p.meets, p.contended, p.unsteady) == (3, 3, True, 1, 1)
    assert p.few == ("ttft_p99_ms",)  # a P99 of 30 requests; P90 TPS of 30 is enough
    assert p.means["p90_tps"] == pytest.approx((110 * 120 * 130) ** (1 / 3))
    md = to_markdown([Capacity("a", 1, [p], 4.0, None)], "concurrent_sessions", "x")
    row = next(ln for ln in md.splitlines() if ln.startswith("| a | 4 |"))
    assert "| 1 | 1 |" in row and "500.00*" in row and "119.7" in row
    assert "1 of 3 runs had host contention" in md


def test_capacity_shows_the_same_load_measured_by_the_sweep_phase() -> None:
    from agent_replay.replay.sweep.capacity import Capacity, _probe, other_phase

    slo = parse_slo("p90_tps>=100")
    rows = {
        (phase, "a", 8.0, r): {"status": "complete", "p90_tps": v}
        for phase, vals in (("capacity", (119.0, 119.0)), ("sweep", (98.0, 98.0)))
        for r, v in enumerate(vals)
    }
    cap = Capacity("a", 1, [_probe(rows, "a", 8.0, slo)])
    assert other_phase([cap], rows, slo) == ["a at 8: p90_tps 119.0 here, 98.0 in the sweep"]


def test_capacity_progress_counts_every_round_against_the_most_runs(tmp_path: Path) -> None:
    from agent_replay.replay.sweep.capacity import _Overall, max_runs

    (tmp_path / "t.parquet").write_bytes(b"")
    raw = {
        "trace": "t.parquet",
        "repeats": 2,
        "targets": [{"name": "a", "sim": "fast"}, {"name": "b", "sim": "mtp"}],
        "load": {"axis": "concurrent_sessions", "points": [1, 33]},
    }
    exp = experiment_from_dict(raw, tmp_path / "e.toml")
    # both ends (2 points), bisection of 1..33 (32 -> 16 -> 8 -> 4 -> 2 -> 1: 5 steps) and up
    # to 2 x 3 more for the top doubled 3 times, then 3 rounds of the bracket's ends again
    # and a step (3 x 2 repeats each): 2 targets x (2 x (2 + 11) + 3 x 6)
    assert max_runs(exp) == 2 * (2 * (2 + 11) + 3 * 6)
    lines: list[str] = []
    ov = _Overall(lines.append, max_runs(exp))
    ov.round = 1
    ov("[1/8] r0 a concurrent_sessions=1: complete")
    ov.round = 2
    ov("[1/4] r0 a concurrent_sessions=17: complete")  # the runner's count restarts
    assert lines[0].startswith("capacity round 1, run 1 of at most 88 (at most ")
    assert lines[1].startswith("capacity round 2, run 2 of at most 88 (at most ")
    assert lines[1].endswith(": [1/4] r0 a concurrent_sessions=17: complete")
    few = _Overall(lines.append, 1)
    few("x")
    few("y")  # the bound is an estimate: it never shows fewer runs than were done
    assert lines[-1].startswith("capacity round 0, run 2 of at most 2 (")
