#!/usr/bin/env bash
# The client SDK as a user gets it (CTest: embed_client_example, label example):
#   1. installs the build tree into a fresh prefix (`cmake --install`) and checks its layout;
#   2. checks that libhuddle_client.so exports the public API of huddle/client/*.h and nothing else;
#   3. builds examples/embed_client, a standalone project, against the installed package alone
#      (find_package(Huddle) with CMAKE_PREFIX_PATH=PREFIX) and checks that it loads
#      libhuddle_client.so from the prefix;
#   4. runs a federation with it: the installed `huddle coordinator` (MLP 784-32-10, 2 rounds,
#      2 clients, --insecure on 127.0.0.1) and two embed_client processes, each on its half of
#      Fashion-MNIST. It passes when the job exits 0, every round accepted both updates and the
#      test accuracy ends above 0.5.
#
#   scripts/test_embed_client.sh [BUILD_DIR]     (default: build; it must be built)
#
# Environment: CXX, the compiler to build the example with (CTest passes the project's);
# EMBED_CXX_FLAGS, extra compile and link flags for it (the sanitizers of a sanitized build);
# KEEP=1 keeps the scratch directory. Exit status: 0 passed, 77 skipped (Fashion-MNIST is not
# installed), anything else failed. Every step has a deadline; every process started here is
# killed on exit.
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="$(cd "${1:-$SOURCE_DIR/build}" && pwd)"
DATA=/usr/share/datasets/fashion-mnist
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/huddle_embed_client.XXXXXX")"
PREFIX="$SCRATCH/prefix"
EXAMPLE_BUILD="$SCRATCH/example"
pids=()

cleanup() {
  local rc=$?
  # Each process runs under `timeout -k`, which passes the TERM on and kills what outlives it.
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" -eq 0 ] && [ "${KEEP:-0}" != "1" ]; then
    rm -rf "$SCRATCH"
  else
    echo "test_embed_client: outputs kept in $SCRATCH"
  fi
}
trap cleanup EXIT

fail() {
  echo "test_embed_client: FAIL: $*" >&2
  exit 1
}

# Prints a file's last lines, for a failure's context.
show() {
  for f in "$@"; do
    [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 40 "$f"; }
  done
  return 0
}

# 1. Install.
echo "== install $BUILD_DIR into $PREFIX"
timeout 120 cmake --install "$BUILD_DIR" --prefix "$PREFIX" >"$SCRATCH/install.log" ||
  { show "$SCRATCH/install.log"; fail "cmake --install failed"; }
[ -x "$PREFIX/bin/huddle" ] || fail "no bin/huddle in the prefix"
for header in client.h trainer.h; do
  [ -f "$PREFIX/include/huddle/client/$header" ] || fail "no include/huddle/client/$header"
done
if [ -f "$BUILD_DIR/cli/libhuddle_cuda.so" ]; then
  # LIBDIR/huddle/, where the installed binary looks relative to itself (kernels/cuda_plugin.h).
  [ -n "$(find "$PREFIX" -path '*/lib*/huddle/libhuddle_cuda.so')" ] ||
    fail "the CUDA plugin is not installed in LIBDIR/huddle/"
fi
config="$(find "$PREFIX" -path '*/cmake/Huddle/HuddleConfig.cmake' | head -n 1)"
[ -n "$config" ] || fail "no lib*/cmake/Huddle/HuddleConfig.cmake in the prefix"
for f in HuddleConfigVersion.cmake HuddleTargets.cmake; do
  [ -f "$(dirname "$config")/$f" ] || fail "no $f beside $config"
done
library="$(find "$PREFIX" -name 'libhuddle_client.so.0' | head -n 1)"
[ -n "$library" ] || fail "no libhuddle_client.so.0 in the prefix"
[ -e "${library%.0}" ] || fail "no libhuddle_client.so link beside $library"

# 2. The library's exports: the public API and nothing else (client/sdk.map).
echo "== exports of $library"
nm -DC --defined-only "$library" >"$SCRATCH/exports.txt"
grep -q ' huddle::client::Run(huddle::client::Trainer&, huddle::client::ClientOptions const&)' \
  "$SCRATCH/exports.txt" || { cat "$SCRATCH/exports.txt"; fail "huddle::client::Run is not exported"; }
grep -q ' huddle::client::Version()' "$SCRATCH/exports.txt" ||
  { cat "$SCRATCH/exports.txt"; fail "huddle::client::Version is not exported"; }
# The version node (an absolute symbol) aside, every export names huddle::client.
if grep -v ' A HUDDLE_CLIENT_' "$SCRATCH/exports.txt" | grep -v 'huddle::client::' >"$SCRATCH/stray.txt"; then
  cat "$SCRATCH/stray.txt"
  fail "libhuddle_client.so exports symbols outside huddle::client (above)"
