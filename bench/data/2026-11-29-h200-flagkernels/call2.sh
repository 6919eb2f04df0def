# 4 GPUs: every GPU test with FICCO_FLAG_KERNELS=auto (on: one GPU per rank; the default is 0);
# the host cost of a replayed call, flags by memory operations (0) against by kernel (auto),
# one after the other; the harness's times of the llama3-70b layers at 2048 tokens, both ways.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt; nvidia-smi -L >> $OUT/commit.txt
FICCO_FLAG_KERNELS=auto TEST_TIMEOUT=150 bash bench/gpu-tests.sh /tmp/tests > /tmp/tests.txt 2>&1
grep -E 'panicked|FAILED' /tmp/tests.txt > $OUT/tests.txt; tail -14 /tmp/tests.txt >> $OUT/tests.txt
grep -h -B2 -A25 'panicked' /tmp/tests/*.log | head -150 > $OUT/failures.txt
for p in 4 2; do for op in ag-gemm gemm-rs; do for fk in 0 auto 0 auto; do
  echo "## P=$p $op FICCO_FLAG_KERNELS=$fk" >> $OUT/host.txt
  FICCO_FLAG_KERNELS=$fk timeout 120 torchrun --nproc-per-node $p bench/host_breakdown.py --op $op \
    --schedule shard-copy-ring --shape 512,512,512 --calls 96 --reps 5 --sync-every 8 2>&1 \
    | grep -v '^W1\|^\[rank\|Warning' >> $OUT/host.txt
done; done; done
for fk in 0 auto; do
  echo "## FICCO_FLAG_KERNELS=$fk" >> $OUT/harness.txt
  FICCO_FLAG_KERNELS=$fk timeout 150 .bin/ficco explore --backend gpu --model llama3-70b --tokens 2048 --gpus 4 \
    --schedule shard-copy-ring,bulk-copy-ring >> $OUT/harness.txt 2>&1
done
cat $OUT/tests.txt; grep -E '^##|public|launch|native' $OUT/host.txt | head -80; cat $OUT/harness.txt | head -60
