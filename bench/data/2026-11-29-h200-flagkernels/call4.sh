# One H200, after flags went by kernel wherever no SM task of another stream can run beside
# them: every GPU test with FICCO_FLAG_KERNELS=1 (loopback takes the kernel path), the Python
# loopback ops case, and the host cost of replayed gemm-rs and gemm-ar calls at P=4 (loopback), 0 against 1.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
FICCO_FLAG_KERNELS=1 TEST_TIMEOUT=240 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
FICCO_FLAG_KERNELS=1 timeout 200 python python/tests/test_gpu_loopback.py ops > /tmp/ops.txt 2>&1
echo "ops rc $?" > $OUT/python.txt; grep -E '^PASS|^FAIL|passed|failed' /tmp/ops.txt >> $OUT/python.txt
for op in gemm-rs gemm-ar; do for fk in 0 1; do
  echo "## P=4 $op FICCO_FLAG_KERNELS=$fk" >> $OUT/host.txt
  FICCO_TRACE=1 FICCO_FLAG_KERNELS=$fk timeout 100 torchrun --nproc-per-node 4 bench/host_breakdown.py --loopback \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E '^[a-z3].* us$|^  [a-z]' /tmp/run.txt >> $OUT/host.txt
  grep -h 'call graph captured' /tmp/run.txt | sed 's/.*captured: //' | sort | uniq -c >> $OUT/host.txt
done; done
cat $OUT/tests.txt $OUT/python.txt; grep -E '^##|^rc|public|native run_op \(pos|launch|Ok' $OUT/host.txt
