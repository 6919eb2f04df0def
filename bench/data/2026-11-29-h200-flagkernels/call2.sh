# 4 GPUs (about 5 minutes): every GPU test with FICCO_FLAG_KERNELS=auto (on: one GPU per rank; the
# default is 0); the host cost of a replayed call at P=4, flags by memory operations (0) against by
# kernel (auto); the harness's times of the llama3-70b layers at 2048 tokens, both ways, one call.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt; nvidia-smi -L >> $OUT/commit.txt
FICCO_FLAG_KERNELS=auto TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
for op in ag-gemm gemm-rs; do for fk in 0 auto; do
  echo "## P=4 $op FICCO_FLAG_KERNELS=$fk" >> $OUT/host.txt
  FICCO_FLAG_KERNELS=$fk timeout 90 torchrun --nproc-per-node 4 bench/host_breakdown.py --op $op \
    --schedule shard-copy-ring --shape 512,512,512 --calls 96 --reps 5 --sync-every 8 2>&1 \
    | grep -E '^[a-z3].* us$|^  [a-z]' >> $OUT/host.txt
done; done
for fk in 0 auto; do
  echo "## FICCO_FLAG_KERNELS=$fk" >> $OUT/harness.txt
  FICCO_FLAG_KERNELS=$fk timeout 100 .bin/ficco explore --backend gpu --model llama3-70b --tokens 2048 --gpus 4 \
    --schedule shard-copy-ring >> $OUT/harness.txt 2>&1
done
cat $OUT/tests.txt; grep -E '^##|public|launch|native run_op \(pos' $OUT/host.txt; cat $OUT/harness.txt | head -60
