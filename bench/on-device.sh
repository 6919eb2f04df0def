# Sourced at the top of a device call's script (bench/data/*/callN.sh), from
# the repo root on the GPU machine: the environment every command there
# needs, the binaries carried as .bin/pack.tar.xz (bench/build-bin.sh, then
# packed) unpacked, and the wheel installed with the working tree's Python
# files over it (so Python-only changes need no rebuild).
#   source bench/on-device.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
if [ -f .bin/pack.tar.xz ]; then
  tar -xJf .bin/pack.tar.xz -C .bin && rm .bin/pack.tar.xz
fi
pip install -q --no-deps --target /tmp/pynew .bin/ficco-*.whl > /dev/null 2>&1
cp python/ficco/*.py /tmp/pynew/ficco/
export PYTHONPATH=/tmp/pynew
