#!/usr/bin/env bash
# Call 2: graph launch cost of memory operations on a peer's words; the
# sequential reference through torch.distributed's calls (_torch_seq) beside
# the functional collectives; training at 2048 tokens eager with the host
# watch on and off in one process, twice. Binaries of call 1 (41973c0: the
# Rust is unchanged), Python of the commit this script is in.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
{ git rev-parse --short HEAD 2>/dev/null; cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/launch.txt"
CUDA_VISIBLE_DEVICES=0,1 timeout 60 python bench/graph_launch.py --json "$out/graph_launch.json" >> "$out/launch.txt" 2>&1
timeout 90 torchrun --nproc-per-node 4 bench/seq_paths.py --tokens 2048 --json "$out/seq-2048.json" 2>&1 \
  | grep -E "^#|^  " >> "$out/seq.txt"
for run in 1 2; do
  RUN_TIMEOUT=120 bash bench/train_runs.sh "$out/train$run" 4 2048:eager:pytorch,ficco-watch,ficco-nowatch > /dev/null
  cat "$out/train$run/train.txt" >> "$out/train.txt"
done
