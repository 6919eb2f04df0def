# One H200: whether cuBLASLt GEMM nodes cost a graph launch more than plain kernels
# (graph_launch.py); whether the launch-order capture crashes with a library kernel handle
# (launch_order.py, module vs --library); the binding's own cost (native getters, P=2 host
# breakdown); every GPU test and the Python tile suite after DestLayout (the -acc tables).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
(cd bench && timeout 120 python graph_launch.py --launches 2000) > $OUT/graph_launch.txt 2>&1; echo "rc $?" >> $OUT/graph_launch.txt
for lib in "" --library; do
  echo "## launch_order $lib" >> $OUT/launch_order.txt
  (cd bench && timeout 60 python launch_order.py --reps 10 --flags 8 --capture-mode 1 $lib) >> $OUT/launch_order.txt 2>&1
  echo "rc $?" >> $OUT/launch_order.txt
done
FICCO_FLAG_KERNELS=1 timeout 100 torchrun --nproc-per-node 2 bench/host_breakdown.py --loopback \
  --op gemm-rs --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
echo "rc $?" > $OUT/host.txt; grep -E ' us|^  [a-z]|^# native' /tmp/run.txt >> $OUT/host.txt
timeout 200 python python/tests/test_gpu_loopback.py tile > /tmp/tile.txt 2>&1; echo "rc $?" >> /tmp/tile.txt
grep -E 'PASS|FAIL|rc |Error' /tmp/tile.txt > $OUT/suites.txt
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
cat $OUT/graph_launch.txt $OUT/launch_order.txt; grep -E 'public|native|getter' $OUT/host.txt; cat $OUT/suites.txt $OUT/tests.txt
