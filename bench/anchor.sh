#!/usr/bin/env bash
# The anchor harness: PyTorch (sequential + async-TP) and ficco on the same
# suite in one device call, merged into one markdown table.
# Usage, from the repo root on the GPU machine:
#   bench/anchor.sh SUITE OUTDIR [FICCO_BINARY]
# Writes OUTDIR/torch.jsonl, OUTDIR/ficco-pN.json (every schedule measured, one per GPU count),
# OUTDIR/evaluate-pN.{json,txt} (the selectors scored on that same sweep, llama3-70b held out),
# OUTDIR/ficco.err and OUTDIR/RESULTS.md. TORCH_TIMEOUT / FICCO_TIMEOUT (seconds, default 240 / 400 per GPU count) bound each part.
# HOLDOUT: the model family scored apart (default llama3-70b where the suite has it).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
suite=$1
out=$2
bin=${3:-.bin/ficco}
mkdir -p "$out"
timeout "${TORCH_TIMEOUT:-240}" python3 bench/anchor.py torch "$suite" "$out/torch.jsonl" 2>&1 | tail -n 3
# The held-out family: HOLDOUT, else llama3-70b where the suite has it (an
# absent one would stop the scoring).
holdout=${HOLDOUT-}
if [ -z "${HOLDOUT+x}" ] && grep -q '^name = "llama3-70b' "$suite"; then holdout=llama3-70b; fi
files=()
split=$(mktemp -d)
for p in $(python3 bench/anchor.py split "$suite" "$split"); do
  # One sweep: `evaluate --suite` measures every schedule (what `explore --backend gpu --json`
  # does), saves it, and scores the selectors on it.
  timeout "${FICCO_TIMEOUT:-400}" "$bin" evaluate --backend gpu --suite "$split/suite-p$p.toml" \
    ${holdout:+--holdout "$holdout"} --save "$out/ficco-p$p.json" --json "$out/evaluate-p$p.json" \
    >"$out/evaluate-p$p.txt" 2>>"$out/ficco.err"
  echo "ficco P=$p: exit $? ($(wc -c <"$out/ficco-p$p.json") bytes of JSON)"
  cat "$out/evaluate-p$p.txt"
  files+=("$out/ficco-p$p.json")
done
tail -n 5 "$out/ficco.err"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
count=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
commit=$(cat .bin/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 bench/anchor.py report "$out/torch.jsonl" "$(IFS=,; echo "${files[*]}")" --device "${count}x $device" --commit "$commit" >"$out/RESULTS.md"
cat "$out/RESULTS.md"
