#!/usr/bin/env bash
# MTP alone, and the full dedicated-decode recipe, against standard vLLM on ONE GPU: the tiny
# DeepSeek-V3-shaped model (dummy weights) under the `standard`, `mtp` (standard + MTP nextn=3,
# synthetic acceptance 2.8, nothing else) and `dedicated-decode` (MTP + interactivity mode +
# max-num-seqs 16 + prefill every 4th step) profiles. The three servers share GPU 0 (a fixed
# KV cache each, KV_GIB, and gpu-memory-utilization 0.25 each) and stay up together, so that
# `agent-replay sweep` interleaves them: every repeat visits the targets in a seeded random
# order, each visit runs every load point in a seeded random order, one run at a time, each
# after a warm-up at its own load. Then ours and `vllm bench serve` at the same time on the
# `mtp` server: bench starts first; ours starts once the server has a request running; both
# sides' per-request timestamps are kept (both on CLOCK_MONOTONIC) for the overlap.
#
# On the GPU machine, after the staging (docs/gpu.md), as calls back to back:
#   bash benchmarks/gpu/run_mtp.sh --phase all --budget 570     # setup, servers, ab, sweep
#   bash benchmarks/gpu/run_mtp.sh --phase sweep --budget 570   # resumes the sweep
#   bash benchmarks/gpu/run_mtp.sh --phase last --budget 570    # resumes, then the reports
# Each call ends by packing /root/mtp into $OUT (mtp.tar.gz.NN pieces of 15 MiB).
# Here, with the simulated engine in place of vLLM (mtp and dedicated-decode both get the
# simulator's mtp profile):
#   AR_PYTHON=/work/venv/bin/python bash benchmarks/gpu/run_mtp.sh --dry-run --phase all \
#       --out /tmp/mtp-dry --budget 300
# Knobs (environment): POINTS ("[1, 2, 8, 32]"), REPEATS (5), DURATION_S (13: the whole run),
# WARMUP_S (3: its first seconds, at the run's own load, left out of its statistics), BURSTS
# (0: no separate warm-up replays before a run; N: the sweep's adaptive warm-up, up to N bursts
# of BURST_S = 2 s until median TPOT is steady), KV_GIB (16).
# Inputs: .dev/gpu/ (tiny-deepseek/, agents-multi/, fixed-c16.parquet; see
# benchmarks/gpu/prepare_inputs.sh).
set -u
DRY=0; OUTDIR=/root/mtp; BUDGET=570; SETUP=1; PHASE=all
script_option() {
  case $1 in --phase) PHASE=$2 ;; *) return 1 ;; esac
}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"

POINTS=${POINTS:-[1, 2, 8, 32]}
REPEATS=${REPEATS:-5}
DURATION_S=${DURATION_S:-13}
WARMUP_S=${WARMUP_S:-3}
BURST_S=${BURST_S:-2}
BURSTS=${BURSTS:-0}
KV_GIB=${KV_GIB:-16}
KV=$((KV_GIB * 1024 * 1024 * 1024))
NAMES=(std mtp ded)
declare -A PROFILE=([std]=standard [mtp]=mtp [ded]=dedicated-decode)
declare -A PORT
if [ "$DRY" = 1 ]; then
  for n in "${NAMES[@]}"; do
    PORT[$n]=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
  done
  [ -f "$OUTDIR/ports" ] && . "$OUTDIR/ports"
else
  PORT=([std]=8100 [mtp]=8200 [ded]=8300)
  export PYTHONPATH=/tmp/site:$ROOT
fi

# sets NAME: the --set flags of server NAME (the knobs its profile has, then the shared ones).
sets() {
  local s=(--set "kv-cache-memory-bytes=$KV" --set gpu-memory-utilization=0.25)
  [ "$1" = std ] || s=(--set synthetic_acceptance_length=2.8 "${s[@]}")
  echo "${s[@]}"
}

