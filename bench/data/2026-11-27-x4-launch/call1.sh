#!/usr/bin/env bash
# Call 1: graph-launch cost by node kind (GPU 0), the P = 4 call graphs'
# census and host breakdown, and training under torch.compile beside
# async-TP at P = 4.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl >/dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$out/gpus.txt"
timeout 120 python bench/graph_launch.py --json "$out/graph_launch.json" > "$out/graph_launch.txt" 2>&1
for spec in ag-gemm:shard-copy-ring gemm-rs:shard-copy-ring gemm-rs:fine4-copy-ring; do
  IFS=: read -r op s <<<"$spec"
  echo "## P=4 $op $s 512,512,512" >> "$out/host.txt"
  FICCO_TRACE=1 timeout 120 torchrun --nproc-per-node 4 bench/host_breakdown.py --op $op --schedule $s \
    --shape 512,512,512 --calls 100 --reps 3 > "$out/hb.log" 2>&1
  grep -v "^ficco trace" "$out/hb.log" | grep -v Warning >> "$out/host.txt"
  grep "call graph captured" "$out/hb.log" | sed 's/.*op //' | sort | uniq -c >> "$out/host.txt"
done
rm -f "$out/hb.log"
RUN_TIMEOUT=300 bash bench/train_runs.sh "$out/train" 4 8192:compile:pytorch,async-tp,ficco 2048:compile:pytorch,async-tp,ficco
