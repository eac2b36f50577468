#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained federated model: installs the Debian
# packages, builds Huddle, and runs a coordinator plus 10 client processes on 127.0.0.1 training an
# MLP on Fashion-MNIST (examples/fashion_mnist.yaml). Outputs land in runs/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh quickstart
# The huddle binary alone (not the client SDK's library or its Python module), without debug
# information: GCC's code is the same with or without -g, and the build and run took 274 s
# instead of 386 s on a fresh 2-core machine (scripts/test.sh builds with -g again).
BUILD_DIR="${BUILD_DIR:-build}" BUILD_TARGETS=huddle scripts/build.sh -DHUDDLE_BUILD_TESTS=OFF \
  -DHUDDLE_BUILD_BENCH=OFF -DHUDDLE_SANITIZE=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG"
exec "${BUILD_DIR:-build}/cli/huddle" run examples/fashion_mnist.yaml --out "${OUT:-runs/quickstart}"
