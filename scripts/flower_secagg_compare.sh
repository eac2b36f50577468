#!/usr/bin/env bash
# Issue 21's peer figure: what secure aggregation costs a round under Flower's SecAgg+ and under
# Huddle's, at the same sizes (100 clients, 1M parameters, SecAgg+ with k = 24 neighbours and
# t = 13), each beside its own plain round in the same run. scripts/flower/secagg_compare.py has
# the method; docs/peers/flower.md the results. Since issue 31 Huddle's side draws its own graph
# (certified protocol: ~40 expected neighbours, t = 11 at 100 members); k and t set Flower's only.
#
#   scripts/flower_secagg_compare.sh                  # Huddle and Flower's simulation engine
#   ONLY="flower-deploy-plain flower-deploy-secagg" scripts/flower_secagg_compare.sh
#   CLIENTS=10 ROUNDS=2 NEIGHBOURS=8 THRESHOLD=3 scripts/flower_secagg_compare.sh   # a smoke run
#
# Tooling only, never a dependency of Huddle: flwr[simulation] (Ray) in the script-made virtualenv
# .venv-flower (FLOWER_VENV=DIR elsewhere), as scripts/flower_compare.sh makes it. Needs a Huddle
# build with benchmarks (scripts/build.sh -DHUDDLE_BUILD_BENCH=ON: build/bench/coordinator_rss).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOWER_VENV:-$ROOT/.venv-flower}"
FLWR_VERSION=1.42.0
NUMPY_VERSION=1.26.4
PYTHON=/usr/bin/python3
[[ -x "$ROOT/build/bench/coordinator_rss" ]] ||
  { echo "flower_secagg_compare: build/bench/coordinator_rss is missing (see the header)" >&2; exit 2; }
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv --system-site-packages "$VENV"
if ! "$VENV/bin/python" - "$FLWR_VERSION" "$NUMPY_VERSION" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
assert md.version("flwr") == sys.argv[1] and md.version("numpy") == sys.argv[2]
import ray  # noqa: F401
PY
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "flwr[simulation]==$FLWR_VERSION" "numpy==$NUMPY_VERSION"
fi
ARGS=(--out "${OUT:-$ROOT/runs/flower_secagg}" --clients "${CLIENTS:-100}" --rounds "${ROUNDS:-3}"
      --neighbours "${NEIGHBOURS:-24}" --threshold "${THRESHOLD:-13}")
[[ -n "${ONLY:-}" ]] && ARGS+=(--only "$ONLY")
exec nice "$VENV/bin/python" "$ROOT/scripts/flower/secagg_compare.py" "${ARGS[@]}"
