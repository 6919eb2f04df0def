#!/usr/bin/env bash
# Call 4: host cost per call with the device drained every 8 calls (no
# full launch queue), new wheel against main's (old/); training under
# torch.compile beside async-TP at P = 4; the block at 2048 tokens, new
# against old.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
for v in new old; do
  whl=.bin/ficco-*.whl; [ $v = old ] && whl=.bin/old/ficco-*.whl
  pip install -q --no-deps --target /tmp/py$v $whl > /dev/null 2>&1
  cp python/ficco/*.py /tmp/py$v/ficco/
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$out/gpus.txt"
for spec in new:4:ag-gemm old:4:ag-gemm new:4:gemm-rs old:4:gemm-rs new:2:ag-gemm old:2:ag-gemm; do
  IFS=: read -r v p op <<<"$spec"
  echo "## $v P=$p $op shard-copy-ring 512,512,512" >> "$out/host.txt"
  PYTHONPATH=/tmp/py$v timeout 60 torchrun --nproc-per-node $p bench/host_breakdown.py \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 96 --reps 5 --sync-every 8 2>&1 \
    | grep -E "^[a-z#0-9 ]|^  [a-z]" | grep -v "^ficco trace" >> "$out/host.txt"
done
PYTHONPATH=/tmp/pynew RUN_TIMEOUT=240 bash bench/train_runs.sh "$out/train" 4 8192:compile:pytorch,async-tp,ficco
for v in new old; do
  PYTHONPATH=/tmp/py$v timeout 100 torchrun --nproc-per-node 4 examples/llama_tp_block.py --tokens 2048 \
    --mode eager > "$out/block2048-$v.txt" 2>&1
done
