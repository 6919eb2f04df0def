# One H200. (1) Every GPU test and the Python `ops` suite on main's HEAD (eb0cdf4's arena-layout
# move had not run on a GPU). (2) Where the captured tile plan of fde20fd crashes: its binary
# (.bin/ficco-tilecap, branch tilecap-exp: fde20fd on HEAD plus FICCO_EXP_LAUNCHED) under
# bench/segv_report.c, four ways: "" launch-completion attribute + the other streams wait for it,
# "attr" the attribute only, "event" a plain event recorded after the launch + the waits, "none"
# neither; then compute-sanitizer on the first.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 100 python python/tests/test_gpu_loopback.py ops > $OUT/ops.txt 2>&1; echo "rc $?" >> $OUT/ops.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
args="explore --backend loopback --op gemm-rs --m 4096 --k 2048 --n 2048 --gpus 2 --schedule tile-copy-ring --json"
for mode in "" attr event none; do
  echo "## mode '$mode'" >> $OUT/tilecap.txt
  FICCO_EXP_LAUNCHED=$mode LD_PRELOAD=$PWD/.bin/segv_report.so timeout 60 .bin/ficco-tilecap $args \
    > $OUT/tilecap-$mode.json 2> $OUT/tilecap-$mode.err; echo "rc $?" >> $OUT/tilecap.txt
  grep -E 'segv_report|error|Error' $OUT/tilecap-$mode.err | head -40 >> $OUT/tilecap.txt
  grep -o '"max_rel_err":[^,]*\|"time_ms":[^,]*\|"wrong":[^,]*' $OUT/tilecap-$mode.json | head -6 >> $OUT/tilecap.txt
done
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 .bin/ficco-tilecap $args > $OUT/sanitizer.txt 2>&1
echo "rc $?" >> $OUT/sanitizer.txt
cat $OUT/ops.txt | grep -E 'PASS|FAIL|rc ' | tail -5; cat $OUT/tests.txt; cat $OUT/tilecap.txt; grep -v '^ficco trace' $OUT/sanitizer.txt | tail -40
