#!/usr/bin/env bash
# A/B of the engine bench between base commits and the working tree, in one device call: runs
# alternate base(s), tree, base(s), tree... on one machine, so a clock change or another machine's speed
# falls on both (the box's H100s differ by up to 15% between calls, and one commit's runs within a
# call by as much: compare within a call, pairs against pairs).
#
# Here:          bash bench/ab.sh prepare BASE [BASE2...]   (.scratch/base, .scratch/base2...: git
#                                   worktrees without docs/, fixtures and drills, ~4 MB each to carry)
# On the box:    bash bench/ab.sh run BASE[,BASE2...] HEAD [PAIRS] [bench flags...]
#                (carry [".gpu", ".scratch/base", ...]; makes /tmp/m.gguf unless it is there; each
#                round runs every base in order, then the tree; writes $OUT/engine-<n>-<sha>.json
#                and prints each run's tok/s lines and open seconds)
# Default flags: --only engine --pp 64 --concurrency 4 --tg-at 0 --drafts 0 --no-split --slots 1
# --runs 3 --deadline-s 60 (about 55 s a run on an H100): three timed runs a figure, since one
# process's runs agreed within 3% on the H100 where single runs scattered by 30% on an H200;
# PAIRS (rounds) defaults to 2. The device carries 64 MiB: carry .gpu without peers.tar.xz
# (.gpu/setup.sh, .gpu/debs, .gpu/deno.xz, .gpu/node_modules.tar.xz) beside two bases or more.
set -uo pipefail

case ${1:-} in
prepare)
  [ $# -ge 2 ] || { echo "usage: bash bench/ab.sh prepare BASE [BASE2...]" >&2; exit 2; }
  shift
  n=1
  for base in "$@"; do
    dir=.scratch/base$([ $n -gt 1 ] && echo $n)
    git worktree remove --force $dir 2>/dev/null
    git worktree prune
    git worktree add -f $dir "$base" >/dev/null || exit 1
    rm -rf $dir/docs $dir/tests/fixtures $dir/tests/drills $dir/deploy
    echo "$dir: $(git -C $dir rev-parse --short HEAD), $(du -sh $dir | cut -f1)"
    n=$((n + 1))
  done
  ;;
run)
  bases=${2:?usage: bash bench/ab.sh run BASE[,BASE2...] HEAD [PAIRS] [flags]}
  head=${3:?usage: bash bench/ab.sh run BASE[,BASE2...] HEAD [PAIRS] [flags]}
  pairs=${4:-2}
  shift $(($# < 4 ? $# : 4))
  IFS=, read -ra shas <<<"$bases"
  dirs=()
  for i in "${!shas[@]}"; do
    dir=.scratch/base$([ $i -gt 0 ] && echo $((i + 1)))
    [ -d $dir ] || { echo "no $dir: run 'bash bench/ab.sh prepare ${shas[*]}' here and carry it" >&2; exit 2; }
    dirs+=("$dir")
  done
  shas+=("$head")
  dirs+=(.)
  source .gpu/setup.sh
  export NO_COLOR=1
  out=${OUT:-/tmp/ab}
  mkdir -p "$out"
  for dir in "${dirs[@]}"; do [ "$dir" = . ] || ln -sfn "$PWD/node_modules" $dir/node_modules; done
  if [ ! -s /tmp/m.gguf ]; then
    $DENO run -A tools/make_model.ts --preset qwen35moe-35b --arch qwen35moe --quant iq4_xs \
      --out /tmp/m.gguf >/tmp/make.txt 2>&1 && sync || { tail -5 /tmp/make.txt; exit 1; }
  fi
  flags=(--only engine --pp 64 --concurrency 4 --tg-at 0 --drafts 0 --no-split --slots 1 --runs 3
    --deadline-s 60)
  [ $# -gt 0 ] && flags=("$@")
  n=0
  for ((p = 0; p < pairs; p++)); do
    for i in "${!shas[@]}"; do
      n=$((n + 1))
      dir=${dirs[$i]} sha=${shas[$i]}
      json="$out/engine-$n-$sha.json"
      (cd $dir && timeout 90 $DENO task bench --model /tmp/m.gguf --gpu dawn "${flags[@]}" \
        --commit "$sha" --json "$json" --plot /tmp/ab.svg >/tmp/ab-$n.txt 2>&1)
      echo "run $n: $sha, exit $?, opened in $(grep -o '"openSeconds": *[0-9.]*' "$json" | grep -o '[0-9.]*$') s"
      grep -E '^\[bench\] (pp|tg)' /tmp/ab-$n.txt | sed 's/, median of.*//'
    done
  done
  ;;
*)
  echo "usage: bash bench/ab.sh prepare BASE [BASE2...] | run BASE[,BASE2...] HEAD [PAIRS] [bench flags...]" >&2
  exit 2
  ;;
esac
