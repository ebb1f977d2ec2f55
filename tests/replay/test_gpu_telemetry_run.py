"""GPU telemetry beside a real run on the simulated engine: a DCGM exporter page on
loopback gives gpu_telemetry.parquet on the run's clock and the sampler's cost in run.json;
without GPUs the run says in one line that telemetry is off and why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agent_replay.analysis.results import read_run_record
from agent_replay.engines.sim import SimProcess
from agent_replay.engines.telemetry.source import nvml_unavailable
from agent_replay.errors import InputError
from agent_replay.replay.cli import build_parser
from agent_replay.replay.cli.cmd_run import config_from_args
from agent_replay.replay.config import RunConfig
from agent_replay.replay.run import run
from agent_replay.results_schema import GPU_TELEMETRY_SCHEMA
from tests.engines.dcgm_page import DcgmPage
from tests.replay.helpers import MS, chain_rows, write_rows


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess("fast") as s:
        yield s


def _trace(tmp_path: Path) -> Path:
    return write_rows(
        tmp_path / "t.parquet", chain_rows(4, 3, gap_ns=50 * MS, think_ns=50 * MS, output_tokens=20)
    )


def test_run_with_dcgm_exporter_writes_telemetry(sim: SimProcess, tmp_path: Path) -> None:
    out = tmp_path / "res"
    lines: list[str] = []
    with DcgmPage(live=True) as url:
        s = run(
            RunConfig(
                trace=str(_trace(tmp_path)),
                target=sim.url,
                output=str(out),
                salt=0,
                scrape_interval_s=0,
                gpu_metrics=url,
                gpu_interval_s=0.05,
            ),
            progress=lines.append,
        )
    assert s.ok == 12
    assert not any("GPU telemetry off" in x for x in lines)
    g = read_run_record(out).gpu_telemetry
    assert g["enabled"] and g["backend"] == "dcgm" and g["file"] == "gpu_telemetry.parquet"
    assert [x["name"] for x in g["gpus"]] == ["NVIDIA H200"] * 2
    assert g["cost"]["samples"] >= 3 and g["cost"]["errors"] == 0
    assert g["cost"]["samples_per_s"] > 0 and g["cost"]["cpu_percent"] is not None
    t = pq.read_table(out / "gpu_telemetry.parquet")
    assert t.schema == GPU_TELEMETRY_SCHEMA
    assert t.num_rows == 2 * g["cost"]["samples"] == g["rows"]
    # on the requests' clock: samples before the first request and after the last one ends
    req = pq.read_table(out / "requests").to_pydict()
    ts = t.column("t_ns").to_pylist()
    assert min(ts) < min(req["sent_ns"]) and max(ts) > max(req["end_ns"])


def test_run_without_gpus_says_why_in_one_line(sim: SimProcess, tmp_path: Path) -> None:
    why = nvml_unavailable()
    if why is None:
        pytest.skip("this host has NVML and a driver")
    from agent_replay.replay.scrape import host_has_nvidia

    out = tmp_path / "res"
    lines: list[str] = []
    run(
        RunConfig(
            trace=str(_trace(tmp_path)),
            target=sim.url,
            output=str(out),
            salt=0,
            scrape_interval_s=0,
            gpu_metrics="nvml",
        ),
        progress=lines.append,
    )
    assert [x for x in lines if "GPU telemetry" in x] == [f"GPU telemetry off: {why}"]
    assert read_run_record(out).gpu_telemetry == {"enabled": False, "reason": why}
    assert not (out / "gpu_telemetry.parquet").exists()
    # not asked for (auto): said only on a host with an NVIDIA driver; run.json keeps it
    lines.clear()
    run(
        RunConfig(
            trace=str(_trace(tmp_path)),
            target=sim.url,
            output=str(tmp_path / "auto"),
            salt=0,
            scrape_interval_s=0,
        ),
        progress=lines.append,
    )
    said = [x for x in lines if "GPU telemetry" in x]
    assert said == ([f"GPU telemetry off: {why}"] if host_has_nvidia() else [])
    assert read_run_record(tmp_path / "auto").gpu_telemetry["enabled"] is False


def test_bad_gpu_metrics_value_is_an_input_error(tmp_path: Path) -> None:
    cfg = RunConfig(trace=str(_trace(tmp_path)), target="http://127.0.0.1:9", gpu_metrics="nvml:x")
    with pytest.raises(InputError, match="--gpu-metrics 'nvml:x'"):
        run(cfg, progress=None)


def test_unreachable_exporter_is_one_line_and_the_run_goes_on(
    sim: SimProcess, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    out = tmp_path / "res"
    lines: list[str] = []
    s = run(
        RunConfig(
            trace=str(_trace(tmp_path)),
            target=sim.url,
            output=str(out),
            salt=0,
            scrape_interval_s=0,
            gpu_metrics=url,
        ),
        progress=lines.append,
    )
    assert s.ok == 12 and s.exit_code == 0
    off = [x for x in lines if "GPU telemetry" in x]
    assert len(off) == 1 and off[0].startswith(
        f"GPU telemetry off: DCGM exporter {url} not reachable ("
    )
    meta = read_run_record(out)
    assert meta.gpu_telemetry["enabled"] is False and meta.status == "ok"


def test_cli_options() -> None:
    parser = build_parser()
    base = ["run", "t.parquet", "--target", "http://127.0.0.1:1"]
    cfg = config_from_args(parser.parse_args(base), "http://127.0.0.1:1")
    assert (cfg.gpu_metrics, cfg.gpu_interval_s) == ("auto", 0.1)
    args = parser.parse_args(
        [*base, "--gpu-metrics", "http://h:9400/metrics", "--gpu-interval", "0.5"]
    )
    cfg = config_from_args(args, args.target)
    assert (cfg.gpu_metrics, cfg.gpu_interval_s) == ("http://h:9400/metrics", 0.5)
    args = parser.parse_args([*base, "--no-gpu-metrics"])
    assert config_from_args(args, args.target).gpu_metrics == "off"
    with pytest.raises(InputError, match="--gpu-interval-s must be > 0"):
        RunConfig(trace="t", target="http://127.0.0.1:1", gpu_interval_s=0).check()


def test_which_gpus_a_run_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_replay.engines.telemetry import Source
    from agent_replay.replay.scrape import gpu_source

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    remote = RunConfig(trace="t", target="http://10.9.9.9:8000")
    local = RunConfig(trace="t", target="http://127.0.0.1:8000")
    # run --launch (no kind) and a sweep's launch target: the server's CUDA_VISIBLE_DEVICES
    assert gpu_source(remote, {"env": {"CUDA_VISIBLE_DEVICES": "1"}})[0] == Source(
        "nvml", indices=(1,)
    )
    assert gpu_source(remote, {"kind": "launch", "env": {}})[0] == Source("nvml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_source(remote, {"kind": "launch", "env": {}})[0] == Source("nvml", indices=(0, 1))
    # a sweep's URL target is not launched: a remote one is off, a local one is every GPU
    src, why = gpu_source(remote, {"kind": "url"})
    assert src is None and "not on this host" in why
    assert gpu_source(local, {"kind": "url"})[0] == Source("nvml")
    assert gpu_source(local, {"kind": "sim"})[0] == Source("nvml")


def test_a_local_servers_cuda_visible_devices_picks_its_gpus(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys
    import time

    from agent_replay.engines.telemetry import Source
    from agent_replay.engines.telemetry.source import server_visible_devices
    from agent_replay.replay.scrape import gpu_source

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while server_visible_devices(url) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server_visible_devices(url) == "3"
        cfg = RunConfig(trace="t", target=url)
        assert gpu_source(cfg, None)[0] == Source("nvml", indices=(3,))
        assert gpu_source(cfg, {"kind": "url"})[0] == Source("nvml", indices=(3,))
        assert gpu_source(replace_spec(cfg, "nvml"), None)[0] == Source("nvml")  # named: kept
    finally:
        proc.terminate()
        proc.wait(10)
    assert server_visible_devices("http://10.9.9.9:8000") is None


def replace_spec(cfg: RunConfig, spec: str) -> RunConfig:
    from dataclasses import replace

    return replace(cfg, gpu_metrics=spec)
