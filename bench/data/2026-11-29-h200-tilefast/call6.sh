# One H200: tile GEMMs that wait on no flag (gemm-rs, gemm-ar without -acc) captured in graphs,
# their launch ordering the rank's other streams (launch-completion events). The Python tile
# suite (op path: their calls now replay graphs; a captured gemm-rs tile call replayed on fresh
# data; a captured ag-gemm one refused); every GPU test (the harness captures them in loopback
# too); the harness in loopback, graphs against --no-graph, host launch per rank and time, and
# 12 more graph runs of each as a hang check (watchdog 10 s).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 300 python python/tests/test_gpu_loopback.py tile > $OUT/tile.txt 2>&1; echo "rc $?" >> $OUT/tile.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -120 > $OUT/failures.txt
show() { python3 -c "
import json, sys
def walk(x):
    if isinstance(x, dict):
        if 'name' in x and 'launch_us' in x:
            print(f\"  {x['name']:24} time {x.get('time_ms')} ms  launch {x.get('launch_us')} us  err {x.get('max_rel_err')} wrong {x.get('wrong', False)} skipped {x.get('skipped')}\")
        for v in x.values(): walk(v)
    elif isinstance(x, list):
        for v in x: walk(v)
walk(json.load(open(sys.argv[1])))" "$1"; }
for p in 2 4; do for op in gemm-rs gemm-ar ag-gemm; do for g in "" --no-graph; do
  echo "## P=$p $op ${g:-graphs}" >> $OUT/harness.txt
  timeout 90 .bin/ficco explore --backend loopback --op $op --m 4096 --k 2048 --n 2048 --gpus $p \
    --schedule tile-copy-ring,tile-copy-all --json $g > /tmp/x.json 2>/tmp/x.err; echo "rc $?" >> $OUT/harness.txt
  show /tmp/x.json >> $OUT/harness.txt 2>&1; tail -2 /tmp/x.err >> $OUT/harness.txt
done; done; done
for i in $(seq 12); do for op in gemm-rs gemm-ar; do
  timeout 60 .bin/ficco explore --backend loopback --op $op --m $((2048 * (1 + i % 3))) --k 1024 --n 2048 --gpus $((2 + 2 * (i % 2))) \
    --schedule tile-copy-ring,tile-copy-all --iters 50 --json > /tmp/x.json 2>/tmp/x.err; echo "soak $i $op rc $?" >> $OUT/soak.txt
  show /tmp/x.json | grep -E 'wrong True|skipped [^N]|err None' >> $OUT/soak.txt; grep -i -E 'hang|watchdog|error' /tmp/x.err | head -3 >> $OUT/soak.txt
done; done
grep -E 'PASS|FAIL|Error|assert|rc |phases' $OUT/tile.txt | tail -12; cat $OUT/tests.txt; cat $OUT/harness.txt; grep -v 'rc 0' $OUT/soak.txt | head; grep -c 'rc 0' $OUT/soak.txt
