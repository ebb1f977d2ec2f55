#!/usr/bin/env bash
# Make the inputs of the GPU runs here (no GPU), into .dev/gpu/ (ignored by git), so that
# they travel to the GPU machine with `carry: [".dev/gpu"]`:
#   tiny-deepseek/        tiny DeepSeek-V3-shaped config + offline tokenizer (vocab 32000)
#   agent-session.parquet one real mini-swe-agent session (LMCache trace), 30 requests
#   agents-multi/         four mini-swe-agent sessions that fit a 16k context (part files)
#   mooncake-slice.parquet Mooncake conversation trace, first 240 s, requests <= 16000 tokens
#   fixed-cN.parquet      2048 in / 256 out, no shared prefix (N = 1, 16, 64, 128: 16, 96,
#                         256 and 512 requests)
# Usage (from the repo root): bash benchmarks/gpu/prepare_inputs.sh [SHARED_DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data}
AR=".venv/bin/python -m agent_replay"
PY=.venv/bin/python
D=.dev/gpu
mkdir -p "$D" "$D/agents-multi"
[ -f "$D/tiny-deepseek/config.json" ] || \
  $AR engines tiny-model "$D/tiny-deepseek" --arch deepseek --vocab 32000 --force
TOK="$D/tiny-deepseek/tokenizer.json"
MS="$DATA/lmcache_agent_trace/miniswe"
$AR traces import "$MS/0d858f596973e20b4e8a66cc6d7efb8d.jsonl" --format lmcache \
  --tokenizer "$TOK" -o "$D/agent-session.parquet" --force
for s in 0d858f596973e20b4e8a66cc6d7efb8d 189f0222310bd8eee310f204e91b9c84 \
         2e9e99a583d052783791ec77ebb905a2 39f322b0; do
  f=$(ls "$MS"/"$s"*.jsonl | head -1)
  $AR traces import "$f" --format lmcache --tokenizer "$TOK" \
    -o "$D/agents-multi/${s:0:8}.parquet" --force
done
$AR traces import "$DATA/mooncake/conversation_trace.jsonl" -o "$D/mooncake-full.parquet" --force
$PY benchmarks/gpu/make_inputs.py slice "$D/mooncake-full.parquet" "$D/mooncake-slice.parquet" \
  --start 0 --window 240 --max-total 16000 --force
rm -f "$D/mooncake-full.parquet"
$PY benchmarks/gpu/make_inputs.py fixed "$D/fixed-c1.parquet" --requests 16 --force
$PY benchmarks/gpu/make_inputs.py fixed "$D/fixed-c16.parquet" --requests 96 --force
# capacity runs (single GPU vs Wide-EP): 4 waves each at concurrency 64 and 128
$PY benchmarks/gpu/make_inputs.py fixed "$D/fixed-c64.parquet" --requests 256 --force
$PY benchmarks/gpu/make_inputs.py fixed "$D/fixed-c128.parquet" --requests 512 --force
du -sh "$D"
