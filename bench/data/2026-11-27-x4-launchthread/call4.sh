#!/usr/bin/env bash
# Call 4 (twelfth session): binaries of e2d47f4, Python of this commit.
# Training at P = 2, 8192 tokens, eager and graphs, with the new default
# (`all_gather_matmul` keeps its gathered operand on 2 ranks too) beside
# gathering again.
set -u
out=$1
source bench/on-device.sh
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
RUN_TIMEOUT=200 bash bench/train_runs.sh "$out/p2" 2 8192:eager:pytorch,ficco,ficco-regather \
  8192:graphs:pytorch,ficco,ficco-regather > /dev/null
mv "$out/p2/train.txt" "$out/train.txt"
