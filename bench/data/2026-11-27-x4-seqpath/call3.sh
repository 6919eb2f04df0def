#!/usr/bin/env bash
# Call 3: which kernels could share an SM (issue 30's occupancy shaping);
# training at P = 2 and 2048 tokens in every mode, with peak memory (issue
# 29: +33% under compile in the fifth session). Binaries of call 1.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
timeout 120 torchrun --nproc-per-node 2 bench/probe_residency.py --json "$out/residency.json" > "$out/residency.txt" 2>&1
RUN_TIMEOUT=150 bash bench/train_runs.sh "$out/train" 2 2048:eager:pytorch,ficco 2048:graphs:pytorch,ficco \
  2048:compile:pytorch,ficco > /dev/null
mv "$out/train/train.txt" "$out/train.txt"
