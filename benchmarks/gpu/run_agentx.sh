#!/usr/bin/env bash
# Real AgentX sessions (weka traces of Claude Code, subagents included) against a DeepSeek-V3
# family MoE of realistic size (Moonlight-16B-A3B's shape, `engines tiny-model --arch
# moonlight`, dummy weights) on ONE GPU, under three profiles that stay up together:
# `standard`, `mtp` (standard + MTP 3 at AgentX's golden acceptance 2.49) and
# `dedicated-decode` (InferenceX AgentX's MTP recipe on one instance). The servers share the
# GPU (a fixed KV cache each); one replay runs at a time.
#
# Phases, each one call of the device tool, back to back while the machine is warm:
#   bash benchmarks/gpu/run_agentx.sh --phase start  --budget 560  # install, servers, warm
#   bash benchmarks/gpu/run_agentx.sh --phase single --budget 560  # concurrency 1, REPEATS
#   bash benchmarks/gpu/run_agentx.sh --phase ladder --budget 560  # LADDER points, 1 repeat
# Every phase ends by packing /root/agentx into $OUT (agentx.tar.gz.NN, 15 MiB pieces).
# Single user: in each repeat the three servers in a seeded random order; repeat r replays
# with AgentX start seed 42 + r on every server (the same requests on each). Ladder: each
# point on LADDER_PROFILES, in a seeded random order, once per seed of LADDER_SEEDS (42).
# Dry run here, with the simulated engine in place of vLLM:
#   bash benchmarks/gpu/run_agentx.sh --dry-run --phase start --out /tmp/ax-dry --budget 120
# A server restarted with other settings, then the single-user runs it lacks:
#   RESTART=ded KV_GIB=ded=6 bash benchmarks/gpu/run_agentx.sh --phase restart --budget 560
# One deployment owning the GPU (the others stopped), then the LADDER on it alone:
#   SOLO=std KV_GIB=std=40 LADDER="1 2 4 6 8" bash benchmarks/gpu/run_agentx.sh --phase solo \
#     --out /root/agentx-solo --budget 560
# Knobs (environment): REPEATS (3), SINGLE_S (30: measured seconds at concurrency 1),
# LADDER ("2 4 8 3"), LADDER_S (25), LADDER_PROFILES ("std ded"), LADDER_SEEDS ("42": AgentX
# start seeds, one repeat each; seed s writes repeat r(s - 41)), WARMUP_REQUESTS (3),
# KV_GIB ("std=8 mtp=5 ded=8"), UTIL (0.25: vLLM's start check only; the KV cache is fixed),
# QUANT (fp8: weights quantized online at load, layer by layer; none: bf16),
# MAX_CONC (8: dedicated-decode is sized for it).
# Inputs (benchmarks/gpu/prepare_agentx.sh): .dev/gpu/moonlight/, .dev/gpu/agentx/.
set -u
DRY=0; OUTDIR=/root/agentx; BUDGET=560; SETUP=1; PHASE=start
script_option() {
  case $1 in --phase) PHASE=$2 ;; *) return 1 ;; esac
}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"
MODEL=$IN/moonlight
TRACES=$IN/agentx

