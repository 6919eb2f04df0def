# One H200: the final code (binaries of 3cab972; no Rust or Python-package change after it):
# every GPU test.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
cat $OUT/tests.txt
