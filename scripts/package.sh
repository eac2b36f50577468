#!/usr/bin/env bash
# Builds Huddle's Debian packages (cmake/HuddlePackage.cmake) into BUILD_DIR/packages/:
#
#   scripts/package.sh [BUILD_DIR]     (default: build)
#
# A BUILD_DIR already configured (by scripts/test.sh or scripts/build.sh) is refreshed and its
# shipped targets built; a new one is configured as a Release build without tests. The package
# version names the git revision the binaries were built from (huddle --version prints it).
# Prints each package with its size, Installed-Size and Depends. PACKAGE_NO_BUILD=1 packages a
# built BUILD_DIR as it is (CTest's package_install).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-${BUILD_DIR:-build}}"
JOBS="${JOBS:-$(nproc)}"
for tool in cpack dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || { echo "package: $tool is missing (scripts/setup.sh test)" >&2; exit 2; }
done

if [ "${PACKAGE_NO_BUILD:-0}" = "1" ]; then
  # CTest's package_install: the build is done (and other tests run from it); package only.
  [ -x "$BUILD_DIR/cli/huddle" ] || { echo "package: $BUILD_DIR is not built" >&2; exit 2; }
elif [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake "$BUILD_DIR" >/dev/null
else
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DHUDDLE_BUILD_TESTS=OFF \
    -DHUDDLE_BUILD_BENCH=OFF >/dev/null
fi
# The targets the packages hold (their install rules); not the tests.
targets=(huddle huddle_client_sdk)
for optional in huddle_cuda huddle_client_python; do
  if cmake --build "$BUILD_DIR" --target help | grep -q "^\.\.\. $optional\$"; then
    targets+=("$optional")
  fi
done
if [ "${PACKAGE_NO_BUILD:-0}" != "1" ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
fi
rm -rf "$BUILD_DIR/packages"
(cd "$BUILD_DIR" && cpack -G DEB >cpack.log 2>&1) || {
  cat "$BUILD_DIR/cpack.log" >&2
  echo "package: cpack failed (log above)" >&2
  exit 1
}
for deb in "$BUILD_DIR"/packages/*.deb; do
  printf '%s  %s KiB (installed %s KiB)\n  Depends: %s\n' "$(basename "$deb")" \
    "$(( $(stat -c %s "$deb") / 1024 ))" "$(dpkg-deb -f "$deb" Installed-Size)" \
    "$(dpkg-deb -f "$deb" Depends)"
done
