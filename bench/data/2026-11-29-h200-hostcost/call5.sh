# One H200: the real call graphs as DOT (FICCO_GRAPH_DOT), P=2 and P=4 gemm-rs and ag-gemm
# shard-copy-ring 512^3 (loopback, flag kernels on), beside their host breakdown.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for P in 2 4; do for op in gemm-rs ag-gemm; do
  echo "## P=$P $op" >> $OUT/host.txt
  FICCO_GRAPH_DOT=$OUT/dot-p$P-$op FICCO_TRACE=1 FICCO_FLAG_KERNELS=1 timeout 100 torchrun --nproc-per-node $P \
    bench/host_breakdown.py --loopback --op $op --schedule shard-copy-ring --shape 512,512,512 \
    --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E 'public call|native run_op|^  [a-z]' /tmp/run.txt >> $OUT/host.txt
  grep -h 'call graph captured\|no DOT' /tmp/run.txt | sed 's/.*op //' | sort | uniq -c >> $OUT/host.txt
  ls $OUT/dot-p$P-$op | head -3 >> $OUT/host.txt
  # One DOT per rank is enough to read.
  find $OUT/dot-p$P-$op -name '*.dot' | sort | awk -F-r '{split($NF,a,"-"); if (seen[a[1]]++) print}' | xargs -r rm
done; done
cat $OUT/host.txt
