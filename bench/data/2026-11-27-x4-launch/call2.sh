#!/usr/bin/env bash
# Call 2: the batched control steps. Host cost per call and the call
# graphs' census, new wheel against main's (old/), at P = 4 and P = 2;
# then every GPU test and the soak on 4 GPUs.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
for v in new old; do
  whl=.bin/ficco-*.whl; [ $v = old ] && whl=.bin/old/ficco-*.whl
  pip install -q --no-deps --target /tmp/py$v $whl > "$out/pip-$v.txt" 2>&1 || cat "$out/pip-$v.txt"
  cp python/ficco/*.py /tmp/py$v/ficco/
done
for spec in new:4:ag-gemm old:4:ag-gemm new:4:gemm-rs old:4:gemm-rs new:2:ag-gemm old:2:ag-gemm; do
  IFS=: read -r v p op <<<"$spec"
  echo "## $v P=$p $op shard-copy-ring 512,512,512" >> "$out/host.txt"
  PYTHONPATH=/tmp/py$v FICCO_TRACE=1 timeout 120 torchrun --nproc-per-node $p bench/host_breakdown.py \
    --op $op --schedule shard-copy-ring --shape 512,512,512 --calls 100 --reps 3 > "$out/hb.log" 2>&1
  grep -v "^ficco trace" "$out/hb.log" | grep -v "^W1\|\*\*\*\*\|OMP_NUM" >> "$out/host.txt"
  grep "call graph captured" "$out/hb.log" | sed 's/.*op //' | sort | uniq -c >> "$out/host.txt"
done
rm -f "$out/hb.log"
TEST_TIMEOUT=150 bash bench/gpu-tests.sh "$out/tests" > "$out/gpu-tests.txt" 2>&1
cp "$out/tests/summary.txt" "$out/gpu-tests-summary.txt" 2>/dev/null
tar -cJf "$out/gpu-tests-logs.tar.xz" -C "$out" tests && rm -rf "$out/tests"
timeout 200 .bin/ficco soak --gpus 4 --iters 5 --time-limit 150 > "$out/soak.txt" 2>&1; echo "soak exit $?" >> "$out/soak.txt"
