#!/usr/bin/env bash
# Installs the Debian packages Huddle needs, for one purpose:
#
#   scripts/setup.sh quickstart   what the quickstart builds and runs: compiler, CMake, the
#                                 libraries' -dev packages, Fashion-MNIST (scripts/quickstart.sh)
#   scripts/setup.sh test         all of the above, and what the tests, benchmarks, the fuzzer and
#                                 the packaging checks need (scripts/test.sh; the default)
#
# Idempotent: packages already present are left alone and apt is not touched at all when nothing
# is missing.
set -euo pipefail

PURPOSE="${1:-test}"

QUICKSTART=(
  build-essential cmake pkg-config
  libzmq3-dev cppzmq-dev libsodium-dev libssl-dev
  libprotobuf-dev protobuf-compiler
  libeigen3-dev libabsl-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  zlib1g-dev
  libmicrohttpd-dev
  libgloo-dev
  dataset-fashion-mnist
)

TEST=(
  git
  # scripts/fuzz.sh: libFuzzer and the thread-safety analysis
  clang libclang-rt-14-dev
  # promtool (tests/service/prometheus_test.cc checks the exposition with it; skipped without)
  prometheus
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-numpy python3-torch
  python3-venv python3-setuptools python3-wheel
  # Debian's python3-torch calls BLAS through the libblas.so.3 alternative, which is otherwise the
  # netlib reference (7x slower PyTorch MLP epochs here); OpenBLAS's OpenMP build follows
  # torch.set_num_threads. Huddle itself uses Eigen's own kernels, not BLAS.
  libopenblas0-openmp
  # huddle report's browser test renders the page in headless Chromium
  chromium
  # The packages (scripts/package.sh: cpack runs dpkg-shlibdeps and file) and their install
  # check (scripts/package_check.sh: a debootstrap root booted with systemd-nspawn, and an OCI
  # image of it made with umoci)
  dpkg-dev file debootstrap systemd-container umoci
)

case "$PURPOSE" in
  quickstart) PACKAGES=("${QUICKSTART[@]}") ;;
  test) PACKAGES=("${QUICKSTART[@]}" "${TEST[@]}") ;;
  *)
    echo "setup: unknown purpose '$PURPOSE' (quickstart or test)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages for the $PURPOSE present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup ($PURPOSE): installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
