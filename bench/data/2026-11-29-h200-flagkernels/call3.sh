# One H200: the host cost of a replayed 512^3 shard-copy-ring call in loopback (P processes on
# cuda:0, gloo), flags by memory operations (FICCO_FLAG_KERNELS=0) against by kernel (=1),
# with the captured call graph's node census (FICCO_TRACE=1). Device times mean nothing here.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for p in 2 4; do for op in ag-gemm gemm-rs; do for fk in 0 1; do
  echo "## P=$p $op FICCO_FLAG_KERNELS=$fk" >> $OUT/host.txt
  FICCO_TRACE=1 FICCO_FLAG_KERNELS=$fk timeout 100 torchrun --nproc-per-node $p bench/host_breakdown.py --loopback \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E '^[a-z3].* us$|^  [a-z]' /tmp/run.txt >> $OUT/host.txt
  grep -h 'call graph captured' /tmp/run.txt | sed 's/.*captured: //' | sort | uniq -c >> $OUT/host.txt
done; done; done
grep -E '^##|^rc|public|native run_op \(pos|launch|GRAPH|MEM|KERNEL|\(\"' $OUT/host.txt
