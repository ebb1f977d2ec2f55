#!/usr/bin/env bash
# Ours and `vllm bench serve` at the same time against one server, on the same prompts: the
# server's speed is then the same for both clients, so a TPOT difference between them can
# only be a measurement difference. (Run one after the other, the two clients' TPOTs moved
# apart by up to 24% on the H200 because the server itself ran faster or slower from one run
# to the next, as its own TPOT histogram showed for each run.)
#
# One dedicated-decode server (MTP 3, synthetic acceptance 2.8, prefix caching off so that
# neither client's prompts are cached for the other), then per concurrency c (8, 1): bench
# with --max-concurrency c and seed 0 starts; as soon as the server has a request running,
# our replay of bench's own prompts (recorded earlier through `agent-replay record --content
# full`: .dev/gpu/ded-rec-c16.trace, .dev/gpu/ded-rec-c1.trace) starts at concurrency c.
# /metrics is saved around each pair.
#   bash benchmarks/gpu/run_ab.sh --out /tmp/ab/ab; cp /tmp/ab/ab.tar.gz "$OUT/"
#                                          (GPU machine, after the staging; the tarball, not
#                                          the folder: the device tool brings back only a
#                                          limited number of files)
#   bash benchmarks/gpu/run_ab.sh --dry-run --out /tmp/ab  (simulated engine here)
set -u
DRY=0; OUTDIR=${OUT:-/tmp}/ab; BUDGET=300; SETUP=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benchmarks/gpu/lib.sh
. "$ROOT/benchmarks/gpu/lib.sh" "$@"
device_setup
if [ "$DRY" = 1 ]; then
  P=$($PY -c 'from agent_replay.engines.vllm.launcher import free_port; print(free_port())')
else
  P=8200
fi
start_server ded "$P" dedicated-decode 0 1 --set kv-cache-memory-bytes=$((24 * 1024 * 1024 * 1024)) \
  --set gpu-memory-utilization=0.3 --set synthetic_acceptance_length=2.8 \
  --set enable-prefix-caching=false
wait_healthy $(( $(left) - 60 )) "$P"
warm "$P" >> "$LOG/warm.log" 2>&1
warm_wave "$P" >> "$LOG/warm.log" 2>&1
running() {  # requests running on the server now (sum over engines)
  curl -s -m 2 "http://127.0.0.1:$P/metrics" | awk '/^vllm:num_requests_running/ {s += $NF} END {print s + 0}'
}
for c in 8 1; do
  trace=$IN/ded-rec-c$([ "$c" = 1 ] && echo 1 || echo 16).trace
  [ "$(left)" -lt 45 ] && { echo "ab-c$c skipped: $(left) s left" >> "$LOG/steps.tsv"; continue; }
  scrape "$P" "$RES/ab-c$c.metrics-before.txt"
  $BENCH_PY -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "http://127.0.0.1:$P" \
    --model "$(served_model "$P")" --tokenizer "$MODEL" --dataset-name random \
    --random-input-len 2048 --random-output-len 256 \
    --num-prompts "$([ "$c" = 1 ] && echo 16 || echo 96)" --max-concurrency "$c" --ignore-eos \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 \
    --ready-check-timeout-sec 0 --save-result --save-detailed --result-dir "$RES" \
    --result-filename "ab-c$c-bench.json" > "$LOG/ab-c$c-bench.log" 2>&1 &
  BPID=$!
  t_end=$(( $(date +%s) + 60 ))
  while [ "$(running)" = 0 ] && [ "$(date +%s)" -lt "$t_end" ] && kill -0 $BPID 2>/dev/null; do
    sleep 0.05
  done
  echo "ab-c$c: bench running at $(( $(date +%s) - T0 )) s" >> "$LOG/steps.tsv"
  step "ab-c$c-ours" 30 60 $AR run "$trace" --target "http://127.0.0.1:$P" --api completions \
    --timing max-rate --concurrency "$c" --scrape-interval 0.5 -o "$RES/ab-c$c-ours" --force \
    --no-progress
  wait $BPID
  printf 'ab-c%s-bench\t%s\n' "$c" "$?" >> "$LOG/steps.tsv"
  scrape "$P" "$RES/ab-c$c.metrics-after.txt"
done
stop_server ded
$AR report "$RES/ab-c8-ours" --format json > "$RES/ab-c8-ours.report.json" 2>/dev/null
$AR report "$RES/ab-c1-ours" --format json > "$RES/ab-c1-ours.report.json" 2>/dev/null
printf 'total\t0\t%s\n' "$(( $(date +%s) - T0 ))" >> "$LOG/steps.tsv"
tail -c 200000 "$LOG/ded.server.log" > "$LOG/ded.server.log.tail" && mv "$LOG/ded.server.log.tail" "$LOG/ded.server.log"
tar czf "$OUTDIR.tar.gz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
echo "done in $(( $(date +%s) - T0 )) s: $OUTDIR.tar.gz"
