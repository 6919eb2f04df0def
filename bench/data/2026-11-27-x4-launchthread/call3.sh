#!/usr/bin/env bash
# Call 3 (twelfth session): binaries of e2d47f4 (the launch thread
# reverted), Python of this commit (`all_gather_matmul` keeps its gathered
# operand on 2 ranks too). The session GPU test's replay-order section with
# replays on the caller's stream; the gradients through ficco's backward
# (2 and 4 ranks on one GPU); training at P = 2, 2048 tokens, graphs and
# compile; the block at 8192 tokens under CUDA graphs beside async-TP.
set -u
out=$1
source bench/on-device.sh
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
timeout 120 .bin/test-ficco_cuda --include-ignored --exact \
  session::tests::operators_on_caller_memory_match_the_reference --nocapture > "$out/session-test.txt" 2>&1
echo "exit $?" >> "$out/session-test.txt"
timeout 150 python python/tests/test_gpu_loopback.py grad > "$out/py-grad.txt" 2>&1; echo "exit $?" >> "$out/py-grad.txt"
RUN_TIMEOUT=150 bash bench/train_runs.sh "$out/p2" 2 2048:graphs:pytorch,ficco 2048:compile:pytorch,ficco > /dev/null
mv "$out/p2/train.txt" "$out/train.txt"
timeout 150 torchrun --nproc-per-node 4 examples/llama_tp_block.py --tokens 8192 --mode graphs 2>&1 \
  | grep -E "^#|^  " > "$out/block8192-graphs.txt"
