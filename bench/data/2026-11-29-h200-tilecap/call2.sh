# One H200, main with tile GEMMs that wait on no flag captured again (fde20fd on HEAD) and the
# upload fix (a graph with a launch-order edge is uploaded by its first launch). (1) The driver
# crash reduced: bench/launch_order.py with --upload. (2) The Python tile suite (captured gemm-rs
# tile calls replayed on fresh data; a captured ag-gemm one refused). (3) The harness in loopback,
# tile schedules with graphs and --no-graph: time, host launch per rank, errors. (4) Every GPU
# test. (5) 8 more graph runs of gemm-rs and gemm-ar tile plans as a hang check.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
LD_PRELOAD=$PWD/.bin/segv_report.so timeout 60 python bench/launch_order.py --flags 8 > $OUT/launch_order.txt 2>&1; echo "rc $?" >> $OUT/launch_order.txt
LD_PRELOAD=$PWD/.bin/segv_report.so timeout 60 python bench/launch_order.py --flags 8 --upload > $OUT/launch_order_upload.txt 2>&1; echo "rc $?" >> $OUT/launch_order_upload.txt
timeout 240 python python/tests/test_gpu_loopback.py tile > $OUT/tile.txt 2>&1; echo "rc $?" >> $OUT/tile.txt
show() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for s in d['schedules']:
    print(f\"  {s['name']:18} time {s['time_ms']:.4f} ms  launch {s.get('launch_us')} us  err {s.get('max_rel_err')} skipped {s.get('skipped')}\")
print('  hardware:', d['hardware'])" "$1"; }
for p in 2 4; do for op in gemm-rs gemm-ar ag-gemm; do for g in "" --no-graph; do
  echo "## P=$p $op ${g:-graphs}" >> $OUT/harness.txt
  LD_PRELOAD=$PWD/.bin/segv_report.so timeout 90 .bin/ficco explore --backend loopback --op $op --m 4096 --k 2048 --n 2048 --gpus $p \
    --schedule tile-copy-ring,tile-copy-all,shard-copy-ring --json $g > /tmp/x.json 2>/tmp/x.err; echo "rc $?" >> $OUT/harness.txt
  show /tmp/x.json >> $OUT/harness.txt 2>&1; grep -E 'segv_report|rror' /tmp/x.err | head -8 >> $OUT/harness.txt
done; done; done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
for i in $(seq 8); do for op in gemm-rs gemm-ar; do
  timeout 60 .bin/ficco explore --backend loopback --op $op --m $((2048 * (1 + i % 3))) --k 1024 --n 2048 --gpus $((2 + 2 * (i % 2))) \
    --schedule tile-copy-ring,tile-copy-all --iters 50 --json > /tmp/x.json 2>/tmp/x.err; echo "soak $i $op rc $?" >> $OUT/soak.txt
  show /tmp/x.json | grep -v 'err 0.0 skipped None' >> $OUT/soak.txt; grep -i -E 'hang|watchdog|error' /tmp/x.err | head -3 >> $OUT/soak.txt
done; done
tail -4 $OUT/launch_order.txt; grep -E 'segv|graph|rc ' $OUT/launch_order_upload.txt | head; grep -E 'PASS|FAIL|Error|assert|rc ' $OUT/tile.txt | tail -12
cat $OUT/tests.txt; cat $OUT/harness.txt; cat $OUT/soak.txt | grep -v hardware
