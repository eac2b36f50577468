#!/usr/bin/env bash
# Regenerates tests/data/privacy_reference.json: the reference values the privacy accountant tests
# compare against (Google's dp_accounting, opacus's RDP analysis, and mpmath at 50 digits).
#
#   scripts/make_privacy_reference.sh            # creates .venv-privacy/ on first use
#   PRIVACY_VENV=/some/dir scripts/make_privacy_reference.sh
#
# Needs python3 (>= 3.10) and PyPI. torch is NOT installed: opacus comes with --no-deps and the
# script loads only opacus/accountants/analysis/rdp.py (numpy/scipy) from it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PRIVACY_VENV:-$ROOT/.venv-privacy}"
PYTHON="${PYTHON:-python3}"

# Pinned: the reference file records these versions; bump them together with the data.
DP_ACCOUNTING_VERSION=0.6.0
OPACUS_VERSION=1.6.0
MPMATH_VERSION=1.3.0
NUMPY_VERSION=2.2.6
SCIPY_VERSION=1.15.3

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet \
  "numpy==$NUMPY_VERSION" "scipy==$SCIPY_VERSION" "mpmath==$MPMATH_VERSION" \
  "dp-accounting==$DP_ACCOUNTING_VERSION"
"$VENV/bin/python" -m pip install --quiet --no-deps "opacus==$OPACUS_VERSION"

"$VENV/bin/python" "$ROOT/scripts/privacy_reference.py" \
  --out "$ROOT/tests/data/privacy_reference.json" "$@"
