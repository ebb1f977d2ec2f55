#!/usr/bin/env bash
# Frontiers on the GPU machine with `agent-replay sweep`: the tiny DeepSeek-V3-shaped model
# (dummy weights) under vLLM's `standard` and `dedicated-decode` (MTP nextn=3, synthetic
# acceptance 2.8) profiles, one GPU each, both up at once and visited in the sweep's seeded,
# interleaved order (3 repeats, a warm-up before every run, GPU telemetry beside each run);
# ours and `vllm bench serve` at the same moment against one server, both sides' per-request
# data kept; then Wide-EP on both GPUs at twice the sessions (equal load per GPU).
#
# The phases are separate calls of the device tool, back to back while the machine is warm
# (the servers outlive a call; the sweep resumes where a call's time ran out):
#   bash benchmarks/gpu/run_sweep.sh --phase start            # setup, both servers, warm-up
#   bash benchmarks/gpu/run_sweep.sh --phase pair             # the standard-vs-MTP sweep
#   bash benchmarks/gpu/run_sweep.sh --phase ab               # ours + bench at one moment
#   bash benchmarks/gpu/run_sweep.sh --phase wide             # Wide-EP sweep (restarts servers)
#   WIDE_GPUS=4 EPLB=true bash benchmarks/gpu/run_sweep.sh --phase wide   # on 4 (or 8) GPUs
#   bash benchmarks/gpu/run_sweep.sh --phase pack; cp /root/sw.tar.gz "$OUT/"
# Locally, with the simulated engine (default and mtp profiles) instead of vLLM:
#   bash benchmarks/gpu/run_sweep.sh --dry-run --phase all --out /tmp/sw-dry
# Inputs: .dev/gpu/ from benchmarks/gpu/prepare_inputs.sh.
set -u
DRY=0; OUTDIR=/root/sw; BUDGET=570; SETUP=1; PHASE=all; REPEATS=3
script_option() {
  case $1 in --phase) PHASE=$2 ;; --repeats) REPEATS=$2 ;; *) return 1 ;; esac
}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"

if [ "$DRY" = 1 ]; then
  P_STD=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
  P_DED=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
  P_WEP=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
else
  P_STD=8100; P_DED=8200; P_WEP=8300
  export PYTHONPATH=/tmp/site:$ROOT
fi
KV=$((24 * 1024 * 1024 * 1024))

# experiment NAME POINTS TARGET_LINES...: an experiment file over the mini-swe-agent sessions.
experiment() {
  local name=$1 points=$2; shift 2
  local f="$OUTDIR/$name.toml"
  {
    echo "trace = \"$IN/agents-multi\""
    echo "output = \"$OUTDIR/$name\""
    echo "repeats = $REPEATS"
    echo "seed = 7"
    echo 'slo = "p90_tps>=150,ttft_p99<=1s"'
    echo; echo '[load]'; echo 'axis = "concurrent_sessions"'; echo "points = $points"
    echo; echo '[run]'; echo 'speedup = 4'; echo 'duration_s = 15'; echo 'api = "completions"'
    echo 'scrape_interval_s = 1'
    echo; echo '[warmup]'; echo 'burst_s = 2'; echo 'max_bursts = 4'; echo 'tolerance = 0.10'
    echo; echo '[prices]'; echo 'input_hit = 0.07'; echo 'input_miss = 0.27'; echo 'output = 1.10'
    local t
    for t in "$@"; do echo; echo '[[targets]]'; echo -e "$t"; done
  } > "$f"
  echo "$f"
}

phase_start() {
  device_setup
  { date -u; uname -a; nvidia-smi 2>&1 | head -20; $PY -V;
    $PY -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1;
    git -C "$ROOT" log -1 --format='agent-replay commit %H' 2>/dev/null; } > "$LOG/env.txt" 2>&1
  local gd=0
  [ "$DRY" = 1 ] || [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] && gd=1
  start_server std $P_STD standard 0 1 --set kv-cache-memory-bytes=$KV --set gpu-memory-utilization=0.3
  start_server ded $P_DED dedicated-decode $gd 1 --set kv-cache-memory-bytes=$KV \
    --set gpu-memory-utilization=0.3 --set synthetic_acceptance_length=2.8
  wait_healthy $(( $(left) - 30 )) $P_STD $P_DED
  warm $P_STD; warm $P_DED
}