fi
echo "$(wc -l <"$SCRATCH/exports.txt") exported symbols, all in huddle::client"

# 3. The example, against the installed package alone.
echo "== build examples/embed_client against $PREFIX"
configure=(cmake -S "$SOURCE_DIR/examples/embed_client" -B "$EXAMPLE_BUILD"
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release -DCMAKE_COMPILE_WARNING_AS_ERROR=ON)
[ -n "${CXX:-}" ] && configure+=(-DCMAKE_CXX_COMPILER="$CXX")
if [ -n "${EMBED_CXX_FLAGS:-}" ]; then
  configure+=(-DCMAKE_CXX_FLAGS="$EMBED_CXX_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$EMBED_CXX_FLAGS")
fi
timeout 120 "${configure[@]}" >"$SCRATCH/configure.log" 2>&1 ||
  { show "$SCRATCH/configure.log"; fail "configuring the example failed"; }
timeout 300 cmake --build "$EXAMPLE_BUILD" -j 2 >"$SCRATCH/build.log" 2>&1 ||
  { show "$SCRATCH/build.log"; fail "building the example failed"; }
client="$EXAMPLE_BUILD/embed_client"
resolved="$(ldd "$client" | awk '$1 ~ /^libhuddle_client\.so/ { print $3 }')"
[ -n "$resolved" ] || { ldd "$client"; fail "embed_client does not link libhuddle_client.so"; }
[ "$(readlink -f "$resolved")" = "$(readlink -f "$library")" ] ||
  fail "embed_client loads $resolved, not the installed $library"
if ldd "$client" | grep -q 'not found'; then
  ldd "$client"
  fail "a library of embed_client is not found"
fi
version="$(timeout 10 "$client" --version)"
echo "$version"
[[ "$version" == *"SDK 0.1.0"* ]] || fail "embed_client --version printed '$version'"

# 4. A federation: the installed coordinator and two embed_client processes.
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "test_embed_client: SKIPPED the federation: Fashion-MNIST is not installed" \
    "(Debian package dataset-fashion-mnist)"
  exit 77
fi
# A free loopback port: one that nothing answers on.
port=""
for _ in $(seq 1 50); do
  candidate=$((20000 + RANDOM % 40000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
    port=$candidate
    break
  fi
done
[ -n "$port" ] || fail "no free loopback port found"
endpoint="tcp://127.0.0.1:$port"
echo "== federation on $endpoint"
out="$SCRATCH/out"
timeout -k 10 300 "$PREFIX/bin/huddle" coordinator \
  --config "$SOURCE_DIR/examples/embed_client/job.yaml" --bind "$endpoint" \
  --out "$out" --insecure >"$SCRATCH/coordinator.log" 2>&1 &
coordinator=$!
pids+=("$coordinator")
clients=()
for shard in 0 1; do
  timeout -k 10 300 "$client" --coordinator "$endpoint" --insecure --client-id "site-$shard" \
    --shard "$shard" --num-shards 2 --give-up-after-s 60 >"$SCRATCH/client-$shard.log" 2>&1 &
  clients+=($!)
  pids+=($!)
done
logs=("$SCRATCH/coordinator.log" "$SCRATCH/client-0.log" "$SCRATCH/client-1.log")
for shard in 0 1; do
  rc=0
  wait "${clients[$shard]}" || rc=$?
  [ "$rc" -eq 0 ] || { show "${logs[@]}"; fail "embed_client site-$shard exited $rc"; }
done
rc=0
wait "$coordinator" || rc=$?
[ "$rc" -eq 0 ] || { show "${logs[@]}"; fail "the coordinator exited $rc"; }

# Every round accepted both updates; the test accuracy rose above 0.5.
metrics="$out/metrics.jsonl"
[ "$(wc -l <"$metrics")" -eq 2 ] || { cat "$metrics"; fail "metrics.jsonl does not have 2 rounds"; }
while read -r line; do
  [[ "$line" == *'"results":2,'* ]] || { show "${logs[@]}"; fail "a round did not accept both updates: $line"; }
done <"$metrics"
accuracy="$(grep -o '"test_accuracy":[0-9.e+-]*' "$metrics" | tail -n 1 | cut -d: -f2)"
echo "test accuracy after 2 rounds: ${accuracy:-none}"
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a > 0.5) }' ||
  { show "${logs[@]}"; fail "the test accuracy is ${accuracy:-missing}, not above 0.5"; }
grep -q '"rounds_completed": 2' "$out/summary.json" || { cat "$out/summary.json"; fail "summary.json"; }
echo "test_embed_client: PASS"
