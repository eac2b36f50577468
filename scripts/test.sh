#!/usr/bin/env bash
# Installs, builds and runs the whole CTest suite (unit + integration; gpu tests skip themselves
# without a GPU). Then builds the tests again with ASan+UBSan and runs them there too, unless
# HUDDLE_SKIP_SANITIZE=1. Last, fuzzes the wire decoder and update validator for a minute
# (scripts/fuzz.sh: clang, libFuzzer, ASan+UBSan), unless HUDDLE_SKIP_FUZZ=1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
JOBS="${JOBS:-$(nproc)}"

# Options are explicit: build/ may hold a cache from quickstart.sh, which builds without tests.
BUILD_DIR=build scripts/build.sh -DHUDDLE_BUILD_TESTS=ON -DHUDDLE_BUILD_BENCH=ON -DHUDDLE_SANITIZE=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g -DNDEBUG"
(cd build && ctest --output-on-failure --no-tests=error -j "$JOBS" --timeout 300)

if [ "${HUDDLE_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== ASan + UBSan =="
  # -O1, as AddressSanitizer recommends (its compile is 30% shorter than -O2's: the sanitized
  # build is CI's longest step), and line tables only (-g1): file:line in reports.
  BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo scripts/build.sh \
    -DHUDDLE_SANITIZE=ON -DHUDDLE_BUILD_TESTS=ON -DHUDDLE_BUILD_BENCH=OFF -DHUDDLE_ENABLE_CUDA=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  # Every test but the heavy examples: their paths (training, the coordinator, secure
  # aggregation, DP, the datacenter job) run sanitized in the unit and integration tests, and
  # the examples themselves run unsanitized above. Under ASan each took 70-100 s (the
  # ScatterNet's 5 minutes, distributed DP's 300 clients 110 s), 6-7 minutes of CI together.
  # The quickstart's example and the two small DP examples still run here.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --no-tests=error -j "$JOBS" --timeout 600 \
       -E 'ExamplesTest.*/(datacenter|fashion_mnist_cnn|dp_sgd|dp_distributed|dirichlet|simulation|secure_aggregation)')
fi

if [ "${HUDDLE_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== libFuzzer: codec + update check =="
  scripts/fuzz.sh 60
fi
