#!/usr/bin/env bash
# Call 6: the sequential path (torch.distributed's calls) captured in a CUDA
# graph and compiled, against eager; the block at 16384 tokens, P = 4,
# eager, site by site beside the harness. Binaries of call 1.
set -u
out=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
[ -f .bin/pack.tar.xz ] && tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
timeout 120 torchrun --nproc-per-node 4 bench/seq_paths.py --tokens 2048 --json "$out/seq-2048.json" > "$out/seq-full.txt" 2>&1
echo "seq_paths: exit $?" >> "$out/seq-full.txt"
grep -E "^#|^  |exit|Error|error" "$out/seq-full.txt" | grep -v "^  _warn\|Warning" | tail -25 > "$out/seq.txt"
timeout 220 bash bench/oppath.sh "$out/oppath" 4 16384 --mode eager --site-times > "$out/oppath-16384.txt" 2>&1
tar -cJf "$out/oppath.tar.xz" -C "$out/oppath" . && rm -rf "$out/oppath"
