# One H200: the final code (one launch_kernel with an optional launch-completion event, used by
# the signal kernel, the controls' kernels and the tile GEMM): every GPU test, the Python tile and
# ops suites, the harness's captured tile plans again (exact, graphs vs --no-graph).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for m in tile ops; do
  timeout 150 python python/tests/test_gpu_loopback.py $m > /tmp/$m.txt 2>&1; echo "rc $?" >> /tmp/$m.txt
  grep -E 'PASS|FAIL|rc |Error' /tmp/$m.txt >> $OUT/suites.txt
done
for op in gemm-rs gemm-ar; do for g in "" --no-graph; do
  echo "## P=4 $op ${g:-graphs}" >> $OUT/harness.txt
  timeout 90 .bin/ficco explore --backend loopback --op $op --m 4096 --k 2048 --n 2048 --gpus 4 \
    --schedule tile-copy-ring,tile-copy-all --json $g > /tmp/x.json 2>/tmp/x.err; echo "rc $?" >> $OUT/harness.txt
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for s in d['schedules']:
    print(f\"  {s['name']:18} time {s['time_ms']:.4f} ms  launch {s.get('launch_us')} us  err {s.get('max_rel_err')} skipped {s.get('skipped')}\")
print('  hardware:', d['hardware'])" /tmp/x.json >> $OUT/harness.txt 2>&1
done; done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
cat $OUT/suites.txt $OUT/harness.txt $OUT/tests.txt
