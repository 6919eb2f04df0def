# One H200: does a launch-completion event (a LAUNCH_ORDER edge in a graph) let a side stream's
# flag wait run while a persistent kernel spins, directly and in a graph replay?
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
timeout 120 python bench/launch_order.py --us 300 --reps 20 > $OUT/launch_order.txt 2>&1; echo "rc $?" >> $OUT/launch_order.txt
cat $OUT/launch_order.txt
