"""The report's GPU section on a hand-made results folder: energy from the counter (with a
reset) and from the power integral, their difference, per-GPU field statistics, joules per
token/request, tokens/s per kW, and per-session energy by the token-share rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.fixtures import rows_to_table, write_results
from agent_replay.analysis.gpu_energy import apportion, counter_energy_j, power_energy_j
from agent_replay.analysis.render import to_csv, to_json, to_markdown, to_text
from agent_replay.analysis.report import build_report
from agent_replay.errors import InputError
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA

S = 1_000_000_000


def _telemetry() -> pa.Table:
    """Samples at 0..5 s. GPU 0: power 100,100,200,200,100,100 W and a counter that is the
    exact trapezoid (cumulative 0,100,250,450,600,700 J). GPU 1: 50 W, a counter gaining
    52 J/s (4% above the power) that resets to 0 just before t=3 s."""
    rows = []
    p0 = [100, 100, 200, 200, 100, 100]
    e0 = [0, 100, 250, 450, 600, 700]
    e1 = [1_000_000, 1_052_000, 1_104_000, 52_000, 104_000, 156_000]
    for k in range(6):
        rows.append(
            {
                "t_ns": k * S,
                "gpu": 0,
                "uuid": "GPU-a",
                "gpu_util_pct": 10.0 * k,
                "power_w": float(p0[k]),
                "energy_mj": 5_000_000 + e0[k] * 1000,
                "mem_used_bytes": (k + 1) << 30,
                "temp_c": 40.0 + k,
            }
        )
        rows.append(
            {
                "t_ns": k * S,
                "gpu": 1,
                "uuid": "GPU-b",
                "gpu_util_pct": 50.0,
                "power_w": 50.0,
                "energy_mj": e1[k],
                "mem_used_bytes": 1 << 30,
                "temp_c": 30.0,
            }
        )
    cols = {f.name: [r.get(f.name) for r in rows] for f in GPU_TELEMETRY_SCHEMA}
    return pa.table(cols, schema=GPU_TELEMETRY_SCHEMA)


def _requests() -> pa.Table:
    # a: 1 s .. 3 s, chunks at 1.5 s (10 tokens) and 2.5 s (30); b: 2 s .. 4 s, chunks at
    # 2.2 s (5) and 2.8 s (15). Measured window: first intended send 1 s .. last byte 4 s.
    return rows_to_table(
        [
            {
                "session_id": "a",
                "request_id": "a0",
                "intended_ns": 1 * S,
                "sent_ns": 1 * S,
                "first_token_ns": 3 * S // 2,
                "end_ns": 3 * S,
                "chunk_ns": [3 * S // 2, 5 * S // 2],
                "chunk_tokens": [10, 30],
                "completion_tokens": 40,
                "expected_output_tokens": 40,
            },
            {
                "session_id": "b",
                "request_id": "b0",
                "intended_ns": 2 * S,
                "sent_ns": 2 * S,
                "first_token_ns": 22 * S // 10,
                "end_ns": 4 * S,
                "chunk_ns": [22 * S // 10, 28 * S // 10],
                "chunk_tokens": [5, 15],
                "completion_tokens": 20,
                "expected_output_tokens": 20,
            },
        ]
    )


@pytest.fixture
def results(tmp_path: Path) -> Path:
    meta = {
        "options": {"timing": "session"},
        "gpu_telemetry": {
            "enabled": True,
            "source": "NVML",
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "name": "H200"},
                {"index": 1, "uuid": "GPU-b", "name": "H200"},
            ],
            "cost": {
                "samples_per_s": 10.0,
                "cpu_percent": 0.5,
                "read_ms_mean": 0.3,
                "read_ms_max": 1.2,
                "errors": 0,
            },
        },
    }
    root = write_results(tmp_path / "res", _requests(), meta)
    pq.write_table(_telemetry(), root / "gpu_telemetry.parquet")
    return root


def test_energy_two_ways_and_derived_figures(results: Path) -> None:
    g = build_report(results).gpu
    assert g is not None
    assert g["window_s"] == 3.0
    a, b = g["gpus"]
    # GPU 0 over [1 s, 4 s]: counter 600 - 100 = 500 J; power 150 + 200 + 150 = 500 J
    assert a["energy_counter_j"] == pytest.approx(500.0)
    assert a["energy_power_j"] == pytest.approx(500.0)
    # GPU 1: the counter gains 52 J/s (the reset counts its new value): 3 x 52 = 156 J;
    # power 3 x 50 = 150 J; difference +4%
    assert b["energy_counter_j"] == pytest.approx(156.0)
    assert b["energy_power_j"] == pytest.approx(150.0)
    assert b["energy_diff_pct"] == pytest.approx(4.0)
    assert g["energy_counter_j"] == pytest.approx(656.0)
    assert g["energy_power_j"] == pytest.approx(650.0)
    assert g["energy_diff_pct"] == pytest.approx(100 * 6 / 650)
    assert g["energy_from"] == "counter" and g["energy_j"] == pytest.approx(656.0)
    assert g["mean_power_w"] == pytest.approx(656.0 / 3)
    # 60 output tokens, 2 requests
    assert g["j_per_output_token"] == pytest.approx(656.0 / 60)
    assert g["j_per_request"] == pytest.approx(328.0)
    assert g["output_tokens_per_s_per_kw"] == pytest.approx(60 * 1000 / 656.0)
    # fields over the samples inside the window (t = 1, 2, 3, 4 s)
    pw = a["fields"]["power_w"]
    assert (pw["n"], pw["mean"], pw["p50"], pw["p99"]) == (4, 150.0, 100.0, 200.0)
    assert a["fields"]["mem_used_bytes"]["mean"] == pytest.approx(3.5)  # GiB: 2, 3, 4, 5
    assert a["fields"]["temp_c"]["p99"] == 44.0
    assert "sm_active_pct" not in a["fields"]  # no such readings: left out
    # the +0.9% total is within 2%; GPU 1's +4% is not
    assert g["notes"] == [
        "energy counter and power integral differ by more than 2% on GPU 1 (+4.0%)"
    ]


def test_sweep_point_figures(results: Path, tmp_path: Path) -> None:
    from agent_replay.analysis.gpu_energy import POINT_FIELDS, point_figures

    p = point_figures(build_report(results).gpu)
    assert list(p) == [k for k, _ in POINT_FIELDS]
    assert p["j_per_output_token"] == pytest.approx(656.0 / 60)
    assert p["output_tokens_per_s_per_kw"] == pytest.approx(60_000 / 656.0)
    assert point_figures(None) == dict.fromkeys(p)
    # the sweep's point (its index row) carries them, and the index keeps them
    from agent_replay.analysis.points import point_metrics
    from agent_replay.replay.sweep.index import read_index, write_index

    row = point_metrics(build_report(results), gpus=1)
    assert row["j_per_output_token"] == pytest.approx(656.0 / 60)
    write_index(
        tmp_path,
        [
            row
            | {
                "phase": "sweep",
                "order": 0,
                "repeat": 0,
                "target": "t",
                "point": 1.0,
                "status": "complete",
            }
        ],
    )
    assert read_index(tmp_path)[0]["j_per_output_token"] == pytest.approx(656.0 / 60)


def test_per_session_energy_by_token_share(results: Path) -> None:
    g = build_report(results).gpu
    assert g is not None
    ses = g["sessions"]
    by = {r["session_id"]: r for r in ses["sessions"]}
    # interval energy (both counters): 1-2 s 202 J, 2-3 s 252 J, 3-4 s 202 J
    # 1-2 s: only a's 10 tokens -> a 202; 2-3 s: a 30, b 20 tokens -> a 151.2, b 100.8;
    # 3-4 s: no tokens -> unattributed 202
    assert by["a"]["energy_j"] == pytest.approx(353.2)
    assert by["b"]["energy_j"] == pytest.approx(100.8)
    assert ses["unattributed_j"] == pytest.approx(202.0)
    assert ses["attributed_j"] + ses["unattributed_j"] == pytest.approx(g["energy_j"])
    assert by["a"]["output_tokens"] == 40
    assert by["b"]["j_per_output_token"] == pytest.approx(100.8 / 20)
    assert ses["per_session_j"]["max"] == pytest.approx(353.2)


def test_report_formats_show_the_gpu_section(results: Path) -> None:
    r = build_report(results)
    text = to_text(r, width=160)
    assert "counter 656.0 J / power integral 650.0 J (difference +0.92%)" in text
    assert "GPU 1 energy: counter / power integral" in text and "156.0 / 150.0 J (+4.00%)" in text
    assert "joules per output token" in text and "10.9333" in text
    assert "output tokens/s per kW" in text and "91.5" in text
    assert "202.0 J (30.8%)" in text  # unattributed share of 656 J
    assert "GPU 0 power W" in text and "150.0 / 100.0 / 200.0 (n=4)" in text
    assert "10.0 samples/s, CPU 0.50% of a core" in text
    md = to_markdown(r)
    assert "## GPU energy" in md and "## GPU telemetry over the measured window" in md
    d = json.loads(to_json(r))
    assert d["gpu"]["energy_j"] == pytest.approx(656.0)
    assert "gpu,gpu,j_per_request,328.0" in to_csv(r)


def test_a_note_when_counter_and_power_disagree(tmp_path: Path) -> None:
    t = _telemetry().filter(pa.compute.equal(pa.compute.field("gpu"), 1))  # GPU 1 alone: +4%
    root = write_results(tmp_path / "res", _requests(), {"options": {"timing": "max-rate"}})
    pq.write_table(t, root / "gpu_telemetry.parquet")
    g = build_report(root).gpu
    assert g is not None
    assert g["notes"] == [
        "energy counter and power integral differ by +4.0% (more than 2%): "
        "the driver may average its power reading, or the sample interval "
        "is coarse for this window"
    ]
    assert "sessions" not in g  # sessions are not the unit of a max-rate run


def test_no_telemetry_no_section_and_bad_file(tmp_path: Path) -> None:
    root = write_results(tmp_path / "res", _requests(), {})
    assert build_report(root).gpu is None
    assert "GPU energy" not in to_text(build_report(root))
    pq.write_table(pa.table({"t_ns": [1]}), root / "gpu_telemetry.parquet")
    with pytest.raises(InputError, match=r"gpu_telemetry.parquet: missing column 'gpu'"):
        build_report(root)


def test_energy_helpers_edges() -> None:
    t = np.array([0.0, 1.0, 2.0]) * S
    assert counter_energy_j(t[:1], np.array([5.0]), 0, S) is None
    # the window's edges fall inside intervals: linear interpolation of the counter
    assert counter_energy_j(t, np.array([0.0, 1000.0, 3000.0]), 0.5 * S, 1.5 * S) == pytest.approx(
        1.5
    )
    # power 0 -> 100 W over 1 s: held linear; [0.5, 1] s integrates 37.5 J
    assert power_energy_j(t, np.array([0.0, 100.0, 100.0]), 0.5 * S, 1.0 * S) == pytest.approx(37.5)
    # an interval's energy is split by tokens; a window cuts half of the first interval
    per, rest = apportion(
        t,
        np.array([10.0, 20.0]),
        np.array([0.5, 1.5, 1.6]) * S,
        np.array([1, 1, 3]),
        np.array([0, 0, 1]),
        2,
        window_ns=(0.5 * S, 2 * S),
    )
    assert per.tolist() == pytest.approx([5.0 + 5.0, 15.0]) and rest == 0.0


def test_gpu_plot_and_in_flight(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from agent_replay.analysis.gpu_plots import in_flight
    from agent_replay.analysis.plots import NAMES, write_plots

    # a: 1..3 s, b: 2..4 s -> in flight at 0.5, 1, 2.5, 3.5, 4 s: 0, 1, 2, 1, 0
    grid = np.array([0.5, 1.0, 2.5, 3.5, 4.0]) * S
    assert in_flight(np.array([1.0, 2.0]) * S, np.array([3.0, 4.0]) * S, grid).tolist() == [
        0,
        1,
        2,
        1,
        0,
    ]
    r = build_report(results)
    paths = write_plots(r, tmp_path / "plots")
    assert [p.name for p in paths] == [*NAMES, "gpu.png"]
    assert (tmp_path / "plots" / "gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
