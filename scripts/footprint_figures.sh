#!/usr/bin/env bash
# The shipped `huddle` binary's footprint (docs/deployment.md, "Memory"): which shared libraries it
# names, then build/bench/coordinator_rss in both transport modes (--help peak RSS, idle
# coordinator RSS, and the coordinator's peak RSS with 100 client processes and a 1M-parameter
# model against the budget 64 MiB + (6 + upload slots) x model). Extra arguments go to
# coordinator_rss (e.g. --clients 8 --hidden 12620: a 10M-parameter model).
#   BUILD_DIR=build HUDDLE=build/cli/huddle scripts/footprint_figures.sh [--clients 100 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
HUDDLE="${HUDDLE:-$BUILD_DIR/cli/huddle}"
cmake --build "$BUILD_DIR" --target huddle coordinator_rss >/dev/null

echo "== shared libraries $HUDDLE names (NEEDED)"
readelf -d "$HUDDLE" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/  \1/p'
if readelf -d "$HUDDLE" | grep -Eq 'libcuda|libcublas|libnccl'; then
  echo "  (links CUDA libraries)"
else
  echo "  (no CUDA library; the CUDA plugin is loaded only for device: cuda)"
fi
for encrypted in 0 1; do
  echo "== coordinator_rss --encrypted $encrypted"
  "$BUILD_DIR/bench/coordinator_rss" --huddle "$HUDDLE" --encrypted "$encrypted" "$@"
done
