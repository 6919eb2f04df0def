#!/usr/bin/env bash
# Call 4: the block at P = 4 and 8192 tokens in every mode beside async-TP,
# and the share of the harness's saving it keeps, on today's call path
# (issue 28); training at P = 2 and 2048 tokens under graphs and compile
# with the input gradients on ficco and on PyTorch's path (issue 29).
# Binaries of call 1.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew PATH=$PWD/.bin:$PATH
timeout 300 bash bench/oppath.sh "$out/oppath" 4 8192 > "$out/oppath.txt" 2>&1
tar -cJf "$out/oppath8192.tar.xz" -C "$out/oppath" . && rm -rf "$out/oppath"
RUN_TIMEOUT=120 bash bench/train_runs.sh "$out/train" 2 2048:graphs:pytorch,ficco,ficco-torchbwd \
  2048:compile:pytorch,ficco,ficco-torchbwd > /dev/null
mv "$out/train/train.txt" "$out/train.txt"
