#!/usr/bin/env bash
# Call 1 (twelfth session): the launch thread of replayed calls. Every GPU
# test on 4 GPUs (with the new replay-order section of the session test);
# the Python loopback cases that replay and that kill a rank mid-replay;
# host cost per call with the launch thread on and off (P = 4 ag-gemm and
# gemm-rs, P = 2 ag-gemm); the dead-rank cases (a rank dies while the
# others replay, now by the launch thread).
set -u
out=$1
source bench/on-device.sh
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
for spec in 4:ag-gemm:1 4:ag-gemm:0 4:gemm-rs:1 4:gemm-rs:0 2:ag-gemm:1 2:ag-gemm:0; do
  IFS=: read -r p op lt <<<"$spec"
  echo "## P=$p $op shard-copy-ring 512,512,512 FICCO_LAUNCH_THREAD=$lt" >> "$out/host.txt"
  FICCO_LAUNCH_THREAD=$lt timeout 60 torchrun --nproc-per-node $p bench/host_breakdown.py \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 96 --reps 5 --sync-every 8 2>&1 \
    | grep -E "^[a-z#0-9 ]|^  [a-z]" | grep -v "^ficco trace" >> "$out/host.txt"
done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh "$out/tests" > "$out/gpu-tests.txt" 2>&1
cp "$out/tests/summary.txt" "$out/gpu-tests-summary.txt" 2>/dev/null
tar -cJf "$out/gpu-tests-logs.tar.xz" -C "$out" tests && rm -rf "$out/tests"
for part in graphs repeat dead; do
  timeout 150 python python/tests/test_gpu_loopback.py $part > "$out/py-$part.txt" 2>&1; echo "exit $?" >> "$out/py-$part.txt"
done
