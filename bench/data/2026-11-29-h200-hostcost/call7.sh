# One H200: the same probe, now also launching into the legacy default stream (PyTorch's default
# current stream) and timing the event record the op path adds after a replay.
source bench/on-device.sh
(cd bench && timeout 200 python graph_launch.py --launches 4000 --flags 8 --json $OUT/graph_launch.json) > $OUT/graph_launch.txt 2>&1
echo "rc $?" >> $OUT/graph_launch.txt; cat $OUT/graph_launch.txt
