#!/usr/bin/env bash
# Issue 26: where a directly issued gemm-rs -acc run stalls at P=4 (FICCO_TRACE),
# then every GPU test on the 4 GPUs. Usage: bash bench/hang3.sh OUT
set -u
OUT=$1; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
cat .bin/COMMIT > "$OUT/commit"
FICCO_TRACE=1 FICCO_WATCHDOG_MS=2000 timeout 50 .bin/ficco soak --gpus 4 --models llama3-8b --tokens 2048 --graphs off \
  --iters 10 --only shard-copy-ring-acc,shard-copy-all-acc --time-limit 25 --trace --out "$OUT/acc.jsonl" > "$OUT/acc.txt" 2> "$OUT/acc.err"
echo "acc rc=$? runs=$(wc -l < "$OUT/acc.jsonl") hangs=$(grep -c HANG "$OUT/acc.jsonl")"; tail -4 "$OUT/acc.err"
TEST_TIMEOUT=100 timeout 470 bash bench/gpu-tests.sh "$OUT/gpu-tests" > "$OUT/gpu-tests.txt" 2>&1
echo "gpu-tests rc=$?"; tail -16 "$OUT/gpu-tests.txt"
