#!/usr/bin/env bash
# Issue 20's peer figure: the same PyTorch job (MODEL=cnn: examples/fashion_mnist_cnn.yaml's CNN;
# MODEL=mlp: the quickstart's MLP, examples/fashion_mnist.yaml; both 10 IID clients, 1 local
# epoch, batch 32, lr 0.02, momentum 0.9, FedAvg, server evaluation on the 10k test set every
# round) under Flower's deployment engine and under Huddle, measured one run at a time under
# `nice`. Both frameworks' PyTorch clients run examples/pytorch_client/torch_model.py.
# docs/peers/flower.md has the results, the method and what differs.
#
#   scripts/flower_compare.sh                       # 5 rounds, 1 repetition, all available columns
#   MODEL=mlp ROUNDS=10 scripts/flower_compare.sh   # the quickstart's job
#   ROUNDS=10 REPEAT=2 scripts/flower_compare.sh    # runs alternate: Huddle, Flower, Huddle, ...
#   ONLY="flower-deploy huddle-builtin" scripts/flower_compare.sh
#   SIMULATION=1 scripts/flower_compare.sh          # also Flower's simulation engine (installs Ray)
#
# Columns (ONLY picks some): huddle-pytorch (examples/pytorch_client/run.sh: `huddle coordinator`
# and 10 Python clients through the huddle_client binding), flower-deploy (flower-superlink + 10
# flower-supernode + `flwr run`, --insecure on 127.0.0.1), huddle-builtin (`huddle run`, built-in
# C++ clients, CurveZMQ as by default), and with SIMULATION=1 flower-sim (reference only: not a
# process federation).
#
# Tooling only, never a dependency of Huddle: flwr lives in a script-made virtualenv, .venv-flower
# (FLOWER_VENV=DIR elsewhere), made with --system-site-packages over Debian's /usr/bin/python3 so
# that Debian's python3-torch (1.13.1) is used. numpy is pinned to 1.26.4 in the venv: flwr 1.42
# needs numpy >= 1.26 (Debian 12 has 1.24.2), and numpy 2 would break torch 1.13's numpy bridge.
#
# Needs: a Huddle build (scripts/build.sh; build/cli/huddle and, for huddle-pytorch, the
# huddle_client module in build/client/python), Debian's python3-torch, python3-venv and
# dataset-fashion-mnist, and PyPI for the venv. Outputs: OUT (default runs/flower_compare)/
# <column>-<i>/result.json and logs, and OUT/table.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOWER_VENV:-$ROOT/.venv-flower}"
OUT="${OUT:-$ROOT/runs/flower_compare}"
ROUNDS="${ROUNDS:-5}"
MODEL="${MODEL:-cnn}"
REPEAT="${REPEAT:-1}"
SIMULATION="${SIMULATION:-0}"
ONLY="${ONLY:-huddle-pytorch flower-deploy huddle-builtin}"
[[ "$SIMULATION" == 1 && "$ONLY" != *flower-sim* ]] && ONLY="$ONLY flower-sim"

# Pinned: docs/peers/flower.md records these versions; bump them together with the figures.
FLWR_VERSION=1.42.0
NUMPY_VERSION=1.26.4

PYTHON=/usr/bin/python3  # Debian's: python3-torch and python3-numpy belong to it
for need in "$PYTHON" "$ROOT/build/cli/huddle" /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz; do
  [[ -e "$need" ]] || { echo "flower_compare: $need is missing (see the header)" >&2; exit 2; }
done
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "flower_compare: Debian's python3-torch is missing (apt-get install python3-torch)" >&2; exit 2; }

# The virtualenv.
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
EXTRA=""
[[ "$ONLY" == *flower-sim* ]] && EXTRA="[simulation]"
if ! "$VENV/bin/python" - "$FLWR_VERSION" "$NUMPY_VERSION" "$EXTRA" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
assert md.version("flwr") == sys.argv[1] and md.version("numpy") == sys.argv[2]
if sys.argv[3]:
    import ray  # noqa: F401
PY
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "flwr${EXTRA}==$FLWR_VERSION" "numpy==$NUMPY_VERSION"
fi
"$VENV/bin/python" -c 'import flwr, torch, numpy; torch.from_numpy(numpy.zeros(1))' ||
  { echo "flower_compare: the venv's flwr/torch/numpy do not work together" >&2; exit 1; }

mkdir -p "$OUT"
# A snapshot of the huddle binary: the build tree may be rebuilt while this runs. `huddle run`
# starts its coordinator and clients from its own path (/proc/self/exe), so they use it too.
cp "$ROOT/build/cli/huddle" "$OUT/huddle"
# Likewise the PyTorch example (a script edited while bash runs it breaks), run from OUT/examples/
# with PYTHONPATH=build/client/python (the huddle_client module) set by the driver.
rm -rf "$OUT/examples/pytorch_client"
mkdir -p "$OUT/examples"
cp -r "$ROOT/examples/pytorch_client" "$OUT/examples/pytorch_client"

DRIVER=(nice -n 10 "$VENV/bin/python" "$ROOT/scripts/flower/compare.py")
run_column() {  # SUBCOMMAND ARGS...
  "${DRIVER[@]}" "$1" --model "$MODEL" --rounds "$ROUNDS" "${@:2}"
}
{
  echo "date: $(date -u +%FT%TZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "debian: python3-torch $(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null), python3-numpy $(dpkg-query -W -f='${Version}' python3-numpy 2>/dev/null)"
  echo "python: $("$PYTHON" --version 2>&1); torch $("$PYTHON" -c 'import torch; print(torch.__version__)'); flwr $("$VENV/bin/python" -c 'import flwr; print(flwr.__version__)'); venv numpy $("$VENV/bin/python" -c 'import numpy; print(numpy.__version__)')"
  echo "model: $MODEL; rounds: $ROUNDS; repetitions: $REPEAT; columns: $ONLY"
} | tee "$OUT/setup.txt"

results=()
for ((i = 1; i <= REPEAT; ++i)); do
  for col in $ONLY; do
    dir="$OUT/$col-$i"
    echo "== $col (repetition $i): $dir"
    case "$col" in
      huddle-pytorch)
        run_column huddle-pytorch --out "$dir" --huddle "$OUT/huddle" \
          --example-dir "$OUT/examples/pytorch_client" ;;
      flower-deploy) run_column flower-deploy --out "$dir" ;;
      flower-sim) run_column flower-sim --out "$dir" ;;
      huddle-builtin) run_column huddle-builtin --out "$dir" --huddle "$OUT/huddle" ;;
      *) echo "flower_compare: unknown column '$col'" >&2; exit 2 ;;
    esac
    results+=("$dir/result.json")
  done
done

if ((${#results[@]})); then
  "$VENV/bin/python" "$ROOT/scripts/flower/compare.py" table "${results[@]}" | tee "$OUT/table.md"
fi
