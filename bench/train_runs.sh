#!/usr/bin/env bash
# Training runs of examples/train_tp.py on P GPUs, one per spec, each
# TOKENS:MODE:WAYS (WAYS comma-separated), 2 blocks unless LAYERS is set:
#   bash bench/train_runs.sh OUT P 2048:graphs:pytorch,ficco,no-comm 8192:eager:pytorch,ficco
# Each run's whole output and JSON go to OUT/logs/; OUT/train.txt gathers
# the tables (what a device call brings back is capped in files).
set -uo pipefail
out=$1; p=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/logs"
for spec in "$@"; do
  IFS=: read -r tokens mode ways <<<"$spec"
  tag="t$tokens-$mode-p$p"
  start=$(date +%s)
  timeout "${RUN_TIMEOUT:-300}" torchrun --nproc-per-node "$p" "$here/examples/train_tp.py" \
    --layers "${LAYERS:-2}" --tokens "$tokens" --mode "$mode" --ways "$ways" \
    --steps "${STEPS:-14}" --warmup "${WARMUP:-4}" --json "$out/logs/$tag.json" \
    >"$out/logs/$tag.txt" 2>&1
  rc=$?
  {
    echo "## $tag ($ways): exit $rc, $(( $(date +%s) - start )) s"
    grep -E '^(#|  |[a-z]+ [a-z-]+: )' "$out/logs/$tag.txt" | grep -v '^# profile'
  } | tee -a "$out/train.txt"
done
tar -cJf "$out/train-logs.tar.xz" -C "$out" logs && rm -rf "$out/logs"
