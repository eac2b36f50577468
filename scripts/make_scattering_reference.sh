#!/usr/bin/env bash
# Regenerates tests/data/scattering_reference.json: kymatio's Scattering2D on the inputs
# tests/kernels/scattering_test.cc builds, the reference our transform (kernels/scattering.h) is
# checked against.
#
#   scripts/make_scattering_reference.sh         # creates .venv-scattering/ on first use
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCATTERING_VENV:-$ROOT/.venv-scattering}"
PYTHON="${PYTHON:-python3}"

# Pinned: the reference file records these versions. scipy < 1.15: kymatio 0.3 imports
# scipy.special.sph_harm, which 1.15 removed.
KYMATIO_VERSION=0.3.0
NUMPY_VERSION=2.2.6
SCIPY_VERSION=1.14.1

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet \
  "numpy==$NUMPY_VERSION" "scipy==$SCIPY_VERSION" "kymatio==$KYMATIO_VERSION"
"$VENV/bin/python" "$ROOT/scripts/scattering_reference.py" \
  --out "$ROOT/tests/data/scattering_reference.json" "$@"
