# One H200 (the only kind lent): the fast-path dead-rank fix of 89f8b70, not yet run on a GPU
# (the case that hung in the flag-kernel session's calls 5 and 6), then every dead-rank case of
# the loopback suite with flags by memory operations (0) and by kernel (1).
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
for fk in 0 1; do
  FICCO_FLAG_KERNELS=$fk timeout 200 python python/tests/test_gpu_loopback.py dead > $OUT/dead-fk$fk.txt 2>&1
  echo "rc $?" >> $OUT/dead-fk$fk.txt
done
grep -E 'PASS|FAIL|Error|assert|rc ' $OUT/failfast.txt $OUT/dead-fk*.txt | tail -40
