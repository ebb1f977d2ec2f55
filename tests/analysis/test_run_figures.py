"""Run-level figures as entries of the definitions table (``analysis.definitions.FIGURES``):
each pinned on the hand-computed rows of ``tests.analysis.rows``, and each reaching the
sweep's index, ``sweep --slo``, compare and the frontier from the table; ``report --slo``
takes any per-request metric of the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_replay.analysis.definitions import (
    FIGURES,
    REQUEST_METRICS,
    RUN_FIGURES,
    RunInputs,
    run_figures,
)
from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.report import parse_slo
from agent_replay.analysis.runstats import Accumulator, Slo
from agent_replay.errors import InputError
from agent_replay.replay.cli import main
from tests.analysis.rows import ALL_ROWS


def _stats(**kw):  # type: ignore[no-untyped-def]
    acc = Accumulator()
    acc.add(rows_to_table(ALL_ROWS))
    return acc.finish(**kw)


def test_run_figures_on_hand_computed_rows() -> None:
    # ok A, B, C, E; failed D; window: first intended send 100 .. last byte 950 = 850 ns;
    # tokens: output 11, input 360 (cached included); ok sends 110 (A) .. last end 950 (E)
    st = _stats(slo=Slo.of({"ttst": 100}), gpus=2)
    f = run_figures(RunInputs(st, gpus=2, usd_per_gpu_hour=3.0))
    assert f["requests_ok"] == 4 and f["requests_failed"] == 1
    assert f["failure_rate"] == pytest.approx(1 / 5)
    assert f["duration_s"] == pytest.approx(850e-9)
    assert f["output_tps"] == pytest.approx(11 / 850e-9)
    assert f["total_tps_per_gpu"] == pytest.approx(371 / 850e-9 / 2)
    assert f["agentx_tps_per_gpu"] == pytest.approx(371 / 840e-9 / 2)
    assert f["agentx_tps_per_gpu"] == st.extra["throughput"]["total_tokens_per_s_per_gpu"]
    # USD per M output tokens: 3 USD x 2 GPUs per hour / (11 / 850 ns x 3600 s) x 1e6
    assert f["usd_per_m_output"] == pytest.approx(6.0 / (11 / 850e-9 * 3600) * 1e6)
    # time to second token <= 100 ns: A 150 misses, C 95 meets, B (one token) and E (none)
    # have no second token and do not meet it: 1 good of 5 attempted
    assert f["goodput_fraction"] == pytest.approx(1 / 5)
    assert f["goodput_rps"] == pytest.approx(1 / 850e-9)
    assert f["j_per_output_token"] is None  # no GPU telemetry
    assert run_figures(RunInputs(_stats()))["goodput_rps"] is None  # no SLO


def test_report_slo_takes_any_per_request_metric() -> None:
    assert parse_slo("ttst=100ns") == Slo.of({"ttst": 100})
    slo = parse_slo("e2e_per_token=40ns,ttft=1s")
    assert slo is not None and slo.bounds() == {"ttft": 1e9, "e2e_per_token": 40.0}
    # E2E per output token: A 35, B 110, C 25, E undefined (no output): A and C meet 40 ns
    g = _stats(slo=slo).goodput
    assert g is not None and g["good_requests"] == 2
    assert g["slo"]["e2e_per_token_ms"] == pytest.approx(40e-6)
    for bad in ("bogus=1s", "itl=5ms"):  # itl is per token, not per request
        with pytest.raises(InputError, match="METRIC one of ttft, ttft_intended, ttst"):
            parse_slo(bad)
    assert {d.key for d in REQUEST_METRICS} >= {"ttst", "e2e_per_token", "agentx_itl"}


def test_report_cli_slo_on_another_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_results(tmp_path / "r", rows_to_table(ALL_ROWS))
    assert main(["report", str(tmp_path / "r"), "--slo", "ttst=100ns", "--format", "json"]) == 0
    g = json.loads(capsys.readouterr().out)["goodput"]
    assert (g["good_requests"], g["attempted_requests"]) == (1, 5)
    assert main(["report", str(tmp_path / "r"), "--slo", "nope=1s"]) == 2
    assert "METRIC one of" in capsys.readouterr().err


def test_every_figure_reaches_index_sweep_slo_compare_and_frontier() -> None:
    from agent_replay.analysis.compare import ARM_FIGURES, ARM_TESTS
    from agent_replay.analysis.frontier import ENERGY, X_AXES, Y_AXES
    from agent_replay.analysis.points import POINT_FIELDS
    from agent_replay.replay.sweep.capacity import parse_slo as sweep_slo

    columns = dict(POINT_FIELDS)
    for f in FIGURES:
        assert columns[f.key] == f.unit
        term = f"{f.key.removesuffix('_ms')}{'>=' if f.higher_is_better else '<='}1"
        (t,) = sweep_slo(term)
        assert t.column == f.key
    assert [k for k, _, _ in ARM_FIGURES] == [f.key for f in FIGURES if f.compare]
    assert [k for k, _, _ in ARM_TESTS] == [f.key for f in FIGURES if f.tested]
    assert set(X_AXES) == {f.key for f in FIGURES if f.axis == "x"}
    assert set(Y_AXES) == {f.key for f in FIGURES if f.axis == "y"}
    assert ENERGY == "j_per_output_token"
    assert {f.key for f in RUN_FIGURES} >= {
        "failure_rate",
        "goodput_rps",
        "j_per_output_token",
        "agentx_tps_per_gpu",
        "output_tps",
    }
