#!/usr/bin/env bash
# Issue 5's GPU figures on a machine with an NVIDIA GPU (for example the one the `device` tool
# lends): builds Huddle with CUDA, runs the `gpu` tests (kernel parity, the loss-curve and update
# parity), then bench/kernels_bench (pipeline/copy bandwidth, DP-SGD/SGD step time) and, where
# PyTorch is installed, scripts/bench_torch.py (eager, ghost-norm and vmap DP-SGD baselines).
# Needs the packages of scripts/setup.sh already installed. Output: stdout, and $OUT/ when set.
#
#   bash scripts/gpu_figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-gpu}"
OUT="${OUT:-$BUILD_DIR/figures}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
BUILD_DIR="$BUILD_DIR" bash scripts/build.sh -DHUDDLE_ENABLE_CUDA=ON
(cd "$BUILD_DIR" && ctest -L gpu --output-on-failure -V) 2>&1 | tee "$OUT/gpu_tests.txt" |
  grep -E "loss curve|Passed|Failed|SKIPPED|tests passed|tests failed" || true
# The CUDA plugin is looked for beside the running binary (kernels/cuda_plugin.h): the bench is
# told where the build put it.
HUDDLE_CUDA_PLUGIN="$BUILD_DIR/cli/libhuddle_cuda.so" \
  "$BUILD_DIR/bench/kernels_bench" --benchmark_repetitions=3 2>&1 | tee "$OUT/kernels_bench.txt" |
  grep -E "ratio|Poisson"
if python3 -c "import torch" 2>/dev/null; then
  python3 scripts/bench_torch.py --device cuda | tee "$OUT/bench_torch.txt"
else
  echo "PyTorch is not installed here: no PyTorch baselines" | tee "$OUT/bench_torch.txt"
fi
