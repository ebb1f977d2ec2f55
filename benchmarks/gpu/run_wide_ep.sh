#!/usr/bin/env bash
# Wide-EP: the tiny DeepSeek-V3-shaped model (64 routed experts: 32/16/8 per rank on 2/4/8
# GPUs) under the `wide-ep` profile (data-parallel attention, --enable-expert-parallel, the
# all2all backend vLLM has on one node: allgather_reducescatter), once with EPLB and once
# without, both started through `agent-replay engines launch` and measured one at a time with
# the same traces as the single-GPU `standard` run of run_gpu.sh:
#   mooncake  the 240 s Mooncake conversation slice, absolute timing, --speedup 8
#   agents    four mini-swe-agent sessions x4 clones (16 users), session timing, --speedup 2
#   max-cN    2048 in / 256 out at max rate, concurrency 128 and 64: capacity per GPU
# Before that, the wide-ep commands for 2, 4 and 8 GPUs (with and without EPLB) are checked
# with the installed vLLM's own parser (results/wide-ep-cmds.txt).
#
# On a machine with N >= 2 GPUs, after the staging of docs/gpu.md, from the repo root:
#   bash benchmarks/gpu/run_wide_ep.sh --gpus 2 --out "$OUT/wide-ep"
# On one GPU it only checks the commands. Locally, with the simulated engine:
#   bash benchmarks/gpu/run_wide_ep.sh --dry-run --gpus 2 --out /tmp/wide-ep-dry
# Compare afterwards with the single-GPU run (throughput per GPU, P90 TPS, TTFT tail):
#   agent-replay compare gpu/results/std-mooncake wide-ep/results/wep-noeplb-mooncake \
#     wide-ep/results/wep-eplb-mooncake
set -u
DRY=0; OUTDIR=${OUT:-/tmp}/wide-ep; BUDGET=560; SETUP=1; GPUS=2
script_option() { case $1 in --gpus) GPUS=$2 ;; *) return 1 ;; esac; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"

device_setup
if [ "$DRY" = 0 ]; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  NGPU=$GPUS
fi
{ date -u; uname -a; nvidia-smi 2>&1 | head -30; nvidia-smi topo -m 2>&1;
  $PY -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1;
  $PY -c 'import deep_ep' 2>&1 | tail -1; } > "$LOG/env.txt" 2>&1

EPLB_SETS=(--set eplb_window_size=1000 --set eplb_step_interval=1000)
(
  for g in 2 4 8; do
    for e in true false; do
      echo "### wide-ep --gpus $g eplb=$e"
      $AR engines vllm-cmd wide-ep --model "$MODEL" --gpus $g --set eplb=$e \
        "${EPLB_SETS[@]}" --set max-model-len=16384 2>&1
    done
  done
  echo "### wide-ep --gpus 16 --nodes 2 eplb=true (two nodes of 8)"
  $AR engines vllm-cmd wide-ep --model "$MODEL" --gpus 16 --nodes 2 "${EPLB_SETS[@]}" \
    --set max-model-len=16384 2>&1
) > "$RES/wide-ep-cmds.txt" 2>&1 &
CHECK_PID=$!

if [ "$NGPU" -lt "$GPUS" ] || [ "$GPUS" -lt 2 ]; then
  echo "$NGPU GPU(s) here, $GPUS asked: only the command check runs" | tee -a "$LOG/steps.tsv"
  wait $CHECK_PID
else
  KV=$((24 * 1024 * 1024 * 1024))
  DEV=$(seq -s, 0 $((GPUS - 1)))
  if [ "$DRY" = 1 ]; then
    P_ON=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
    P_OFF=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
  else
    P_ON=8300; P_OFF=8400
  fi
  # Both start together with a fixed KV cache each (no memory-profiling race between them).
  # Distinct DP RPC ports (one node: vLLM hands engines over IPC, but the two must not share
  # the default port in any case).
  start_server wep-eplb $P_ON wide-ep "$DEV" "$GPUS" --set eplb=true "${EPLB_SETS[@]}" \
    --set kv-cache-memory-bytes=$KV --set gpu-memory-utilization=0.3 \
    --set data-parallel-rpc-port=29650
  start_server wep-noeplb $P_OFF wide-ep "$DEV" "$GPUS" --set eplb=false \
    --set kv-cache-memory-bytes=$KV --set gpu-memory-utilization=0.3 \
    --set data-parallel-rpc-port=29750
  wait $CHECK_PID
  wait_healthy $(( $(left) - 200 )) $P_ON $P_OFF
  for pair in "wep-noeplb $P_OFF" "wep-eplb $P_ON"; do
    set -- $pair
    n=$1; url="http://127.0.0.1:$2"
    warm "$2" >> "$LOG/warm.log" 2>&1
    step "$n-mooncake" 80 90 $AR run "$IN/mooncake-slice.parquet" --target "$url" \
      --api completions --timing absolute --speedup 8 --workers 4 --scrape-interval 1 \
      --salt 2 -o "$RES/$n-mooncake" --force --no-progress
    step "$n-agents" 40 50 $AR run "$IN/agents-multi" --target "$url" --api completions \
      --speedup 2 --sessions-multiplier 4 --scrape-interval 1 --salt 4 \
      -o "$RES/$n-agents" --force --no-progress
    capacity "$n" "$2" 128
    capacity "$n" "$2" 64
  done
  stop_server wep-eplb & stop_server wep-noeplb & wait
  cp "$LOG/wep-eplb.launch.json" "$LOG/wep-noeplb.launch.json" "$RES/" 2>/dev/null
  bash benchmarks/gpu/report_all.sh "$RES" "$GPUS" $(( T0 + BUDGET - 15 )) > "$LOG/reports.log" 2>&1
  for w in mooncake agents max-c128 max-c64; do
    if [ -d "$RES/wep-noeplb-$w" ] && [ -d "$RES/wep-eplb-$w" ] && [ "$(left)" -ge 20 ]; then
      $AR compare "$RES/wep-noeplb-$w" "$RES/wep-eplb-$w" --format md > "$RES/compare-eplb-$w.md" 2>&1
    fi
  done
  grep -h -i "all2all\|eplb\|expert" "$LOG"/wep-*.server.log 2>/dev/null | sort | uniq -c \
    | sort -rn | head -40 > "$RES/wide-ep-server-notes.txt"
fi
printf 'total\t0\t%s\n' "$(( $(date +%s) - T0 ))" >> "$LOG/steps.tsv"
for f in "$LOG"/*.server.log; do
  [ -f "$f" ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"
done
tar czf "$OUTDIR.tar.gz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
echo "done in $(( $(date +%s) - T0 )) s: $OUTDIR.tar.gz"
