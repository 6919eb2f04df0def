#!/usr/bin/env bash
# Call 2 (twelfth session): the launch thread reverted (binaries of
# 033c6e0's Rust; the Python of this commit). Training at P = 2, 2048
# tokens, under graphs and compile, gathering `a` again (`ficco`, the
# default on 2 ranks) against keeping it (`ficco-keep`); training at P = 4,
# 2048 eager, the host watch on and off; the forward-only block at 2048
# tokens eager, twice (the watch now leaves a group without gradient calls
# alone).
set -u
out=$1
source bench/on-device.sh
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
RUN_TIMEOUT=150 bash bench/train_runs.sh "$out/p2" 2 2048:graphs:pytorch,ficco,ficco-keep \
  2048:compile:pytorch,ficco,ficco-keep > /dev/null
RUN_TIMEOUT=120 bash bench/train_runs.sh "$out/p4" 4 2048:eager:pytorch,ficco-watch,ficco-nowatch > /dev/null
cat "$out/p2/train.txt" "$out/p4/train.txt" > "$out/train.txt"
for run in 1 2; do
  echo "## run $run" >> "$out/block2048.txt"
  timeout 100 torchrun --nproc-per-node 4 examples/llama_tp_block.py --tokens 2048 \
    --mode eager 2>&1 | grep -E "^#|^  " >> "$out/block2048.txt"
done