phase_pair() {
  local f
  f=$(experiment pair "[2, 8, 32]" \
    "name = \"standard\"\nurl = \"http://127.0.0.1:$P_STD\"\ngpus = 1\nusd_per_gpu_hour = 3.5" \
    "name = \"dedicated-decode\"\nurl = \"http://127.0.0.1:$P_DED\"\ngpus = 1\nusd_per_gpu_hour = 3.5")
  step pair-sweep 40 $(( $(left) - 20 )) $AR sweep "$f"
  tail -n 20 "$LOG/pair-sweep.log"
}

phase_ab() {
  local c=8 P=$P_DED
  scrape "$P" "$RES/ab-c$c.metrics-before.txt"
  if [ -n "$BENCH_PY" ]; then
    $BENCH_PY -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "http://127.0.0.1:$P" \
      --model "$(served_model "$P")" --tokenizer "$MODEL" --dataset-name random \
      --random-input-len 2048 --random-output-len 256 --num-prompts 96 --max-concurrency $c \
      --ignore-eos --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
      --seed 0 --ready-check-timeout-sec 0 --save-result --save-detailed --result-dir "$RES" \
      --result-filename "ab-c$c-bench.json" > "$LOG/ab-c$c-bench.log" 2>&1 &
    BPID=$!
    sleep 2
  fi
  step "ab-c$c-ours" 30 90 $AR run "$IN/fixed-c16.parquet" --target "http://127.0.0.1:$P" \
    --api completions --timing max-rate --concurrency $c --scrape-interval 0.5 \
    -o "$RES/ab-c$c-ours" --force --no-progress
  [ -n "$BENCH_PY" ] && wait "$BPID"
  scrape "$P" "$RES/ab-c$c.metrics-after.txt"
}

# Wide-EP over WIDE_GPUS GPUs (default 2), EPLB on or off (EPLB=true|false, default false),
# at WIDE_POINTS concurrent sessions (default: 8 and 32 per GPU, the standard server's load
# per GPU above); its sweep folder is wide (2 GPUs, EPLB off) or wide-gN-eplbB.
phase_wide() {
  local g=${WIDE_GPUS:-2} eplb=${EPLB:-false} name=wide
  [ "$g" = 2 ] && [ "$eplb" = false ] || name=wide-g$g-eplb$eplb
  stop_server std; stop_server ded; stop_server wep
  local sets=(--set eplb=$eplb --set max-num-seqs=256)
  [ "$eplb" = true ] && sets+=(--set eplb_window_size=1000 --set eplb_step_interval=3000)
  start_server wep $P_WEP wide-ep "$(seq -s, 0 $((g - 1)))" "$g" "${sets[@]}"
  wait_healthy $(( $(left) - 200 )) $P_WEP || return 1
  warm $P_WEP
  local f
  f=$(experiment "$name" "${WIDE_POINTS:-[$((8 * g)), $((32 * g))]}" \
    "name = \"wide-ep-$g-eplb-$eplb\"\nurl = \"http://127.0.0.1:$P_WEP\"\ngpus = $g\nusd_per_gpu_hour = 3.5")
  step "$name-sweep" 40 $(( $(left) - 20 )) $AR sweep "$f"
  tail -n 20 "$LOG/$name-sweep.log"
}

phase_pack() {
  local s
  for s in "$OUTDIR"/*.toml; do
    s=$(basename "$s" .toml)
    [ -d "$OUTDIR/$s" ] && $AR sweep "$OUTDIR/$s.toml" --report-only > "$LOG/$s-frontier.log" 2>&1
  done
  for s in "$LOG"/*.server.log; do
    [ -f "$s" ] && grep -E "all2all|All2All|EPLB|eplb|JIT|Triton|compil|backend|ERROR" "$s" \
      | tail -n 400 > "$s.lines"
    [ -f "$s" ] && tail -c 100000 "$s" > "$s.tail" && mv "$s.tail" "$s"
  done
  tar czf "$OUTDIR.tar.gz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
  ls -la "$OUTDIR.tar.gz"
}

case $PHASE in
  start) phase_start ;;
  pair) phase_pair ;;
  ab) phase_ab ;;
  wide) phase_wide ;;
  pack) phase_pack ;;
  all) phase_start; phase_pair; phase_ab; phase_wide; stop_server wep; phase_pack ;;
  *) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
