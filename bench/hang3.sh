#!/usr/bin/env bash
# Issue 26, hang 3: a P=4 soak of the copy schedules issued directly, which
# stalled in the first gemm-rs `-acc` run without the watchdog ending it.
# Runs the soak under a monitor: when its stderr (FICCO_TRACE=1 phases) has
# not grown for STALL_S seconds, it records where each thread of the process
# is (kernel wait channel, system call, kernel stack, a scan of its user
# stack for return addresses) and the trace tail,
# then ends the process. Usage: bash bench/hang3.sh OUT [TRIES] [soak args...]
set -u
OUT=$1; TRIES=${2:-1}; shift 2 || shift $#
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
export FICCO_WATCHDOG_MS=${FICCO_WATCHDOG_MS:-2000} FICCO_TRACE=${FICCO_TRACE:-1}
STALL_S=${STALL_S:-20}
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--models llama3-8b --tokens 2048 --graphs off --only copy --iters 10 --time-limit 100)
cat .bin/COMMIT > "$OUT/commit" 2>/dev/null
for try in $(seq 1 "$TRIES"); do
  err="$OUT/try$try.err"
  .bin/ficco soak --gpus 4 --trace --out "$OUT/try$try.jsonl" "${args[@]}" > "$OUT/try$try.txt" 2> "$err" &
  pid=$!
  last=-1; still=0; stalled=0
  while kill -0 $pid 2>/dev/null; do
    sleep 1
    size=$(stat -c %s "$err" 2>/dev/null || echo 0)
    if [ "$size" = "$last" ]; then still=$((still + 1)); else still=0; last=$size; fi
    if [ $still -ge "$STALL_S" ]; then
      stalled=1
      {
        echo "# try $try: no trace output for $STALL_S s; threads of pid $pid"
        for t in /proc/$pid/task/*; do
          echo "## $(basename "$t") $(cat "$t/comm") wchan=$(cat "$t/wchan" 2>/dev/null) state=$(grep State "$t/status" | cut -f2)"
          echo "syscall: $(cat "$t/syscall" 2>/dev/null)"
          cat "$t/stack" 2>/dev/null | head -12
        done
        echo "# user-space stacks (bench/stackscan.py)"
        python3 bench/stackscan.py $pid --depth 65536 2>&1
        echo "# trace tail"
        tail -40 "$err"
      } > "$OUT/stall$try.txt"
      kill -9 $pid
      break
    fi
  done
  wait $pid; rc=$?
  echo "try $try rc=$rc stalled=$stalled runs=$(wc -l < "$OUT/try$try.jsonl" 2>/dev/null) hangs=$(grep -c HANG "$OUT/try$try.jsonl" 2>/dev/null) wrong=$(grep -c WRONG "$OUT/try$try.jsonl" 2>/dev/null)"
  if [ $stalled = 1 ]; then head -60 "$OUT/stall$try.txt"; fi
  tail -3 "$err"
done
