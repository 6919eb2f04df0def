# One H200: the loopback tile test updated (graphs where the GEMM waits on no flag); the op
# path's host cost of tile calls now replayed from per-call graphs (gemm-rs, gemm-ar
# tile-copy-ring, P=2 and 4, 512^3, out=; shard-copy-ring beside it); the Python graphs and
# repeat suites.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 200 .bin/test-gpu_loopback --include-ignored --test-threads=1 every_tile_schedule_is_exact_in_loopback \
  --nocapture > $OUT/loopback_tile.txt 2>&1; echo "rc $?" >> $OUT/loopback_tile.txt
for P in 2 4; do for op in gemm-rs gemm-ar; do for s in tile-copy-ring shard-copy-ring; do
  echo "## P=$P $op $s" >> $OUT/host.txt
  FICCO_TRACE=1 timeout 100 torchrun --nproc-per-node $P bench/host_breakdown.py --loopback \
    --op $op --schedule $s --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E ' us|^  [a-z]|^# native' /tmp/run.txt >> $OUT/host.txt
  grep -h 'call graph captured' /tmp/run.txt | sed 's/.*captured: //' | sort | uniq -c >> $OUT/host.txt
done; done; done
for m in graphs repeat; do
  timeout 150 python python/tests/test_gpu_loopback.py $m > /tmp/$m.txt 2>&1; echo "rc $?" >> /tmp/$m.txt
  grep -E 'PASS|FAIL|rc |Error' /tmp/$m.txt >> $OUT/suites.txt
done
grep -E 'PASS|FAIL|test result|rc ' $OUT/loopback_tile.txt | grep -c graph; grep -E 'test result|failed|rc ' $OUT/loopback_tile.txt | tail -4
cat $OUT/host.txt | grep -E '##|public|launch|rc |captured'; cat $OUT/suites.txt
