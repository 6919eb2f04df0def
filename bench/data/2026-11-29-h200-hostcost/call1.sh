# One H200: the last session's refactor (Plan::has_task) on the GPU (every GPU test, the Python
# ops, tile and repeat suites), and where the public call's host time goes at P=2 and P=4
# (loopback, flag kernels on): the Python layer alone (native call stubbed) beside the native call.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for P in 2 4; do for op in ag-gemm gemm-rs; do
  echo "## P=$P $op" >> $OUT/host.txt
  FICCO_FLAG_KERNELS=1 timeout 100 torchrun --nproc-per-node $P bench/host_breakdown.py --loopback \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E ' us|^  [a-z]' /tmp/run.txt >> $OUT/host.txt
done; done
for m in ops tile repeat; do
  timeout 200 python python/tests/test_gpu_loopback.py $m > /tmp/$m.txt 2>&1; echo "rc $?" >> /tmp/$m.txt
  grep -E 'PASS|FAIL|rc |Error' /tmp/$m.txt >> $OUT/suites.txt
done
TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
cat $OUT/host.txt | grep -E '^##|^rc|public|native run_op|launch|stubbed'; cat $OUT/suites.txt $OUT/tests.txt
