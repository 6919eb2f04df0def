#!/usr/bin/env bash
# The Llama block on P GPUs in every mode (eager, graphs, compile), then its
# call sites in ficco's harness on the same GPUs, and how much of the
# harness's saving the block keeps (issue 28). One token count per call:
#   bash bench/oppath.sh OUT P TOKENS [extra example arguments]
set -euo pipefail
out=$1; p=$2; tokens=$3; shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
tag="t$tokens-p$p"
torchrun --nproc-per-node "$p" "$here/examples/llama_tp_block.py" --tokens "$tokens" --mode all \
  --json "$out/block-$tag.json" "$@" >"$out/block-$tag.txt" 2>&1 || { tail -30 "$out/block-$tag.txt"; exit 1; }
grep -v '^W1126\|^\[rank\|Warning\|symm' "$out/block-$tag.txt" | grep -v '^  auto ' || true
python3 "$here/bench/block_vs_harness.py" "$out/block-$tag.json" --run "$out/harness-$tag" \
  --report "$out/harness-$tag" | tee "$out/keeps-$tag.txt"
