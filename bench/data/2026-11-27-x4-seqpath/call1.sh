#!/usr/bin/env bash
# Call 1 (eleventh session): what a launch pays for copies from a peer; the
# binding's entry and return as phases (first GPU run of the refactored
# run_op); the sequential reference by path at the block's shapes; the
# block at 2048 tokens eager, host watch on and off; the concurrent suite
# on today's executor (issue 30).
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
{ cat .bin/COMMIT; nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; } > "$out/host.txt"
CUDA_VISIBLE_DEVICES=0,1 timeout 60 python bench/graph_launch.py --json "$out/graph_launch.json" >> "$out/host.txt" 2>&1
for spec in 4:ag-gemm 4:gemm-rs 2:ag-gemm; do
  IFS=: read -r p op <<<"$spec"
  echo "## P=$p $op shard-copy-ring 512,512,512" >> "$out/host.txt"
  timeout 60 torchrun --nproc-per-node $p bench/host_breakdown.py \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 96 --reps 5 --sync-every 8 2>&1 \
    | grep -E "^[a-z#0-9 ]|^  [a-z]" | grep -v "^ficco trace" >> "$out/host.txt"
done
for t in 2048 8192; do
  timeout 90 torchrun --nproc-per-node 4 bench/seq_paths.py --tokens $t --json "$out/seq-$t.json" 2>&1 \
    | grep -E "^#|^  " >> "$out/seq.txt"
done
for run in 1 2; do
  for adapt in 1 0; do
    echo "## run $run FICCO_ADAPT_HOST=$adapt" >> "$out/block2048.txt"
    FICCO_ADAPT_HOST=$adapt timeout 100 torchrun --nproc-per-node 4 examples/llama_tp_block.py --tokens 2048 \
      --mode eager 2>&1 | grep -E "^#|^  " >> "$out/block2048.txt"
  done
done
timeout 170 .bin/ficco explore --backend gpu --suite suites/concurrent.toml > "$out/concurrent.txt" 2>&1
echo "concurrent: exit $?" >> "$out/concurrent.txt"
