# One H200: every tile schedule on the op path's fast path, -acc included (its destination
# tables per address set; 2 ranks, shared outputs at two addresses), in loopback on 2 and 4
# ranks; the loopback ops, repeat and graphs suites; every GPU test (the full path's tile
# tables moved into exec::tables).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 300 python python/tests/test_gpu_loopback.py tile > $OUT/tile.txt 2>&1; echo "rc $?" >> $OUT/tile.txt
for m in ops repeat graphs; do
  timeout 150 python python/tests/test_gpu_loopback.py $m > /tmp/$m.txt 2>&1; echo "rc $?" >> /tmp/$m.txt
  grep -E 'PASS|FAIL|rc |Error' /tmp/$m.txt >> $OUT/suites.txt
done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
grep -E 'PASS|FAIL|Error|assert|rc |phases' $OUT/tile.txt | tail -30; cat $OUT/suites.txt $OUT/tests.txt