now_line() {  # one line: wall clock and CLOCK_MONOTONIC (the clock of both clients' stamps)
  $PY -c 'import time; print(f"{time.time():.6f} wall {time.monotonic():.6f} monotonic {time.perf_counter():.6f} perf_counter")'
}

phase_start() {
  device_setup
  { date -u; uname -a; nvidia-smi 2>&1 | head -20; $PY -V;
    $PY -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1;
    git -C "$ROOT" log -1 --format='agent-replay commit %H' 2>/dev/null;
    cat "$ROOT/.commit" 2>/dev/null; echo "clock: $(now_line)";
    echo "points $POINTS repeats $REPEATS duration_s $DURATION_S warmup_s $WARMUP_S" \
      "bursts $BURSTS burst_s $BURST_S kv_gib $KV_GIB"; } > "$LOG/env.txt" 2>&1
  local n
  for n in "${NAMES[@]}"; do
    # shellcheck disable=SC2046
    $AR engines vllm-cmd "${PROFILE[$n]}" --model "$MODEL" --gpus 1 --no-check --json \
      --vllm-version 0.26.0 $(sets "$n") > "$RES/$n.command.json" 2>&1
    # shellcheck disable=SC2046
    $AR engines vllm-cmd "${PROFILE[$n]}" --model "$MODEL" --gpus 1 --json \
      --vllm-version 0.26.0 $(sets "$n") --diff standard > "$RES/$n.diff.json" 2>&1
  done
  for n in "${NAMES[@]}"; do
    # shellcheck disable=SC2046
    start_server "$n" "${PORT[$n]}" "${PROFILE[$n]}" 0 1 $(sets "$n")
  done
  [ "$DRY" = 1 ] && for n in "${NAMES[@]}"; do echo "PORT[$n]=${PORT[$n]}"; done > "$OUTDIR/ports"
  wait_healthy $(( $(left) - 30 )) "${PORT[@]}" || return 1
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$LOG/gpu-memory.csv" 2>&1
  for n in "${NAMES[@]}"; do
    warm "${PORT[$n]}"; warm_wave "${PORT[$n]}" | tail -n 1
    scrape "${PORT[$n]}" "$RES/$n.metrics-start.txt"
  done
}

running() {  # requests running on the server at port $1 now
  curl -s -m 2 "http://127.0.0.1:$1/metrics" | awk '/^vllm:num_requests_running/ {s += $NF} END {print s + 0}'
}

phase_ab() {
  local c=8 P=${PORT[mtp]}
  [ -n "$BENCH_PY" ] || { echo "ab: no vllm bench here"; return 0; }
  [ "$(left)" -lt 90 ] && { echo "ab skipped: $(left) s left"; return 0; }
  scrape "$P" "$RES/ab-c$c.metrics-before.txt"
  echo "bench start: $(now_line)" > "$RES/ab-c$c.clock.txt"
  $BENCH_PY -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "http://127.0.0.1:$P" \
    --model "$(served_model "$P")" --tokenizer "$MODEL" --dataset-name random \
    --random-input-len 2048 --random-output-len 256 --num-prompts 96 --max-concurrency $c \
    --ignore-eos --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
    --seed 0 --ready-check-timeout-sec 0 --save-result --save-detailed --result-dir "$RES" \
    --result-filename "ab-c$c-bench.json" > "$LOG/ab-c$c-bench.log" 2>&1 &
  local bpid=$! t_end=$(( $(date +%s) + 60 ))
  while [ "$(running "$P")" = 0 ] && [ "$(date +%s)" -lt "$t_end" ] && kill -0 $bpid 2>/dev/null; do
    sleep 0.05
  done
  echo "bench running: $(now_line)" >> "$RES/ab-c$c.clock.txt"
  step "ab-c$c-ours" 30 60 $AR run "$IN/fixed-c16.parquet" --target "http://127.0.0.1:$P" \
    --api completions --timing max-rate --concurrency $c --scrape-interval 0.5 \
    -o "$RES/ab-c$c-ours" --force --no-progress
  echo "ours ended: $(now_line)" >> "$RES/ab-c$c.clock.txt"
  wait $bpid
  echo "bench ended rc $?: $(now_line)" >> "$RES/ab-c$c.clock.txt"
  scrape "$P" "$RES/ab-c$c.metrics-after.txt"
}

