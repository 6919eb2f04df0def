#!/usr/bin/env bash
# Builds ficco and every ficco-cuda test executable here (the GPU machine has
# no Rust toolchain) and copies them into .bin/ (git-ignored), to be carried
# to the GPU machine: `run` with carry [".bin"], then `bash bench/gpu-tests.sh $OUT`.
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
git rev-parse --short HEAD > .bin/COMMIT
