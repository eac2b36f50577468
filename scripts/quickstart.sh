#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained federated model: installs the Debian
# packages, builds Huddle, and runs a coordinator plus 10 client processes on 127.0.0.1 training an
# MLP on Fashion-MNIST (examples/fashion_mnist.yaml). Outputs land in runs/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh quickstart
BUILD_DIR="${BUILD_DIR:-build}" scripts/build.sh -DHUDDLE_BUILD_TESTS=OFF -DHUDDLE_BUILD_BENCH=OFF \
  -DHUDDLE_SANITIZE=OFF
exec "${BUILD_DIR:-build}/cli/huddle" run examples/fashion_mnist.yaml --out "${OUT:-runs/quickstart}"
