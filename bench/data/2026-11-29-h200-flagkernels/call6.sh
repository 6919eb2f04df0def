# One H200: call 5's failfast case hung with the kernel: rank 0's call wrote its start mark
# (pinned host memory) and spun on a dead peer's flag in the same kernel, and the watch never
# saw the mark. Part 5 of the probe asks whether the host sees such a write while the kernel
# spins, without and with a fence after it; then the dead-rank cases with the kernel that now
# fences its writes before it spins.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 40 python bench/signal_kernel.py --host-visibility > $OUT/probe.txt 2>&1; echo "probe rc $?" >> $OUT/probe.txt
FICCO_FLAG_KERNELS=1 timeout 110 python python/tests/test_gpu_loopback.py dead > /tmp/dead.txt 2>&1
echo "dead rc $?" > $OUT/python.txt
grep -E '^PASS|^FAIL|passed|failed|Error' /tmp/dead.txt | tail -15 >> $OUT/python.txt
cat $OUT/probe.txt $OUT/python.txt
