#!/usr/bin/env bash
# Installs NVIDIA AIPerf (PyPI `aiperf`, pinned) into a venv of its own, outside the repository,
# and builds the offline tokenizer that counts tokens as the simulated engine does, so that
# benchmarks/bench_agentx_aiperf.py and tests/replay/test_agentx_aiperf.py can run AIPerf's
# AgentX scenario against `agent-replay engines sim` with no hub access.
#
#   scripts/setup-aiperf.sh [PYTHON]     # PYTHON: an interpreter >= 3.10 (default: python3.11,
#                                        # python3.12, python3.10 or python3, the first found)
#
# Env: AIPERF_VENV (default ~/.cache/agent-replay/aiperf-venv), AIPERF_SIM_TOKENIZER (default
# ~/.cache/agent-replay/sim-tokenizer), AIPERF_VERSION (default 0.13.0). An existing venv with
# that version is reused. Skipped with a reason (exit 0) when PyPI cannot be reached.
set -u
cd "$(dirname "$0")/.."
CACHE="${AGENT_REPLAY_CACHE:-$HOME/.cache/agent-replay}"
VENV="${AIPERF_VENV:-$CACHE/aiperf-venv}"
TOK="${AIPERF_SIM_TOKENIZER:-$CACHE/sim-tokenizer}"
VERSION="${AIPERF_VERSION:-0.13.0}"

PY="${1:-}"
if [ -z "$PY" ]; then
    for c in python3.11 python3.12 python3.10 python3; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
            PY="$c"; break
        fi
    done
fi
if [ -z "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "setup-aiperf: skip: AIPerf needs Python >= 3.10 and none was found (pass one as argument)"
    exit 0
fi

if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -m pip show aiperf 2>/dev/null | sed -n 's/^Version: //p')" = "$VERSION" ]; then
    echo "setup-aiperf: aiperf $VERSION already in $VENV"
else
    if ! timeout 60 "$PY" -m pip download --no-deps -q -d "$(mktemp -d)" "aiperf==$VERSION" >/dev/null 2>&1; then
        echo "setup-aiperf: skip: PyPI not reachable (or aiperf==$VERSION not there)"
        exit 0
    fi
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" || { echo "setup-aiperf: cannot create $VENV"; exit 1; }
    if ! timeout 1200 "$VENV/bin/python" -m pip install -q "aiperf==$VERSION" >/dev/null 2>&1; then
        echo "setup-aiperf: pip install aiperf==$VERSION failed"; exit 1
    fi
    echo "setup-aiperf: aiperf $("$VENV/bin/python" -m pip show aiperf | sed -n 's/^Version: //p') in $VENV"
fi

CORPUS="$("$VENV/bin/python" -c 'import aiperf.dataset.generator as g, os; print(os.path.join(os.path.dirname(g.__file__), "assets", "shakespeare.txt"))')"
"$VENV/bin/python" scripts/make_sim_tokenizer.py "$TOK" "$CORPUS" || { echo "setup-aiperf: tokenizer build failed"; exit 1; }
echo "setup-aiperf: ready (AIPERF_VENV=$VENV AIPERF_SIM_TOKENIZER=$TOK)"
