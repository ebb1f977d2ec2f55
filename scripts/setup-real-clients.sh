#!/usr/bin/env bash
# Installs the real agent programs the `realclient` tests drive: Claude Code (the current
# release as `claude`, and 2.1.197 as `claude-2.1.197`), Codex CLI, opencode, qwen-code and
# Gemini CLI 0.61.0 (npm, into .real-clients/ of the repository), mini-swe-agent and the OpenAI
# Agents SDK (pip, into the venv), aider (pip, pinned, into a venv of its own:
# .real-clients/aider, since it pins its many dependencies exactly). The current Claude Code
# needs node >= 22: the system's when it is new enough,
# else the npm `node` package's (into .real-clients/node22, used for these installs).
# Each is skipped with a reason when its registry cannot be reached; the tests then skip.
#
#   scripts/setup-real-clients.sh [PYTHON]      # PYTHON: the venv's python (default .venv/bin/python)
#
# The tests find the programs in .real-clients/bin (or on PATH).
set -u
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
PREFIX="$PWD/.real-clients"
mkdir -p "$PREFIX"
status=0

npm_install() {  # package, binary, [prefix]
    local prefix="${3:-$PREFIX}"
    if ! command -v npm >/dev/null 2>&1; then
        echo "setup-real-clients: skip $1: npm not installed"; return
    fi
    if ! timeout 60 npm view "$1" version >/dev/null 2>&1; then
        echo "setup-real-clients: skip $1: npm registry not reachable"; return
    fi
    if timeout 600 npm install -g --prefix "$prefix" --no-audit --no-fund "$1" >/dev/null 2>&1 \
            && [ -x "$prefix/bin/$2" ]; then
        echo "setup-real-clients: $1 $("$prefix/bin/$2" --version 2>/dev/null | head -1)"
    else
        echo "setup-real-clients: $1: npm install failed"; status=1
    fi
}

node_major() { "${1:-node}" --version 2>/dev/null | sed -n 's/^v\([0-9]*\).*/\1/p'; }

# node >= 22 first: npm installs the newest release whose engines the running node meets
if [ "$(node_major)" -ge 22 ] 2>/dev/null; then
    echo "setup-real-clients: node $(node --version)"
else
    npm_install node@22 node "$PREFIX/node22"
    if [ "$(node_major "$PREFIX/node22/bin/node")" -ge 22 ] 2>/dev/null; then
        export PATH="$PREFIX/node22/bin:$PATH"
    else
        echo "setup-real-clients: no node >= 22: the current Claude Code may not install"
    fi
fi

npm_install @anthropic-ai/claude-code@latest claude
npm_install @anthropic-ai/claude-code@2.1.197 claude "$PREFIX/claude-2.1.197"
if [ -x "$PREFIX/claude-2.1.197/bin/claude" ]; then
    mkdir -p "$PREFIX/bin"
    ln -sf "$PREFIX/claude-2.1.197/bin/claude" "$PREFIX/bin/claude-2.1.197"
fi
npm_install @openai/codex codex
npm_install opencode-ai opencode
npm_install @qwen-code/qwen-code qwen  # node >= 22 too
npm_install @google/gemini-cli@0.61.0 gemini  # pinned: its settings keys and flags change

if "$PY" -c "import minisweagent" >/dev/null 2>&1; then
    echo "setup-real-clients: mini-swe-agent already installed"
elif timeout 600 "$PY" -m pip install -q mini-swe-agent >/dev/null 2>&1; then
    echo "setup-real-clients: mini-swe-agent $("$PY" -m pip show mini-swe-agent 2>/dev/null | sed -n 's/^Version: //p')"
else
    echo "setup-real-clients: skip mini-swe-agent: PyPI not reachable or install failed"
fi

if "$PY" -c "import agents" >/dev/null 2>&1; then
    echo "setup-real-clients: openai-agents already installed"
elif timeout 600 "$PY" -m pip install -q openai-agents >/dev/null 2>&1; then
    echo "setup-real-clients: openai-agents $("$PY" -m pip show openai-agents 2>/dev/null | sed -n 's/^Version: //p')"
else
    echo "setup-real-clients: skip openai-agents: PyPI not reachable or install failed"
fi
AIDER=aider-chat==0.86.2
if [ -x "$PREFIX/bin/aider" ]; then
    echo "setup-real-clients: aider already installed"
elif python3 -m venv "$PREFIX/aider" >/dev/null 2>&1 \
        && timeout 900 "$PREFIX/aider/bin/pip" install -q "$AIDER" >/dev/null 2>&1 \
        && [ -x "$PREFIX/aider/bin/aider" ]; then
    mkdir -p "$PREFIX/bin"
    ln -sf "$PREFIX/aider/bin/aider" "$PREFIX/bin/aider"
    echo "setup-real-clients: $AIDER"
else
    echo "setup-real-clients: skip $AIDER: PyPI not reachable or install failed"
fi
exit $status
