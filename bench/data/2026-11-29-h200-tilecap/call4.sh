# One H200 (same binaries as call 3): the op path's host cost of tile calls, replayed from
# per-call graphs (FICCO_GRAPHS=1, now that gemm-rs and gemm-ar tile GEMMs are captured) against
# issued step by step (FICCO_GRAPHS=0), in one call; loopback needs FICCO_TEST_LOOPBACK_TILE=1.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for P in 2 4; do for op in gemm-rs gemm-ar; do for g in 1 0; do
  echo "## P=$P $op tile-copy-ring FICCO_GRAPHS=$g" >> $OUT/host.txt
  FICCO_GRAPHS=$g FICCO_TEST_LOOPBACK_TILE=1 FICCO_TRACE=1 timeout 100 torchrun --nproc-per-node $P bench/host_breakdown.py --loopback \
    --op $op --schedule tile-copy-ring --shape 512,512,512 --calls 32 --reps 3 --sync-every 8 > /tmp/run.txt 2>&1
  echo "rc $?" >> $OUT/host.txt
  grep -E ' us|^  [a-z]|^# native|rror' /tmp/run.txt | grep -v '^ficco trace' | head -40 >> $OUT/host.txt
  grep -h 'call graph captured' /tmp/run.txt | sed 's/.*captured: //' | sort | uniq -c >> $OUT/host.txt
done; done; done
cat $OUT/host.txt | grep -E '##|public|launch|issue|rc |captured|rror'
