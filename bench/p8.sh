#!/usr/bin/env bash
# Issue 6: everything P=8 needs, as ONE device call on nvidia-h200-x8 (withheld so far).
# From the repo root on the GPU machine, with the release binaries carried in .bin/:
#   bash bench/p8.sh $OUT
# It runs the GPU tests, the anchor harness on the P=8 suite (PyTorch seq + async-TP beside ficco),
# the selector evaluation at P=8, and the characterization at 8 GPUs. Budget: about 9 minutes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out=${1:?usage: bench/p8.sh OUTDIR}
mkdir -p "$out/a"
.bin/ficco info >"$out/device.log" 2>&1
timeout 90 .bin/test-gpu --include-ignored --test-threads=1 --nocapture >>"$out/device.log" 2>&1
echo "gpu tests: exit $?"
TORCH_TIMEOUT=150 FICCO_TIMEOUT=200 bench/anchor.sh suites/llama3-p8.toml "$out/a" >"$out/anchor.log" 2>&1
tail -n 8 "$out/anchor.log"
# anchor.sh scores the selectors on its own sweep: $out/a/evaluate-p8.{txt,json}.
cat "$out/a/evaluate-p8.txt" 2>/dev/null
if .bin/ficco characterize --help >/dev/null 2>&1; then
  timeout 150 .bin/ficco characterize --gpus 8 --quick --out "$out/h200-x8.toml" --json "$out/characterize-p8.json" >>"$out/device.log" 2>&1
  echo "characterize: exit $?"
fi
