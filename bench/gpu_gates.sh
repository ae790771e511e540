#!/usr/bin/env bash
# The engine's gates on a real GPU, for the GPU box: the GPU test suite once per provider (Dawn
# twice: as it runs by default, and with its tensor cores on, TANDEM_MMA=1), then
# greedy ids of `small` models across dawn, builtin, the float64 reference and a 2-stage chain
# (head on dawn, worker on builtin).
#
# Usage (device run, carry [".gpu"]): source .gpu/setup.sh && bash bench/gpu_gates.sh
# Logs go to $OUT (or /tmp/gates); the last lines printed are the summary table.
# PRESET=tiny LAYERS=4 runs the same checks on the tiny models (a quick check off the box).
set -uo pipefail
export NO_COLOR=1
out=${OUT:-/tmp/gates}
mkdir -p "$out" models
deno=${DENO:-deno}
preset=${PRESET:-small}
layers=${LAYERS:-8}
cut=$((layers / 2))
summary=()

for run in dawn dawn-mma builtin; do
  start=$(date +%s)
  gpu=${run%-mma}
  mma=$([ "$run" = dawn-mma ] && echo 1 || echo 0)
  TANDEM_GPU=$gpu TANDEM_MMA=$mma timeout 250 "$deno" test -A --parallel tests/gpu_*_test.ts \
    >"$out/suite-$run.log" 2>&1
  rc=$?
  line=$(grep -E '^(ok|FAILED) \|' "$out/suite-$run.log" | tail -1)
  summary+=("suite $run: rc=$rc ${line:-no result line} ($(($(date +%s) - start)) s)")
done

prompt="The river keeps its own counsel, and the stones remember every flood."
for spec in "qwen35moe f32" "qwen35moe q4_k_m" "qwen3next f32" "qwen35 mixed"; do
  set -- $spec
  arch=$1 quant=$2
  model=models/$preset-$arch-$quant.gguf
  "$deno" run -A tools/make_model.ts --preset "$preset" --arch "$arch" --quant "$quant" \
    --out "$model" >/dev/null 2>>"$out/make.log" || { summary+=("$arch $quant: make-model failed"); continue; }
  run() { "$deno" run -A tools/generate.ts --model "$model" --prompt "$prompt" --n 48 --json \
    --ignore-eos "$@" 2>>"$out/generate.log" | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p'; }
  ref=$(run --backend reference)
  dawn=$(run --gpu dawn)
  builtin=$(run --gpu builtin)
  wlog="$out/worker-$arch-$quant.log"
  "$deno" task worker --model "$model" --layers "$cut:$layers" --port 7811 --gpu builtin \
    >"$wlog" 2>&1 &
  worker=$!
  for _ in $(seq 60); do grep -q "listening" "$wlog" && break; sleep 1; done
  split=$(run --gpu dawn --layers "0:$cut" --next 127.0.0.1:7811)
  kill $worker 2>/dev/null
  wait $worker 2>/dev/null
  same() { [ -n "$1" ] && [ "$1" = "$ref" ] && echo same || echo DIFFERENT; }
  summary+=("$arch $quant: reference ${ref:0:40}... | dawn $(same "$dawn") | builtin $(same "$builtin") | split $(same "$split")")
  {
    echo "$arch $quant"
    echo "  reference $ref"
    echo "  dawn      $dawn"
    echo "  builtin   $builtin"
    echo "  split     $split"
  } >>"$out/ids.txt"
done

printf '%s\n' "${summary[@]}"
