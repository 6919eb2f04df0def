#!/usr/bin/env bash
# The anchor harness: PyTorch (sequential + async-TP) and ficco on the same
# suite in one device call, merged into one markdown table.
# Usage, from the repo root on the GPU machine:
#   bench/anchor.sh SUITE OUTDIR [FICCO_BINARY]
# Writes OUTDIR/torch.jsonl, OUTDIR/ficco.json and OUTDIR/RESULTS.md.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
suite=$1
out=$2
bin=${3:-.bin/ficco}
mkdir -p "$out"
python3 bench/anchor.py torch "$suite" "$out/torch.jsonl"
"$bin" explore --backend gpu --suite "$suite" --json >"$out/ficco.json"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
count=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
commit=$(cat .bin/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 bench/anchor.py report "$out/torch.jsonl" "$out/ficco.json" --device "${count}x $device" --commit "$commit" >"$out/RESULTS.md"
cat "$out/RESULTS.md"
