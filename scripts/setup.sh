#!/usr/bin/env bash
# Installs every Debian package Huddle needs to build, test and run the quickstart. Idempotent:
# packages already present are left alone and apt is not touched at all when nothing is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  clang libclang-rt-14-dev
  libzmq3-dev cppzmq-dev libsodium-dev libssl-dev
  libprotobuf-dev protobuf-compiler
  libeigen3-dev libabsl-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  zlib1g-dev
  libmicrohttpd-dev
  # promtool (tests/service/prometheus_test.cc checks the exposition with it; skipped without)
  prometheus
  libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-numpy python3-torch
  python3-venv python3-setuptools python3-wheel
  # Debian's python3-torch calls BLAS through the libblas.so.3 alternative, which is otherwise the
  # netlib reference (7x slower PyTorch MLP epochs here); OpenBLAS's OpenMP build follows
  # torch.set_num_threads. Huddle itself uses Eigen's own kernels, not BLAS.
  libopenblas0-openmp
  dataset-fashion-mnist
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
