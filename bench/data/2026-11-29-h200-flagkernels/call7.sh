# One H200, the last of the device time: the fast-path dead-rank case that hung in calls 5 and
# 6 (2 ranks, rank 1 dies, rank 0 replays the call graph of its last call), after each call
# first sets its DONE word off its number (a replay that follows a call of the same graph left
# STARTED == DONE, so the watch never saw it hang). Default flags (memory operations).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 60 python -c "
import sys, tempfile, pathlib, time
sys.path.insert(0, 'python/tests')
import test_gpu_loopback as t
t0 = time.monotonic()
t.check_dead_rank(2, 1, 'failfast', pathlib.Path(tempfile.mkdtemp()))
print(f'PASS dead rank world=2 victim=1 (failfast) ({time.monotonic() - t0:.1f} s)')
" > $OUT/failfast.txt 2>&1; echo "rc $?" >> $OUT/failfast.txt
grep -E 'PASS|Error|assert|rc ' $OUT/failfast.txt | tail -8
