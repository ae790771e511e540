#!/usr/bin/env bash
# A/B of the engine bench between a base commit and the working tree, in one device call: runs
# alternate base, tree, base, tree... on one machine, so a clock change or another machine's speed
# falls on both (the box's H100s differ by up to 15% between calls, and one commit's runs within a
# call by as much: compare within a call, pairs against pairs).
#
# Here:          bash bench/ab.sh prepare BASE      (.scratch/base: a git worktree of BASE without
#                                                    docs/, fixtures and drills, ~4 MB to carry)
# On the box:    bash bench/ab.sh run BASE HEAD [PAIRS] [bench flags...]
#                (carry [".gpu", ".scratch/base"]; makes /tmp/m.gguf unless it is there; writes
#                $OUT/engine-<n>-<sha>.json and prints each run's tok/s lines and open seconds)
# Default flags: --only engine --pp 512 --concurrency 4 --tg-at 0 --drafts 0 --no-split --slots 1
# --runs 1 --deadline-s 60 (about 55 s a run on an H100); PAIRS defaults to 2.
set -uo pipefail

case ${1:-} in
prepare)
  base=${2:?usage: bash bench/ab.sh prepare BASE}
  git worktree remove --force .scratch/base 2>/dev/null
  git worktree prune
  git worktree add -f .scratch/base "$base" >/dev/null || exit 1
  rm -rf .scratch/base/docs .scratch/base/tests/fixtures .scratch/base/tests/drills \
    .scratch/base/deploy
  echo ".scratch/base: $(git -C .scratch/base rev-parse --short HEAD), $(du -sh .scratch/base | cut -f1)"
  ;;
run)
  base=${2:?usage: bash bench/ab.sh run BASE HEAD [PAIRS] [flags]}
  head=${3:?usage: bash bench/ab.sh run BASE HEAD [PAIRS] [flags]}
  pairs=${4:-2}
  shift $(($# < 4 ? $# : 4))
  [ -d .scratch/base ] || { echo "no .scratch/base: run 'bash bench/ab.sh prepare $base' here and carry it" >&2; exit 2; }
  source .gpu/setup.sh
  export NO_COLOR=1
  out=${OUT:-/tmp/ab}
  mkdir -p "$out"
  ln -sfn "$PWD/node_modules" .scratch/base/node_modules
  if [ ! -s /tmp/m.gguf ]; then
    $DENO run -A tools/make_model.ts --preset qwen35moe-35b --arch qwen35moe --quant iq4_xs \
      --out /tmp/m.gguf >/tmp/make.txt 2>&1 && sync || { tail -5 /tmp/make.txt; exit 1; }
  fi
  flags=(--only engine --pp 512 --concurrency 4 --tg-at 0 --drafts 0 --no-split --slots 1 --runs 1
    --deadline-s 60)
  [ $# -gt 0 ] && flags=("$@")
  n=0
  for ((p = 0; p < pairs; p++)); do
    for side in base head; do
      n=$((n + 1))
      if [ $side = base ]; then dir=.scratch/base sha=$base; else dir=. sha=$head; fi
      json="$out/engine-$n-$sha.json"
      (cd $dir && timeout 90 $DENO task bench --model /tmp/m.gguf --gpu dawn "${flags[@]}" \
        --commit "$sha" --json "$json" --plot /tmp/ab.svg >/tmp/ab-$n.txt 2>&1)
      echo "run $n: $side $sha, exit $?, opened in $(grep -o '"openSeconds": *[0-9.]*' "$json" | grep -o '[0-9.]*$') s"
      grep -E '^\[bench\] (pp|tg)' /tmp/ab-$n.txt | sed 's/, median of.*//'
    done
  done
  ;;
*)
  echo "usage: bash bench/ab.sh prepare BASE | run BASE HEAD [PAIRS] [bench flags...]" >&2
  exit 2
  ;;
esac
