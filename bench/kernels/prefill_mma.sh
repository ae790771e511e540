#!/usr/bin/env bash
# The tensor-core products on the GPU box in one device run: their GPU tests (and the f32 products'
# beside them) on Dawn, then bench/kernels/prefill_mma.ts at 512 and 2048 tokens; the bench's
# closing table is printed last.
#
# Usage (device run, carry [".gpu"]): source .gpu/setup.sh && bash bench/kernels/prefill_mma.sh
# Full logs and the bench's JSON go to $OUT (or /tmp/mma). Extra arguments go to the bench.
set -uo pipefail
export NO_COLOR=1
out=${OUT:-/tmp/mma}
mkdir -p "$out"
deno=${DENO:-deno}

TANDEM_GPU=dawn timeout 300 "$deno" test -A tests/gpu_mma_test.ts tests/gpu_mma_wgsl_test.ts \
  tests/gpu_mul_mat_test.ts >"$out/tests.txt" 2>&1
echo "tests (Dawn) rc=$?: $(grep -E '^(ok|FAILED) \|' "$out/tests.txt" | tail -1)"
grep -E '\.\.\. FAILED|^error' "$out/tests.txt" | head -20

timeout 420 "$deno" run -A --node-modules-dir=manual bench/kernels/prefill_mma.ts --gpu dawn \
  --out "$out/prefill_mma.json" "$@" >"$out/bench.txt" 2>&1
rc=$?
echo "bench rc=$rc"
[ $rc -ne 0 ] && tail -20 "$out/bench.txt"
grep -E '^(GPU|subgroup matrices)' "$out/bench.txt"
# Every variant that failed its check, then the closing table.
grep -E ' (wrong|rejected|bits differ|token [0-9]+ alone)' "$out/bench.txt" | head -20
sed -n '/^shape /,$p' "$out/bench.txt"
