#!/usr/bin/env bash
# Issue 26, hang 2 after the fix (ag-gemm, MoE and concurrent copies push):
# soak P=4 issued directly and from graphs. Usage: bash bench/hang2.sh OUT
set -u
OUT=$1; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
export FICCO_WATCHDOG_MS=2000
cat .bin/COMMIT > "$OUT/commit"
run() { # name limit args...
  local name=$1 lim=$2; shift 2
  timeout $((lim + 40)) .bin/ficco soak --gpus 4 --iters 10 --time-limit $lim --trace --out "$OUT/$name.jsonl" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "$name rc=$? runs=$(wc -l < "$OUT/$name.jsonl") hangs=$(grep -c HANG "$OUT/$name.jsonl") wrong=$(grep -c WRONG "$OUT/$name.jsonl") errors=$(grep -c ERROR "$OUT/$name.jsonl")"
  tail -2 "$OUT/$name.err"
}
run direct-8b 110 --models llama3-8b --tokens 2048 --graphs off --only copy
run graphs-70b 60 --models llama3-70b --tokens 16384 --graphs on --only tile,copy-all
run direct-70b 40 --models llama3-70b --tokens 16384 --graphs off --only tile,copy-all
grep -ho '"scenario":"[^"]*","schedule":"[^"]*"' "$OUT"/*.jsonl | cut -d'"' -f4 | sort | uniq -c
