#!/usr/bin/env bash
# Builds ficco and every ficco-cuda test executable here (the GPU machine has
# no Rust toolchain) and copies them into .bin/ (git-ignored), to be carried
# to the GPU machine: `run` with carry [".bin"], then `bash bench/gpu-tests.sh $OUT`.
# With maturin on the PATH (`pip install maturin`) it also builds the Python
# wheel (abi3: any CPython >= 3.9) into .bin/; there `pip install --no-deps
# .bin/ficco-*.whl` gives `import ficco` beside the PyTorch already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p .bin
rm -f .bin/test-*
cp target/release/ficco .bin/
{ cargo test --release --no-run -p ficco-cuda --message-format=json
  cargo test --release --no-run --test gpu_cli --message-format=json; } 2>/dev/null |
  python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        shutil.copy(m["executable"], ".bin/test-" + name)
        print(".bin/test-" + name)
'
rm -f .bin/ficco-*.whl
if command -v maturin >/dev/null; then
  # `--compatibility linux`: no manylinux audit; the wheel runs where the
  # binaries above run (same glibc floor), which is all .bin/ is for.
  (cd python && CARGO_TARGET_DIR="$PWD/../target" \
    maturin build --release --compatibility linux -o ../.bin/ 2>&1 | tail -1)
else
  echo "build-bin: maturin not on PATH, no Python wheel (pip install maturin)" >&2
fi
git rev-parse --short HEAD > .bin/COMMIT
