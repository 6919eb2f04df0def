#!/usr/bin/env bash
# The call-cost benchmark (bench/call_cost.py) on P GPUs, then the same plans
# in ficco's harness, in the same device call; prints the joined table.
#   bash bench/call_cost.sh OUT P [SCHEDULES]
set -euo pipefail
out=$1; p=$2; schedules=${3:-shard-copy-ring,seq}
here=$(cd "$(dirname "$0")/.." && pwd)
ficco=${FICCO:-$here/.bin/ficco}
mkdir -p "$out"
torchrun --nproc-per-node "$p" "$here/bench/call_cost.py" --out "$out" --schedules "$schedules" 2>&1 | tee "$out/calls.log"
for s in ${schedules//,/ }; do
  "$ficco" explore --suite "$out/suite-p$p.toml" --backend gpu --schedule "$s" --json \
    >"$out/harness-$s.json" 2>"$out/harness-$s.err" || { cat "$out/harness-$s.err"; exit 1; }
done
python3 "$here/bench/call_cost.py" --summarize "$out" | tee "$out/summary.txt"
