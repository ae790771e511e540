#!/usr/bin/env bash
# The tensor-core products on the GPU box in one device run, under 8 minutes: on Dawn their GPU
# tests, the f32 products' beside them, llama.cpp parity and the stage and scheduler gates, all with
# prompt rows on the tensor cores; on the builtin provider (no tensor cores) the products' tests and
# llama.cpp parity with the path emulated (TANDEM_MMA=emulate); then bench/kernels/prefill_mma.ts
# at 512 and 2048 tokens, every split tile and the single-product (f16) variant. Prints each
# suite's result line, any failure, the tests' measured errors and parity reports, and last the
# bench's closing table.
#
# The tensor cores are off unless TANDEM_MMA=1 (engine/gpu/dawn.ts), so this script sets it.
#
# Usage (device run, carry [".gpu"]): source .gpu/setup.sh && bash bench/kernels/prefill_mma.sh
# Full logs and the bench's JSON go to $OUT (or /tmp/mma). Extra arguments go to the bench.
set -uo pipefail
export NO_COLOR=1
out=${OUT:-/tmp/mma}
mkdir -p "$out"
deno=${DENO:-deno}

# suite NAME SECONDS ENV... -- FILES...: one deno test run, its log in $OUT/NAME.txt.
suite() {
  local name=$1 seconds=$2 start
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  start=$(date +%s)
  env "${envs[@]}" timeout "$seconds" "$deno" test -A --parallel "$@" >"$out/$name.txt" 2>&1
  echo "$name rc=$? ($(($(date +%s) - start)) s): $(grep -E '^(ok|FAILED) \|' "$out/$name.txt" | tail -1)"
  grep -E '\.\.\. FAILED|^error' "$out/$name.txt" | head -20
  grep -E 'largest relative error|[a-z0-9_-]+\.json: \{' "$out/$name.txt" | cut -c1-330
}

suite tests-dawn 150 TANDEM_GPU=dawn TANDEM_MMA=1 -- tests/gpu_mma_test.ts tests/gpu_mma_wgsl_test.ts \
  tests/gpu_mul_mat_test.ts tests/gpu_llama_parity_test.ts tests/gpu_stage_test.ts \
  tests/gpu_scheduler_test.ts
suite tests-builtin-emulated 100 TANDEM_GPU=builtin TANDEM_MMA=emulate -- tests/gpu_mma_test.ts \
  tests/gpu_llama_parity_test.ts

TANDEM_MMA=1 timeout 200 "$deno" run -A --node-modules-dir=manual bench/kernels/prefill_mma.ts --gpu dawn \
  --precision split,f16 --out "$out/prefill_mma.json" "$@" >"$out/bench.txt" 2>&1
rc=$?
echo "bench rc=$rc"
[ $rc -ne 0 ] && tail -20 "$out/bench.txt"
grep -E '^(GPU|subgroup matrices)' "$out/bench.txt"
# Every variant that failed its check, then the closing table.
grep -E ' (wrong|rejected|bits differ|token [0-9]+ alone)' "$out/bench.txt" | head -20
sed -n '/^shape /,$p' "$out/bench.txt"
