# One H200, binaries of 90a5089 (launch-ordered tile GEMMs captured; reverted since in bb814ab):
# where the harness's graph run of a gemm-rs tile plan crashes (FICCO_TRACE phases; a gdb
# backtrace where gdb exists).
source bench/on-device.sh
cat .bin/COMMIT > $OUT/commit.txt
which gdb compute-sanitizer > $OUT/tools.txt 2>&1
args="explore --backend loopback --op gemm-rs --m 4096 --k 2048 --n 2048 --gpus 2 --schedule tile-copy-ring"
FICCO_TRACE=1 timeout 60 .bin/ficco $args > $OUT/trace.txt 2>&1; echo "rc $?" >> $OUT/trace.txt
if command -v gdb > /dev/null; then
  timeout 120 gdb -batch -ex run -ex bt -ex 'info threads' --args .bin/ficco $args > $OUT/gdb.txt 2>&1
  grep -E '^#|SIG|Thread' $OUT/gdb.txt | head -40
fi
cat $OUT/tools.txt; tail -25 $OUT/trace.txt
