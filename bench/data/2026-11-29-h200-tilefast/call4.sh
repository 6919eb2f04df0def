# One H200: every dead-rank case of the loopback suite, now with a tile GEMM spinning on the
# dead victim's rows in its fast path ("tiledead", 2 and 4 ranks; Python-only change).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 300 python python/tests/test_gpu_loopback.py dead > $OUT/dead.txt 2>&1; echo "rc $?" >> $OUT/dead.txt
grep -E 'PASS|FAIL|Error|assert|rc ' $OUT/dead.txt | tail -20
