#!/usr/bin/env bash
# Issue 26: the two GPU tests that did not pass on 4 H100s (c. 0581124).
set -u
OUT=$1; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
cat .bin/COMMIT > "$OUT/commit"
timeout 60 .bin/test-gpu_loopback --include-ignored watchdog_ends_a_tile --test-threads=1 > "$OUT/loopback.log" 2>&1
echo "loopback rc=$?"; grep -E "^test |test result|panicked" "$OUT/loopback.log"
FICCO_TRACE=0 timeout 230 .bin/test-gpu --include-ignored every_enumerated_schedule_is_correct_2gpus --nocapture --test-threads=1 > "$OUT/every.log" 2>&1
echo "every rc=$?"; grep -c "^measuring" "$OUT/every.log"; grep -E "^preparing|test result|panicked|HANG|hung" "$OUT/every.log" | head; tail -3 "$OUT/every.log"
