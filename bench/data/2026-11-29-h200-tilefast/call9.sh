# One H200: the final binaries (the launch-ordered capture reverted): every GPU test, the Python
# tile suite (2 and 4 ranks) and ops.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 200 python python/tests/test_gpu_loopback.py tile > $OUT/tile.txt 2>&1; echo "rc $?" >> $OUT/tile.txt
timeout 100 python python/tests/test_gpu_loopback.py ops > $OUT/ops.txt 2>&1; echo "rc $?" >> $OUT/ops.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -120 > $OUT/failures.txt
grep -E 'PASS|FAIL|rc ' $OUT/tile.txt $OUT/ops.txt; cat $OUT/tests.txt
