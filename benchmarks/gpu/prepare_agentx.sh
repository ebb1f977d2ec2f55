#!/usr/bin/env bash
# Make the inputs of run_agentx.sh here (no GPU), into .dev/gpu/ (ignored by git), so that
# they travel to the GPU machine with `carry: [".dev/gpu"]`:
#   moonlight/  Moonlight-16B-A3B's DeepSeek-V3 shape with one MTP layer, offline tokenizer
#   agentx/     the weka traces of ../shared/data/weka whose every call fits 131,072 tokens
#               (9 of 14; 0274, 0277 and 0291 hold subagents), one Parquet file each
# Usage (from the repo root): bash benchmarks/gpu/prepare_agentx.sh [SHARED_DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
AR=".venv/bin/python -m agent_replay"
D=.dev/gpu
mkdir -p "$D/agentx"
[ -f "$D/moonlight/config.json" ] || $AR engines tiny-model "$D/moonlight" --arch moonlight --force
for t in 0076 0106 0226 0274 0277 0291 0398 0653 0676; do
  $AR traces import "$DATA/weka/trace_$t.json" -o "$D/agentx/trace_$t.parquet" --force
done
du -sh "$D/moonlight" "$D/agentx"
