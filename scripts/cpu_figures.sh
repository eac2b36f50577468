#!/usr/bin/env bash
# Issue 19's one-process CPU figures: SGD steps of the MLPs 784-256-128-10 (batch 64 and 128) and
# 784-2048-2048-10 (batch 64), and of examples/fashion_mnist_cnn.yaml's CNN (batch 64), ours
# (bench/train_bench.cc's BM_MlpStep and BM_CnnStep/0, through TrainModel) against PyTorch's eager
# step (scripts/bench_torch.py --mlp-steps, --cnn-steps), one thread each, run back to back on this
# machine, once per CPU instruction set of our kernels this CPU runs (HUDDLE_CPU_ISA,
# kernels/cpu_isa.h).
# Prints examples/s and ours/PyTorch ratios (> 1: ours is faster); ROUNDS alternations of the two
# programs, the median of each. Run it on a quiet machine (`uptime`).
#
# Needs a Python with PyTorch (Debian: apt-get install python3-torch; tooling, not in setup.sh)
# and, for the usual baseline, OpenBLAS (apt-get install libopenblas0-pthread).
#
#   bash scripts/cpu_figures.sh            # BUILD_DIR=build ROUNDS=3 PYTHON=python3
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ROUNDS="${ROUNDS:-3}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  PYTHON=/usr/bin/python3  # Debian's python3-torch, where another python3 comes first on PATH
fi
"$PYTHON" -c "import torch" || { echo "no PyTorch for $PYTHON" >&2; exit 1; }
[[ -d "$BUILD_DIR" ]] || cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target train_bench >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
uptime
# The sets this CPU runs (kernels/cpu_isa.cc's checks, from /proc/cpuinfo's flags).
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
isas=(baseline)
if has avx2 fma; then isas+=(avx2); fi
if has avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl; then isas+=(avx512); fi
# Google Benchmark's JSON -> lines "<who> <case> <batch> <examples/s>".
parse='
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    parts = b["name"].split("/")
    if parts[0] == "BM_CnnStep":
        print(sys.argv[1], "cnn", 64, round(b["items_per_second"], 1))
    else:
        h1, h2, batch = parts[1:4]
        print(sys.argv[1], f"784-{h1}-{h2}-10", batch, round(b["items_per_second"], 1))
'
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$ROUNDS"); do
  for isa in "${isas[@]}"; do
    HUDDLE_CPU_ISA=$isa "$BUILD_DIR/bench/train_bench" --benchmark_filter='BM_MlpStep|BM_CnnStep/0' \
      --benchmark_format=json 2>/dev/null |
      "$PYTHON" -c "$parse" "huddle-$isa" >>"$results"
  done
  "$PYTHON" scripts/bench_torch.py --device cpu --threads 1 --mlp-steps --repetitions 1 |
    grep '^mlp_step' | sed 's/^mlp_step/torch/' >>"$results"
  "$PYTHON" scripts/bench_torch.py --device cpu --threads 1 --cnn-steps --repetitions 1 |
    grep '^cnn_step sgd' | sed 's/^cnn_step sgd/torch cnn/' >>"$results"
done
"$PYTHON" - "$results" "${isas[@]}" <<'PY'
import collections, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    who, case, batch, rate = line.split()
    rates[(who, case, int(batch))].append(float(rate))
med = {k: statistics.median(v) for k, v in rates.items()}
isas = sys.argv[2:]
print(f"{'case':28} {'torch ex/s':>11}" + "".join(f" {isa + ' ex/s':>12} {'ratio':>6}" for isa in isas))
for (who, case, batch), torch in sorted((k, v) for k, v in med.items() if k[0] == "torch"):
    row = f"{case + ' batch ' + str(batch):28} {torch:11.0f}"
    for isa in isas:
        ours = med.get(("huddle-" + isa, case, batch), float("nan"))
        row += f" {ours:12.0f} {ours / torch:6.2f}"
    print(row)
PY
