#!/usr/bin/env bash
# Call 5 (twelfth session): the compact shared arena of operator calls
# (operands bound in place take no room). Every GPU test on 4 GPUs; the
# training step at P = 2, 8192 tokens, graphs (memory outside PyTorch's
# allocator: 1.81 GiB for ficco in call 4); the Python loopback ops with
# operands in place and copied.
set -u
out=$1
source bench/on-device.sh
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
RUN_TIMEOUT=150 bash bench/train_runs.sh "$out/p2" 2 8192:graphs:pytorch,ficco > /dev/null
mv "$out/p2/train.txt" "$out/train.txt"
TEST_TIMEOUT=150 bash bench/gpu-tests.sh "$out/tests" > "$out/gpu-tests.txt" 2>&1
cp "$out/tests/summary.txt" "$out/gpu-tests-summary.txt" 2>/dev/null
tar -cJf "$out/gpu-tests-logs.tar.xz" -C "$out" tests && rm -rf "$out/tests"
timeout 60 python python/tests/test_gpu_loopback.py ops > "$out/py-ops.txt" 2>&1; echo "exit $?" >> "$out/py-ops.txt"
