#!/usr/bin/env bash
# Call 5: where the block loses the harness's saving, site by site
# (--site-times: events around each call in the block), beside the harness
# in the same call, at 8192 and 2048 tokens, P = 4, eager. Binaries of call 1.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
for t in 8192 2048; do
  timeout 200 bash bench/oppath.sh "$out/oppath" 4 $t --mode eager --site-times > "$out/oppath-$t.txt" 2>&1
done
tar -cJf "$out/oppath.tar.xz" -C "$out/oppath" . && rm -rf "$out/oppath"
