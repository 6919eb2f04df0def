# One H200: the Python loopback cases not run with the kernel before (repeat: many calls on
# fresh data, ops and shapes alternating; dead: a rank dies before or during calls, the others
# must raise; grad: gradients against fp32 autograd), with FICCO_FLAG_KERNELS=1.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for mode in repeat grad dead; do
  FICCO_FLAG_KERNELS=1 timeout 170 python python/tests/test_gpu_loopback.py $mode > /tmp/$mode.txt 2>&1
  echo "$mode rc $?" >> $OUT/python.txt
  grep -E '^PASS|^FAIL|passed|failed|Error|error' /tmp/$mode.txt | grep -v 'trace' | tail -15 >> $OUT/python.txt
done
cat $OUT/python.txt
