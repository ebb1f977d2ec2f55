#!/usr/bin/env bash
# The GPU telemetry sampler's cost on a GPU host (issue 22): benchmarks/bench_telemetry.py
# with the host's real NVML (every GPU it has), the fake NVML with 8 devices
# and an 8-GPU DCGM exporter page on loopback, at 10 Hz, rounds interleaved; during the real
# rounds every GPU runs bf16 matrix multiplies (when torch is importable), so the energy
# counter is checked against the power integral under load. No vLLM or model is needed.
#
# On the device, from the repo root, with carry [".whl"] holding the wheels the image may
# lack (nvidia-ml-py; hdrhistogram, pbr): without nvidia-ml-py the bindings vLLM ships are
# used when vLLM is on PYTHONPATH (/tmp/site after benchmarks/gpu/device-setup.sh).
#   bash benchmarks/gpu/run_telemetry.sh > $OUT/telemetry.log 2>&1; cp /tmp/telemetry/* $OUT/
# Options (environment): PY (python3), SECONDS_PER_ROUND (30), REPEAT (3), GPUS (8: fake and
# DCGM devices), OUTDIR (/tmp/telemetry).
# Time: sources x REPEAT x (SECONDS_PER_ROUND + ~8 s): about 6 minutes with the defaults.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
PY=${PY:-python3}; OUTDIR=${OUTDIR:-/tmp/telemetry}; SECS=${SECONDS_PER_ROUND:-30}; REPEAT=${REPEAT:-3}; GPUS=${GPUS:-8}
mkdir -p "$OUTDIR"
export PYTHONPATH=/tmp/site:$ROOT PYTHONUNBUFFERED=1
if ls "$ROOT"/.whl/*.whl > /dev/null 2>&1; then
  $PY -c 'import pynvml, hdrh' 2> /dev/null || $PY -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --target /tmp/site "$ROOT"/.whl/*.whl 2>&1 | grep -v WARNING | tail -3
fi
{ date -u; uname -a; nvidia-smi 2>&1 | head -25; $PY -V
  $PY -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))' 2>&1 | tail -1
  git -C "$ROOT" log -1 --format='agent-replay commit %H' 2>/dev/null; } > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"
LOAD=
if $PY -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  LOAD="$PY $ROOT/benchmarks/gpu/matmul_load.py"
fi
timeout -k 5 580 $PY benchmarks/bench_telemetry.py --source real,fake,dcgm --gpus "$GPUS" \
  --interval 0.1 --seconds "$SECS" --repeat "$REPEAT" --json "$OUTDIR/telemetry-cost.json" \
  ${LOAD:+--load "$LOAD"} > "$OUTDIR/telemetry-cost.md" 2> "$OUTDIR/rounds.log"
echo "rc=$?"
cat "$OUTDIR/telemetry-cost.md"
