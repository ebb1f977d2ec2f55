"""GPU telemetry sources and sampler: a fake NVML (engines.telemetry.fake), a recorded DCGM
exporter page served on loopback, the sampler's cadence on a fake clock, the sampler
process writing Parquet, and the reasons telemetry is off."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.engines.telemetry import (
    DcgmBackend,
    NvmlBackend,
    Sampler,
    Source,
    TelemetryOff,
    TelemetryProcess,
    check_spec,
    parse_dcgm,
    resolve,
)
from agent_replay.engines.telemetry.backends import MIB
from agent_replay.engines.telemetry.fake import FakeNvml
from agent_replay.errors import InputError
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA
from tests.engines.dcgm_page import PAGE, DcgmPage

S = 1_000_000_000


class FakeClock:
    """now() in ns; ``wait(timeout)`` advances by the timeout and stops after ``ticks``."""

    def __init__(self, ticks: int, read_ns: int = 0) -> None:
        self.t = 1_000 * S
        self.ticks, self.waits = ticks, []  # type: ignore[var-annotated]
        self.read_ns = read_ns

    def now(self) -> int:
        return self.t

    def wait(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        self.t += round(timeout_s * S)
        return len(self.waits) >= self.ticks


def ramp(i: int, t_s: float) -> float:
    """Power rising 100 W/s from 200 W (GPU 0) or 300 W (GPU 1)."""
    return 200.0 + 100.0 * i + 100.0 * t_s


# -- NVML ------------------------------------------------------------------------------------


def test_nvml_backend_reads_every_field_in_schema_units() -> None:
    clock = FakeClock(0)
    nv = FakeNvml(3, clock_ns=clock.now)
    b = NvmlBackend(nv)
    infos = b.open()
    assert [(g.index, g.uuid, g.name) for g in infos] == [
        (i, f"GPU-fake-000{i}", "Fake GPU") for i in range(3)
    ]
    clock.t += 2 * S
    rows = b.sample()
    assert len(rows) == 3
    # GPU 2: util 60/24 %, 62 GiB used of 141 GiB, 320 W (320000 mW), 42 C, 1980/2619 MHz,
    # energy = 1e9 mJ + 320 W x 2 s = 1e9 + 640000 mJ
    assert rows[2] == (
        2,
        "GPU-fake-0002",
        60.0,
        None,
        24.0,
        None,
        62 << 30,
        141 << 30,
        320.0,
        1_000_640_000,
        42.0,
        1980.0,
        2619.0,
    )
    b.close()
    assert nv.initialized == 0


def test_nvml_unsupported_reading_is_null_and_not_asked_again() -> None:
    nv = FakeNvml(2, no_energy=True)
    b = NvmlBackend(nv)
    b.open()
    first = b.sample()
    calls = nv.calls
    second = b.sample()
    assert [r[9] for r in first + second] == [None] * 4
    assert nv.calls - calls == 2 * 6  # six readings per GPU; the energy counter is skipped
    assert second[0][8] == 300.0


def test_nvml_off_reasons() -> None:
    with pytest.raises(TelemetryOff, match="no NVIDIA driver"):
        NvmlBackend(FakeNvml(driver=False)).open()
    nv = FakeNvml(0)
    with pytest.raises(TelemetryOff, match="NVML finds no GPU"):
        NvmlBackend(nv).open()
    assert nv.initialized == 0  # shut down again
    with pytest.raises(TelemetryOff, match=r"GPU 4 does not exist \(NVML finds 2\)"):
        NvmlBackend(FakeNvml(2), indices=[0, 4]).open()
    b = NvmlBackend(FakeNvml(4), indices=[1, 3])
    assert [g.index for g in b.open()] == [1, 3]
    assert [r[0] for r in b.sample()] == [1, 3]


# -- sampler on a fake clock -----------------------------------------------------------------


def test_sampler_cadence_midpoint_stamps_and_energy_against_power() -> None:
    clock = FakeClock(ticks=20)
    nv = FakeNvml(2, clock_ns=clock.now, power_w=ramp)
    b = NvmlBackend(nv)
    b.open()
    s = Sampler(b, 0.1, clock_ns=clock.now, cpu_s=lambda: 0.0)
    s.run(clock.wait)
    # a read now, one per wait, and the closing one after the last wait
    assert s.cost.samples == 21 and s.cost.errors == 0 and s.cost.missed == 0
    assert clock.waits == [pytest.approx(0.1)] * 20
    t = s.table(t0_ns=1_000 * S)
    assert t.schema == GPU_TELEMETRY_SCHEMA
    d = t.to_pydict()
    assert d["t_ns"][::2] == [k * S // 10 for k in range(21)]
    # energy counter of GPU 1 over 2 s of a 300 -> 500 W ramp: 800 J
    e = d["energy_mj"][1::2]
    assert e[-1] - e[0] == 800_000
    # trapezoid of the sampled power over the same span: 800 J
    p, ts = d["power_w"][1::2], d["t_ns"][1::2]
    joules = sum((p[k] + p[k + 1]) / 2 * (ts[k + 1] - ts[k]) / S for k in range(20))
    assert joules == pytest.approx(800.0)


def test_sampler_slow_read_skips_ticks_and_stamps_the_middle() -> None:
    clock = FakeClock(ticks=3)

    class Slow:
        name = "slow"

        def sample(self) -> list[tuple]:
            clock.t += 250_000_000  # a read of 250 ms against a 100 ms interval
            return [(0, None, *([None] * 11))]

    s = Sampler(Slow(), 0.1, clock_ns=clock.now, cpu_s=lambda: 0.0)  # type: ignore[arg-type]
    start = clock.t
    s.run(clock.wait)
    # read 0-250 ms, next tick 300 ms (200 missed: 100 and 200), etc.
    assert [r[0] - start for r in s.rows][:2] == [125_000_000, 425_000_000]
    assert s.cost.missed == 2 * 3
    assert s.cost.as_dict()["read_ms_max"] == 250.0


def test_sampler_counts_failed_reads_and_keeps_going() -> None:
    clock = FakeClock(ticks=4)
    calls = [0]

    class Flaky:
        name = "flaky"

        def sample(self) -> list[tuple]:
            calls[0] += 1
            if calls[0] % 2:
                raise OSError("connection refused")
            return [(0, None, *([None] * 11))]

    s = Sampler(Flaky(), 0.5, clock_ns=clock.now, cpu_s=lambda: 0.0)  # type: ignore[arg-type]
    s.run(clock.wait)
    assert (s.cost.samples, s.cost.errors) == (2, 3)
    assert s.cost.last_error == "OSError: connection refused"
    assert s.cost.as_dict()["samples_per_s"] == pytest.approx(2 / 2.0)


# -- DCGM exporter ---------------------------------------------------------------------------


def test_parse_recorded_dcgm_page() -> None:
    rows, info = parse_dcgm(PAGE.read_text())
    assert info[1].uuid == "GPU-8a2b4c6d-1e3f-4a5b-8c7d-9e0f1a2b3c4d"
    assert info[1].name == "NVIDIA H200"
    g0 = dict(zip(GPU_TELEMETRY_SCHEMA.names[1:], rows[0], strict=True))
    assert g0["gpu_util_pct"] == 93.0
    assert g0["sm_active_pct"] == pytest.approx(78.125)  # ratio 0.781250
    assert g0["mem_util_pct"] == 41.0
    assert g0["dram_active_pct"] == pytest.approx(63.2812)
    assert g0["mem_used_bytes"] == 129658 * MIB
    assert g0["mem_total_bytes"] == (129658 + 12830 + 583) * MIB  # used + free + reserved
    assert g0["power_w"] == 512.348
    assert g0["energy_mj"] == 31035686671
    assert (g0["temp_c"], g0["sm_clock_mhz"], g0["mem_clock_mhz"]) == (47.0, 1980.0, 2619.0)
    assert [r[0] for r in rows] == [0, 1]


def test_parse_dcgm_blank_values_mig_and_missing_fields() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 9223372036854775794\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 100.5\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",GPU_I_ID="1",GPU_I_PROFILE="1g.18gb"} 7\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 10\n'
        'some_other_metric{gpu="0"} 5\n'
    )
    rows, _ = parse_dcgm(text)
    assert rows == [
        (0, "GPU-a", None, None, None, None, 10 * MIB, None, 100.5, None, None, None, None)
    ]
    # spaces after commas, an escaped quote, a timestamp after the value
    rows, info = parse_dcgm(
        'DCGM_FI_DEV_SM_CLOCK{gpu="3", UUID="GPU-c", modelName="a \\"b\\""} 1410 1700000000000\n'
    )
    assert rows[0][0] == 3 and rows[0][-2] == 1410.0 and info[3].name == 'a "b"'
    for bad, msg in (
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0" 5', "line 2: no closing brace"),
        ("DCGM_FI_DEV_GPU_TEMP{gpu=0} 5", "line 2: bad labels"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} hot', "line 2: value 'hot' is not a number"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0"}', "line 2: no value"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_dcgm("# HELP x\n" + bad + "\n")
    # lines of metrics the sampler does not read are not parsed at all
    assert parse_dcgm('DCGM_FI_DEV_XID_ERRORS{gpu="0" broken\n') == ([], {})


def test_dcgm_backend_over_loopback_http() -> None:
    with DcgmPage() as url:
        b = DcgmBackend(url)
        assert [g.uuid for g in b.open()] == [
            "GPU-3f1c2a9e-5b7d-4e21-9a0c-7d1e2f3a4b5c",
            "GPU-8a2b4c6d-1e3f-4a5b-8c7d-9e0f1a2b3c4d",
        ]
        assert b.sample()[1][8] == 431.007
    with DcgmPage("# nothing here\n") as url, pytest.raises(TelemetryOff, match="lists no DCGM"):
        DcgmBackend(url).open()
    with DcgmPage(status=503) as url, pytest.raises(TelemetryOff, match="not reachable"):
        DcgmBackend(url).open()


# -- the sampler process ---------------------------------------------------------------------


def test_process_with_fake_nvml_writes_parquet_on_the_runs_clock(tmp_path: Path) -> None:
    out = tmp_path / "gpu_telemetry.parquet"
    tel = TelemetryProcess(Source("nvml"), 0.05, out, nvml=FakeNvml(2))
    assert tel.start(), tel.off_reason
    t0 = time.monotonic_ns()
    tel.set_t0(t0)
    deadline = time.monotonic() + 20
    while tel.gauges.line()[0] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    info = tel.stop()
    t = pq.read_table(out)
    assert t.schema == GPU_TELEMETRY_SCHEMA
    assert info["enabled"] and info["backend"] == "nvml" and info["rows"] == t.num_rows
    assert [g["uuid"] for g in info["gpus"]] == ["GPU-fake-0000", "GPU-fake-0001"]
    cost = info["cost"]
    assert cost["samples"] * 2 == t.num_rows and cost["samples"] >= 3
    assert cost["cpu_s"] >= 0 and cost["samples_per_s"] > 0 and cost["errors"] == 0
    ts = t.column("t_ns").to_pylist()
    assert ts[0] < 0 < ts[-1]  # a sample before t0 and one at the stop, on offsets from t0
    assert ts[-1] < time.monotonic_ns() - t0


def test_process_dcgm_over_loopback(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    with DcgmPage(live=True) as url:
        tel = TelemetryProcess(Source("dcgm", url=url), 0.05, out)
        assert tel.start(), tel.off_reason
        tel.set_t0(time.monotonic_ns())
        time.sleep(0.4)
        info = tel.stop()
    t = pq.read_table(out).to_pydict()
    assert info["backend"] == "dcgm" and info["source"] == f"DCGM exporter {url}"
    e0 = [e for e, g in zip(t["energy_mj"], t["gpu"], strict=True) if g == 0]
    assert e0[-1] > e0[0]  # the live page's counter advanced


def test_process_off_says_why_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    tel = TelemetryProcess(Source("nvml"), 0.1, out, nvml=FakeNvml(driver=False))
    assert not tel.start()
    assert tel.off_line() == (
        "GPU telemetry off: NVML cannot start (NVML Shared Library Not "
        "Found): no NVIDIA driver on this host"
    )
    assert tel.stop() == {"enabled": False, "source": "NVML", "reason": tel.off_reason}
    assert not out.exists()


# -- choosing the source ---------------------------------------------------------------------


def test_resolve_and_check_spec() -> None:
    assert resolve("auto", "http://127.0.0.1:8000") == (Source("nvml"), "")
    assert resolve("auto", "http://localhost:8000")[0] == Source("nvml")
    assert resolve("auto", "http://10.1.2.3:8000", launched=True)[0] == Source("nvml")
    src, why = resolve("auto", "http://10.1.2.3:8000")
    assert src is None and why == (
        "the server (10.1.2.3) is not on this host; pass --gpu-metrics URL of its DCGM exporter"
    )
    assert resolve("nvml:0,2", "http://10.1.2.3:8000")[0] == Source("nvml", indices=(0, 2))
    assert resolve("http://h:9400/metrics", "http://x")[0] == Source(
        "dcgm", url="http://h:9400/metrics"
    )
    assert resolve("off", "http://127.0.0.1:1") == (None, "turned off (--gpu-metrics off)")
    # a launched server's CUDA_VISIBLE_DEVICES picks the GPUs auto samples
    assert resolve("auto", "http://127.0.0.1:8", True, "2,3")[0] == Source("nvml", indices=(2, 3))
    assert resolve("auto", "http://127.0.0.1:8", True, "GPU-1a2b")[0] == Source("nvml")
    assert resolve("auto", "http://127.0.0.1:8", False, "1")[0] == Source("nvml", indices=(1,))
    assert resolve("nvml:0", "http://127.0.0.1:8", True, "1")[0] == Source("nvml", indices=(0,))
    for bad, msg in (
        ("nvml:a", "'a' is not a GPU index"),
        ("gpu", "expected auto, off"),
        ("http://", "no host"),
        ("nvml:-1", ">= 0"),
    ):
        with pytest.raises(InputError, match=msg):
            check_spec(bad)


def test_vllm_vendored_bindings_are_loaded_without_importing_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from agent_replay.engines.telemetry.source import load_pynvml, nvml_unavailable, vendored_pynvml

    pkg = tmp_path / "vllm"
    (pkg / "third_party").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('vllm itself must not be imported')\n")
    (pkg / "third_party" / "pynvml.py").write_text("MARK = 'vendored'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py absent
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert vendored_pynvml() == pkg / "third_party" / "pynvml.py"
    assert load_pynvml().MARK == "vendored"
    assert "vllm" not in sys.modules
    assert nvml_unavailable() != "nvidia-ml-py is not installed (pip install 'agent-replay[gpu]')"


# -- the dashboard's GPU line ----------------------------------------------------------------


def test_gauges_aggregate_and_line() -> None:
    from agent_replay.engines.telemetry.gauges import aggregate, line

    nv = FakeNvml(2, clock_ns=FakeClock(0).now)
    b = NvmlBackend(nv)
    b.open()
    rows = b.sample()
    e0 = float(sum(r[9] for r in rows)) - 2_500_000  # 2.5 kJ before this read
    g = aggregate(rows, e0)
    # util 50 and 55 %, power 300 + 310 W, memory 60 + 61 GiB of 2 x 141, hottest 41 C
    assert g["util_pct"] == 52.5 and g["power_w"] == 610.0 and g["energy_j"] == 2500.0
    assert (g["mem_used_gib"], g["mem_total_gib"], g["temp_max_c"]) == (121.0, 282.0, 41.0)
    assert line(g) == "GPU 2x: util 52%  power 610 W  energy 2.5 kJ  memory 121/282 GiB  max 41 C"
    # DCGM has SM activity; without a first energy reading energy is left out. Page:
    # util (93 + 71) / 2, SM (78.125 + 55.37) / 2, power 512.348 + 431.007 W, memory
    # (129,658 + 128,486) MiB = 252.1 GiB of 2 x (used + free + reserved) = 279.4 GiB
    rows, _ = parse_dcgm(PAGE.read_text())
    assert line(aggregate(rows, None)) == (
        "GPU 2x: util 82% (SM 67%)  power 943 W  memory 252/279 GiB  max 52 C"
    )


def test_process_feeds_the_dashboard_line(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from agent_replay.analysis.dashboard import render_dashboard
    from agent_replay.analysis.live import LiveStats

    tel = TelemetryProcess(Source("nvml"), 0.05, None, nvml=FakeNvml(2))
    assert tel.gauges.line() == (0, "")
    assert tel.start()
    deadline = time.monotonic() + 10
    while tel.gauges.line()[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tel.stop()
    n, text = tel.gauges.line()
    assert n >= 3 and text.startswith("GPU 2x: util 52%  power 610 W  energy ")
    buf = io.StringIO()
    Console(file=buf, width=120).print(render_dashboard(LiveStats(), 120, 30, gpu_line=text))
    assert "GPU 2x: util 52%  power 610 W" in buf.getvalue()


def test_long_runs_flush_rows_to_the_file_as_they_come() -> None:
    clock = FakeClock(ticks=10)
    b = NvmlBackend(FakeNvml(2, clock_ns=clock.now))
    b.open()
    got: list[int] = []
    s = Sampler(
        b,
        0.1,
        clock_ns=clock.now,
        cpu_s=lambda: 0.0,
        flush_rows=6,
        sink=lambda rows: got.append(len(rows)) or len(got) > 1,
    )  # refuses the first
    s.run(clock.wait)
    # 11 reads x 2 GPUs: refused at 6 rows, taken at 8, then at 6 and 6; 2 left
    assert got == [6, 8, 6, 6] and s.rows_flushed == 20 and len(s.rows) == 2


@pytest.mark.timing
def test_the_telemetry_process_writes_row_groups_as_it_reads(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    tel = TelemetryProcess(Source("nvml"), 0.02, out, nvml=FakeNvml(2), flush_rows=4)
    assert tel.start()
    tel.set_t0(time.monotonic_ns())
    deadline = time.monotonic() + 20
    while tel.gauges.line()[0] < 8 and time.monotonic() < deadline:  # 8 reads, however slow
        time.sleep(0.05)
    info = tel.stop()
    f = pq.ParquetFile(out)
    assert f.metadata.num_row_groups >= 3 and f.metadata.num_rows == info["rows"]
    assert f.schema_arrow == GPU_TELEMETRY_SCHEMA
    ts = f.read().column("t_ns").to_pylist()
    assert ts == sorted(ts) and ts[-1] < 30 * S  # offsets from t0 in every row group
