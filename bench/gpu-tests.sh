#!/usr/bin/env bash
# Runs every GPU test executable in .bin/ (see bench/build-bin.sh) with
# FICCO_REQUIRE_GPU=1, so a lost GPU fails instead of skipping. Usage, on the
# GPU machine from the repo root: bash bench/gpu-tests.sh OUTDIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
export FICCO_BIN=${FICCO_BIN:-$PWD/.bin/ficco}
out=${1:-/tmp/ficco-gpu-tests}
mkdir -p "$out"
status=0
for t in .bin/test-*; do
  echo "== $t"
  # (No `|| true` after the pipeline: with pipefail it would run and reset
  # PIPESTATUS, reporting a failed binary as exit 0.)
  timeout "${TEST_TIMEOUT:-240}" "$t" --test-threads=1 2>&1 | tee "$out/$(basename "$t").log" |
    grep -E "^test |SKIPPED|test result|panicked"
  rc=${PIPESTATUS[0]}
  echo "== $t exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
