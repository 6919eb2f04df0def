# One H200: the P=2 gemm-rs call graph's shape rebuilt in the launch probe (as captured, with
# the forked streams' redundant waits on the start; without them; without the high priority).
source bench/on-device.sh
(cd bench && timeout 200 python graph_launch.py --launches 4000 --flags 0 8 --json $OUT/graph_launch.json) > $OUT/graph_launch.txt 2>&1
echo "rc $?" >> $OUT/graph_launch.txt; cat $OUT/graph_launch.txt
