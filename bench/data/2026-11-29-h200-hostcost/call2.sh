# One H200: the host cost after the steady path's trims (Python: no lazy-init device query, the
# device index passed on; native: the arena layout and fast-capability kept per call shape, the
# schedule name formatted once), P=2 and P=4, with the call graphs' census (nodes, edges); the
# Python layer before/after in the same call (old_torch.py = ficco/torch.py of 83e8758); what
# cross-stream edges cost a graph launch (graph_launch.py); the Python suites and every GPU test.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
rm -rf /tmp/pyold && cp -r /tmp/pynew /tmp/pyold && cp bench/data/2026-11-29-h200-hostcost/old_torch.py /tmp/pyold/ficco/torch.py
for P in 2 4; do for op in ag-gemm gemm-rs gemm-ar; do
  echo "## P=$P $op" >> $OUT/host.txt
  FICCO_TRACE=1 FICCO_FLAG_KERNELS=1 timeout 100 torchrun --nproc-per-node $P bench/host_breakdown.py --loopback \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E ' us|^  [a-z]|^# native' /tmp/run.txt >> $OUT/host.txt
  grep -h 'call graph captured' /tmp/run.txt | sed 's/.*captured: //' | sort | uniq -c >> $OUT/host.txt
done; done
for P in 2 4; do
  echo "## old Python, P=$P gemm-rs" >> $OUT/host-oldpy.txt
  PYTHONPATH=/tmp/pyold FICCO_FLAG_KERNELS=1 timeout 100 torchrun --nproc-per-node $P bench/host_breakdown.py --loopback \
    --op gemm-rs --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host-oldpy.txt; grep -E 'public call' /tmp/run.txt >> $OUT/host-oldpy.txt
done
(cd bench && timeout 120 python graph_launch.py --launches 2000) > $OUT/graph_launch.txt 2>&1
for m in ops tile repeat graphs; do
  timeout 200 python python/tests/test_gpu_loopback.py $m > /tmp/$m.txt 2>&1; echo "rc $?" >> /tmp/$m.txt
  grep -E 'PASS|FAIL|rc |Error' /tmp/$m.txt >> $OUT/suites.txt
done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
grep -E '^##|^rc|public|native run_op|launch|stubbed|Ok' $OUT/host.txt; cat $OUT/host-oldpy.txt $OUT/graph_launch.txt $OUT/suites.txt $OUT/tests.txt
