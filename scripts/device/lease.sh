#!/bin/bash
# One device call's routine (docs/gpu.md): the environment's facts, then
# gpu.sh's stages one at a time, each under its own time limit so that one
# stage that hangs costs only its share, and after each stage everything it
# wrote packed into OUT/results.tgz (a call brings back at most 8 files).
# Usage: scripts/device/lease.sh OUT SECONDS_PER_STAGE STAGE...
set -u
OUT=${1:?usage: lease.sh OUT SECONDS_PER_STAGE STAGE...}
LIMIT=${2:?seconds per stage}
shift 2
W=/tmp/gpu_results
mkdir -p "$W" "$OUT"
timeout 25 bash scripts/device/env.sh "$W/env.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.csv"
for stage in "$@"; do
  start=$(date +%s)
  timeout -k 10 "$LIMIT" bash scripts/device/gpu.sh "$W" "$stage"
  rc=$?
  echo "== $stage: rc $rc in $(( $(date +%s) - start )) s"
  echo "$stage $rc $(( $(date +%s) - start ))" >>"$W/stages.txt"
  tar -czf "$OUT/results.tgz" -C "$W" .
done
