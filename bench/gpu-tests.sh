#!/usr/bin/env bash
# Runs every GPU test executable in .bin/ (see bench/build-bin.sh) on this
# machine's GPUs. Usage, on the GPU machine from the repo root:
#   bash bench/gpu-tests.sh OUTDIR      (logs: OUTDIR/<binary>.log, OUTDIR/summary.txt)
#
# GPU tests are #[ignore]d ("needs a GPU"), so that a `cargo test` without a
# GPU lists them as ignored, never as passed; here every binary runs with
# --include-ignored. A test that needs N > 1 GPUs ends its name in `_Ngpus`
# (`_2gpus`, `_4gpus`): where this machine has fewer GPUs (`nvidia-smi -L`,
# or the entries of CUDA_VISIBLE_DEVICES when set; FICCO_TEST_GPUS=N
# overrides), the script passes `--skip _Ngpus`, and libtest counts those
# tests as filtered out. A GPU test that runs without its GPUs fails, saying
# what to skip; FICCO_REQUIRE_GPU=1 also fails the few tests that run on any
# machine (`open_matches_the_environment`) where they find no GPU. The NCCL
# variables keep NVLink multicast off.
#
# Each binary runs under a timeout of TEST_TIMEOUT seconds (default 120).
# At the end, one line per binary and one overall: passed, failed, ignored
# and filtered out (from libtest's `test result:` line), and wall seconds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FICCO_REQUIRE_GPU=1
export FICCO_BIN=${FICCO_BIN:-$PWD/.bin/ficco}
out=${1:-/tmp/ficco-gpu-tests}
limit=${TEST_TIMEOUT:-120}
mkdir -p "$out"

gpus=${FICCO_TEST_GPUS:-}
if [ -z "$gpus" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    [ "$visible" -lt "$gpus" ] && gpus=$visible
  fi
fi
skip=()
for n in $(seq 2 16); do
  [ "$n" -le "$gpus" ] || skip+=(--skip "_${n}gpus")
done
echo "# $gpus GPUs: tests named _Ngpus with N > $gpus are left out (--skip); timeout $limit s per binary"

# The count before `what` in a `test result:` line.
count() { sed -nE "s/.* ([0-9]+) $2.*/\1/p" <<<"$1"; }

status=0
rows=()
ms_all=0 p_all=0 f_all=0 i_all=0 x_all=0 no_result=0
for t in .bin/test-*; do
  name=$(basename "$t")
  log="$out/$name.log"
  echo "== $t"
  t0=$(date +%s%N)
  # (No `|| true` after the pipeline: with pipefail it would run and reset
  # PIPESTATUS, reporting a failed binary as exit 0.)
  timeout -k 10 "$limit" "$t" --include-ignored ${skip[@]+"${skip[@]}"} --test-threads=1 2>&1 | tee "$log" |
    grep -E "^test |test result|panicked"
  rc=${PIPESTATUS[0]}
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "== $t exit $rc"
  [ "$rc" -eq 0 ] || status=1
  # The binary's own result is its last `test result:` line: the tests that
  # run ranks as child processes of the binary print theirs before it ends.
  # A binary killed by the timeout or a signal printed none of its own.
  result=$(grep -E '^test result:' "$log" | tail -1)
  if [ -n "$result" ] && { [ "$rc" -eq 0 ] || [ "$rc" -eq 101 ]; }; then
    p=$(count "$result" passed) f=$(count "$result" failed)
    i=$(count "$result" ignored) x=$(count "$result" 'filtered out')
    p_all=$((p_all + p)) f_all=$((f_all + f)) i_all=$((i_all + i)) x_all=$((x_all + x))
  else
    p=- f=- i=- x=-
    no_result=$((no_result + 1))
  fi
  case $rc in
    0) verdict=ok ;;
    101) verdict=FAILED ;;
    124 | 137) verdict="TIMEOUT (over $limit s)" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  ms_all=$((ms_all + ms))
  rows+=("$(printf '%-22s %7s %7s %8s %9s %6d.%d  %s' "$name" "$p" "$f" "$i" "$x" $((ms / 1000)) $((ms % 1000 / 100)) "$verdict")")
done

overall=ok
[ "$status" -eq 0 ] || overall=FAILED
[ "$no_result" -eq 0 ] || overall="$overall ($no_result without a result of their own)"
{
  echo
  echo "# summary: $gpus GPUs, commit $(cat .bin/COMMIT 2>/dev/null || echo '?')"
  printf '%-22s %7s %7s %8s %9s %8s  %s\n' binary passed failed ignored filtered seconds result
  printf '%s\n' "${rows[@]}"
  printf '%-22s %7s %7s %8s %9s %6d.%d  %s\n' all "$p_all" "$f_all" "$i_all" "$x_all" \
    $((ms_all / 1000)) $((ms_all % 1000 / 100)) "$overall"
} | tee "$out/summary.txt"
exit $status