experiment_file() {
  local f="$OUTDIR/mtp.toml" n
  {
    echo "trace = \"$IN/agents-multi\""
    echo "output = \"$OUTDIR/mtp\""
    echo "repeats = $REPEATS"
    echo "seed = 11"
    echo 'slo = "p90_tps>=150,ttft_p99<=1s"'
    echo; echo '[load]'; echo 'axis = "concurrent_sessions"'; echo "points = $POINTS"
    echo; echo '[run]'; echo 'speedup = 4'; echo "duration_s = $DURATION_S"
    echo "warmup_s = $WARMUP_S"; echo 'api = "completions"'; echo 'scrape_interval_s = 1'
    echo; echo '[warmup]'
    if [ "$BURSTS" = 0 ]; then echo 'enabled = false'
    else echo "burst_s = $BURST_S"; echo 'min_bursts = 2'; echo "max_bursts = $BURSTS"
         echo 'tolerance = 0.10'; fi
    echo; echo '[prices]'; echo 'input_hit = 0.07'; echo 'input_miss = 0.27'; echo 'output = 1.10'
    for n in "${NAMES[@]}"; do
      echo; echo '[[targets]]'; echo "name = \"${PROFILE[$n]}\""
      echo "url = \"http://127.0.0.1:${PORT[$n]}\""; echo 'gpus = 1'; echo 'usd_per_gpu_hour = 3.5'
    done
  } > "$f"
  echo "$f"
}

# sweep [RESERVE_S]: the sweep (resuming one cut short) until RESERVE_S (25) before the budget.
phase_sweep() {
  local f max; f=$(experiment_file)
  max=$(( $(left) - ${1:-25} - 20 ))
  [ "$max" -lt 30 ] && { echo "sweep skipped: $(left) s left"; return 0; }
  KILL_GRACE=20 step "sweep-$(date +%s)" 40 "$max" $AR sweep "$f"
  ls -t "$LOG"/sweep-*.log | head -1 | xargs tail -n 3
}

phase_report() {
  [ -f "$OUTDIR/mtp.toml" ] && step frontier 30 120 $AR sweep "$OUTDIR/mtp.toml" --report-only
  for n in "${NAMES[@]}"; do
    [ -f "$LOG/$n.server.log" ] || continue
    grep -E "KV cache|kv_cache|Maximum concurrency|num_gpu_blocks|memory|backend|Triton|compil|ERROR" \
      "$LOG/$n.server.log" | tail -n 300 > "$LOG/$n.server.log.lines"
    tail -c 100000 "$LOG/$n.server.log" > "$LOG/$n.server.tail" && mv "$LOG/$n.server.tail" "$LOG/$n.server.log"
  done
}

# pack: the results so far (warm-up bursts' requests left out: warmup.json keeps each burst's
# median TPOT) in pieces of 15 MiB, into $OUT when it is set.
phase_pack() { pack_results mtp 'burst-*'; }

case $PHASE in
  start) phase_start ;;
  ab) phase_ab ;;
  sweep) phase_sweep; phase_pack ;;
  last) phase_sweep 90; phase_report; phase_pack ;;
  all) phase_start && { phase_ab; phase_sweep; }; phase_pack ;;
  dry) phase_start && { phase_ab; phase_sweep 150; phase_sweep 90; phase_report; }
       for n in "${NAMES[@]}"; do stop_server "$n"; done; phase_pack ;;
  stop) for n in "${NAMES[@]}"; do stop_server "$n"; done ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
printf 'total\t0\t%s\tphase %s\n' "$(( $(date +%s) - T0 ))" "$PHASE" >> "$STEPS"
