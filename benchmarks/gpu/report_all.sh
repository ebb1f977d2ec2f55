#!/usr/bin/env bash
# Reports of every results folder under RES (NAME.report.json/.md), std-vs-ded comparisons
# and the three-way table. Skips what exists unless --force; stops starting new work after
# DEADLINE (epoch seconds, optional), so the GPU script can call it inside its budget.
# Usage: bash benchmarks/gpu/report_all.sh RES GPUS [DEADLINE] [--force]
set -u
RES=$1; GPUS=${2:-1}; DEADLINE=${3:-0}; FORCE=${4:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHONPATH:-}" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
AR="$PY -m agent_replay"
cd "$ROOT" || exit 2
late() { [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; }
for d in "$RES"/*/; do
  d=${d%/}; [ -f "$d/run.json" ] || continue
  late && break
  if [ -n "$FORCE" ] || [ ! -s "$d.report.json" ]; then
    $AR report "$d" --format json --gpus "$GPUS" > "$d.report.json" 2> "$d.report.err"
    $AR report "$d" --format md --gpus "$GPUS" > "$d.report.md" 2>> "$d.report.err"
  fi
done
for w in agent mooncake fixed-c1 fixed-c16; do
  late && break
  if [ -d "$RES/std-$w" ] && [ -d "$RES/ded-$w" ]; then
    $AR compare "$RES/std-$w" "$RES/ded-$w" --format md > "$RES/compare-$w.md" 2>&1
  fi
done
$PY benchmarks/gpu/three_way.py "$RES" > "$RES/three-way.md"
