# One H200 (the only kind lent): tile schedules on the op path's stream-ordered path, run in
# loopback (FICCO_TEST_LOOPBACK_TILE=1: processes time-slice the GPU) on 2 and 4 ranks: exact,
# every call after a shape's first fast, a captured call refused; the loopback ops and repeat
# suites again (the fast-path rule changed); then the host cost of a tile call, fast against
# FICCO_OP_SYNC=1 (the full path every call, what every tile call paid before), 2 ranks.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 420 python python/tests/test_gpu_loopback.py tile > $OUT/tile.txt 2>&1; echo "rc $?" >> $OUT/tile.txt
timeout 100 python python/tests/test_gpu_loopback.py ops > $OUT/ops.txt 2>&1; echo "rc $?" >> $OUT/ops.txt
for sync in 0 1; do
  echo "## P=2 gemm-rs tile-copy-ring FICCO_OP_SYNC=$sync" >> $OUT/host.txt
  FICCO_TEST_LOOPBACK_TILE=1 FICCO_OP_SYNC=$sync timeout 100 torchrun --nproc-per-node 2 bench/host_breakdown.py --loopback \
    --op gemm-rs --schedule tile-copy-ring --shape 512,512,512 --calls 48 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E '^[a-z3].* us$|^  [a-z]' /tmp/run.txt >> $OUT/host.txt
  tail -5 /tmp/run.txt | grep -iE 'error|Traceback' >> $OUT/host.txt
done
grep -E 'PASS|FAIL|Error|assert|rc |phases' $OUT/tile.txt | tail -30; grep -E 'PASS|FAIL|rc ' $OUT/ops.txt; cat $OUT/host.txt
