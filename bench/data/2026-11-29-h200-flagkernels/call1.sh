# One H200 (the only kind lent): every GPU test with the signal kernel forced on in
# loopback (FICCO_FLAG_KERNELS=1), and the Python loopback ops and graphs cases with it,
# their call graphs' node census (FICCO_TRACE=1).
source bench/on-device.sh
export FICCO_FLAG_KERNELS=1
cat .bin/COMMIT > $OUT/commit.txt; nvidia-smi -L >> $OUT/commit.txt
TEST_TIMEOUT=240 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E '^test .*(FAILED|ok)$|panicked|test result' /tmp/tests.txt | grep -v ' ok$' > $OUT/tests.txt
tail -25 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
for mode in ops graphs; do
  FICCO_TRACE=1 timeout 200 python python/tests/test_gpu_loopback.py $mode > /tmp/$mode.txt 2>&1
  echo "$mode rc $?" >> $OUT/python.txt
  grep -v 'census\|^ficco trace\|trace:' /tmp/$mode.txt | tail -20 >> $OUT/python.txt
  grep -h 'call graph captured' /tmp/$mode.txt | sed 's/.*captured: //' | sort | uniq -c | sort -rn | head -12 >> $OUT/census.txt
done
cat $OUT/python.txt; cat $OUT/census.txt; tail -5 $OUT/tests.txt