REPEATS=${REPEATS:-3}
SINGLE_S=${SINGLE_S:-30}
LADDER=${LADDER:-2 4 8 3}
LADDER_S=${LADDER_S:-25}
LADDER_PROFILES=${LADDER_PROFILES:-std ded}
LADDER_SEEDS=${LADDER_SEEDS:-42}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-3}
UTIL=${UTIL:-0.25}
QUANT=${QUANT:-fp8}
MAX_CONC=${MAX_CONC:-8}
declare -A KV=([std]=8 [mtp]=5 [ded]=8)
for kv in ${KV_GIB:-}; do KV[${kv%%=*}]=${kv#*=}; done
NAMES=(std mtp ded)
declare -A PROFILE=([std]=standard [mtp]=mtp [ded]=dedicated-decode)
declare -A PORT=([std]=8100 [mtp]=8200 [ded]=8300)
if [ "$DRY" = 1 ]; then
  [ -f "$OUTDIR/ports" ] && . "$OUTDIR/ports"
else
  export PYTHONPATH=/tmp/site:$ROOT
fi
# Uniform expert routing: random router weights would skew expert load.
export VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random

# sets NAME: the --set flags of server NAME.
sets() {
  local s=(--set "kv-cache-memory-bytes=$(( ${KV[$1]} * 1024 * 1024 * 1024 ))"
           --set "gpu-memory-utilization=$UTIL" --set max-model-len=131072)
  [ "$1" = ded ] && s+=(--set "concurrency=$MAX_CONC")
  [ "$QUANT" = none ] || s+=(--set "quantization=$QUANT")
  echo "${s[@]}"
}

record_env() {
  { date -u; uname -a; nvidia-smi 2>&1 | head -20; $PY -V;
    $PY -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1;
    cat "$ROOT/.commit" 2>/dev/null; git -C "$ROOT" log -1 --format='agent-replay commit %H' 2>/dev/null
    echo "repeats $REPEATS single_s $SINGLE_S ladder $LADDER ladder_s $LADDER_S seeds $LADDER_SEEDS" \
      "ladder_profiles $LADDER_PROFILES warmup_requests $WARMUP_REQUESTS util $UTIL" \
      "kv_gib std=${KV[std]} mtp=${KV[mtp]} ded=${KV[ded]} max_conc $MAX_CONC quant $QUANT" \
      "routing $VLLM_MOE_ROUTING_SIMULATION_STRATEGY solo ${SOLO:-none}"; } >> "$LOG/env.txt" 2>&1
  cp "$MODEL/config.json" "$RES/model-config.json"
}

phase_start() {
  device_setup
  record_env
  local n
  for n in "${NAMES[@]}"; do
    # shellcheck disable=SC2046
    $AR engines vllm-cmd "${PROFILE[$n]}" --model "$MODEL" --gpus 1 --no-check --json \
      --vllm-version 0.26.0 $(sets "$n") > "$RES/$n.command.json" 2>&1
  done
  for n in "${NAMES[@]}"; do
    # shellcheck disable=SC2046
    start_server "$n" "${PORT[$n]}" "${PROFILE[$n]}" 0 1 $(sets "$n") \
      --env VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
    [ "$DRY" = 1 ] || sleep 20  # each reserves its memory before the next one checks
  done
  if [ "$DRY" = 1 ]; then
    for n in "${NAMES[@]}"; do echo "PORT[$n]=${PORT[$n]}"; done > "$OUTDIR/ports"
  fi
  wait_healthy $(( $(left) - 40 )) "${PORT[@]}" || return 1
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$LOG/gpu-memory.csv" 2>&1
  for n in "${NAMES[@]}"; do
    warm "${PORT[$n]}"
    scrape "${PORT[$n]}" "$RES/$n.metrics-start.txt"
  done
}

# replay NAME C SECONDS SEED DIR: one AgentX replay of the traces on server NAME.
replay() {
  local n=$1 c=$2 s=$3 seed=$4 dir=$5
  step "$(basename "$(dirname "$dir")")-$(basename "$dir")-$n" 60 $(( s + 200 )) \
    $AR run "$TRACES" --target "http://127.0.0.1:${PORT[$n]}" --api completions \
    --preset inferencex-agentx --concurrency "$c" --duration "$s" --min-duration 0 \
    --warmup-requests "$WARMUP_REQUESTS" --metric-coverage 0.5 --seed "$seed" --salt "$seed" \
    --gpus 1 --scrape-interval 1 -o "$dir" --force --no-progress
}

# order SEED NAMES...: the names in a seeded random order.
order() {
  local seed=$1; shift
  $PY -c 'import random, sys; n = sys.argv[2:]; random.Random(int(sys.argv[1])).shuffle(n); print(*n)' "$seed" "$@"
}

phase_single() {
  local r n
  for r in $(seq 1 "$REPEATS"); do
    for n in $(order "$r" "${NAMES[@]}"); do
      [ -f "$RES/runs/${PROFILE[$n]}/c1/r$r/run.json" ] && continue
      [ "$(left)" -lt $(( SINGLE_S + 45 )) ] && { echo "single: out of budget at r$r $n"; return 0; }
      replay "$n" 1 "$SINGLE_S" $(( 42 + r )) "$RES/runs/${PROFILE[$n]}/c1/r$r"
    done
  done
}

phase_ladder() {
  local c n seed r
  for seed in $LADDER_SEEDS; do
    r=$(( seed - 41 ))
    for c in $LADDER; do
      # shellcheck disable=SC2086
      for n in $(order "$c" $LADDER_PROFILES); do
        [ -f "$RES/runs/${PROFILE[$n]}/c$c/r$r/run.json" ] && continue
        [ "$(left)" -lt $(( LADDER_S + 30 + 5 * c )) ] && { echo "ladder: out of budget at c$c r$r $n"; return 0; }
        replay "$n" "$c" "$LADDER_S" "$seed" "$RES/runs/${PROFILE[$n]}/c$c/r$r"
      done
    done
  done
}

# phase_solo: every server of this folder stopped, then SOLO's alone on the GPU, its LADDER.
phase_solo() {
  local n
  for n in "${NAMES[@]}"; do stop_server "$n"; done
  device_setup
  record_env
  NAMES=($SOLO)
  for n in "${NAMES[@]}"; do
    # shellcheck disable=SC2046
    $AR engines vllm-cmd "${PROFILE[$n]}" --model "$MODEL" --gpus 1 --no-check --json \
      --vllm-version 0.26.0 $(sets "$n") > "$RES/$n.command.json" 2>&1
    # shellcheck disable=SC2046
    start_server "$n" "${PORT[$n]}" "${PROFILE[$n]}" 0 1 $(sets "$n") \
      --env VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
  done
  # shellcheck disable=SC2046
  wait_healthy $(( $(left) - 60 )) $(for n in "${NAMES[@]}"; do echo "${PORT[$n]}"; done) || return 1
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$LOG/gpu-memory.csv" 2>&1
  for n in "${NAMES[@]}"; do warm "${PORT[$n]}"; scrape "${PORT[$n]}" "$RES/$n.metrics-start.txt"; done
  LADDER_PROFILES="$SOLO" phase_ladder
}

phase_logs() {
  for n in "${NAMES[@]}"; do
    [ -f "$LOG/$n.server.log" ] || continue
    scrape "${PORT[$n]}" "$RES/$n.metrics-end.txt"
    grep -E "non-default args|with config|KV cache|kv_cache|Maximum concurrency|num_gpu_blocks|memory|backend|Performance mode|cudagraph|CUDA graph|speculative|Routing|routing|ERROR|Error" \
      "$LOG/$n.server.log" | cut -c1-4000 | tail -n 300 > "$LOG/$n.server.log.lines"
  done
}

# pack: the results so far in pieces of 15 MiB, into $OUT when it is set.
phase_pack() { pack_results agentx 'report.html'; }

case $PHASE in
  start) phase_start; phase_logs; phase_pack ;;
  single) phase_single; phase_logs; phase_pack ;;
  ladder) phase_ladder; phase_logs; phase_pack ;;
  solo) phase_solo; phase_logs; phase_pack ;;
  dry) phase_start && { phase_single; phase_ladder; }; phase_logs
       for n in "${NAMES[@]}"; do stop_server "$n"; done; phase_pack ;;
  restart) for n in $RESTART; do stop_server "$n"; sleep 3
             # shellcheck disable=SC2046
             start_server "$n" "${PORT[$n]}" "${PROFILE[$n]}" 0 1 $(sets "$n") \
               --env VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
             $AR engines vllm-cmd "${PROFILE[$n]}" --model "$MODEL" --gpus 1 --no-check --json \
               --vllm-version 0.26.0 $(sets "$n") > "$RES/$n.command.json" 2>&1; done
           # shellcheck disable=SC2086
           wait_healthy $(( $(left) - 60 )) $(for n in $RESTART; do echo "${PORT[$n]}"; done) &&
           for n in $RESTART; do warm "${PORT[$n]}"; scrape "${PORT[$n]}" "$RES/$n.metrics-start.txt"; done
           phase_single; phase_logs; phase_pack ;;
  stop) for n in "${NAMES[@]}"; do stop_server "$n"; done ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
printf 'total\t0\t%s\tphase %s\n' "$(( $(date +%s) - T0 ))" "$PHASE" >> "$STEPS"
