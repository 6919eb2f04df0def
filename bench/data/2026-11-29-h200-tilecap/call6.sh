# One H200: the final commit (graph_safe through Plan::has_task, a CPU test of it): every GPU
# test and the Python tile suite.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 100 python python/tests/test_gpu_loopback.py tile > /tmp/tile.txt 2>&1; echo "rc $?" >> /tmp/tile.txt
grep -E 'PASS|FAIL|rc |Error' /tmp/tile.txt > $OUT/suites.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
cat $OUT/suites.txt $OUT/tests.txt
