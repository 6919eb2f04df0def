#!/usr/bin/env bash
# Issue 4 in ONE device call on nvidia-h200-x4: the concurrent suite (every control
# combination, measured and simulated side by side, with the ablation), the controls on
# dependent-operator anchor shapes, and the GPU tests (executor + control primitives).
# From the repo root on the GPU machine, with the release binaries carried in .bin/
# (bench/build-bin.sh: ficco, test-gpu, test-ficco_cuda):   bash bench/concurrent.sh $OUT
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?usage: bench/concurrent.sh OUTDIR}
mkdir -p "$out"
.bin/ficco info >"$out/device.log" 2>&1
# 1. The concurrent suite: table + ablation, then the JSON (same binary, same machine).
timeout 150 .bin/ficco explore --backend gpu --suite suites/concurrent.toml >"$out/concurrent.txt" 2>>"$out/device.log"
echo "concurrent suite: exit $?"
timeout 110 .bin/ficco explore --backend gpu --suite suites/concurrent.toml --json >"$out/concurrent.json" 2>>"$out/device.log"
echo "concurrent json: exit $?"
# 2. Controls on the dependent operators (the project's P=4 anchor shapes with NCCL variants).
for shape in "ag-gemm 8192 8192 2560" "gemm-rs 8192 2048 8192" "gemm-ar 16384 2048 8192" "ag-gemm 16384 8192 14336"; do
  set -- $shape
  timeout 45 .bin/ficco explore --backend gpu --controls --op "$1" --m "$2" --k "$3" --n "$4" --gpus 4 --json \
    >"$out/controls-$1-$2-$3-$4.json" 2>>"$out/device.log"
  echo "controls $shape: exit $?"
done
# 3. GPU tests (#[ignore]d, so --include-ignored): every schedule (controls and concurrent
# included) correct; control primitives.
timeout 110 .bin/test-gpu --include-ignored --test-threads=1 --nocapture >"$out/tests.log" 2>&1
echo "gpu tests: exit $?"
timeout 40 .bin/test-ficco_cuda --include-ignored controls::gpu_tests --test-threads=1 --nocapture >>"$out/tests.log" 2>&1
echo "gpu control tests: exit $?"
