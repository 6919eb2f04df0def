# One H200: what a graph launch pays by node kind, each graph instantiated with flags 0 and 8
# (node priorities, as ficco's executor instantiates), median and mean host µs.
source bench/on-device.sh
(cd bench && timeout 200 python graph_launch.py --launches 2000 --flags 0 8 --json $OUT/graph_launch.json) > $OUT/graph_launch.txt 2>&1
echo "rc $?" >> $OUT/graph_launch.txt; cat $OUT/graph_launch.txt
