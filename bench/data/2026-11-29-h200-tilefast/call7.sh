# One H200: call 6's graph runs of launch-ordered tile GEMMs segfaulted (exit 139) while the probe of
# call 5 did not; the probe again with the executor's instantiation flag (use node priorities, 8)
# and its capture modes (thread-local 1, relaxed 2), each in its own process.
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
for f in 0 8; do for m in 1 2; do
  echo "## flags $f capture mode $m" >> $OUT/probe.txt
  timeout 60 python bench/launch_order.py --us 300 --reps 5 --flags $f --capture-mode $m >> $OUT/probe.txt 2>&1
  echo "rc $?" >> $OUT/probe.txt
done; done
cat $OUT/probe.txt
