#!/usr/bin/env bash
# Packs the llama.cpp peer (node-llama-cpp + its prebuilt Vulkan build) into .gpu/peers.tar.xz.
# Run here after /work/shared/device/prepare.sh; bench/decode.ts unpacks it on the GPU box.
#
# The box reaches no registry, and the carried tree must stay under 64 MiB: the llama.cpp source
# bundle (only used to build from source, never with build: "never") and source maps stay out.
set -euo pipefail
peers=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$peers/../.." && pwd)
cd "$peers"
if [ ! -f node_modules/node-llama-cpp/package.json ]; then
  # Not `npm ci`: npm leaves node-llama-cpp's optional binaries for other platforms out of the
  # lock, then `npm ci` calls the lock out of sync with package.json. `install` keeps the locked
  # versions of everything it installs.
  npm install --ignore-scripts --omit=optional --no-audit --no-fund
fi
mkdir -p "$root/.gpu"
tar -cf - --exclude='node_modules/node-llama-cpp/llama/gitRelease.bundle' --exclude='*.map' \
  node_modules | xz -T2 -6 > "$root/.gpu/peers.tar.xz"
du -sh "$root/.gpu/peers.tar.xz" "$root/.gpu"
