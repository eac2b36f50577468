#!/usr/bin/env bash
# The client SDK on an edge node: a minimal Debian 12 root (debootstrap --variant=minbase) that
# holds only the SDK's runtime packages (no compiler, no CMake, no CUDA toolkit, no -dev package),
# the installed libhuddle_client.so and the embed_client example built on this machine, runs two
# clients of a federation whose coordinator runs on this host (the chroot shares its network).
#
#   scripts/edge_install_check.sh [BUILD_DIR]    (default: build, built; as root)
#
# The first run downloads the minimal root (about 200 MB; EDGE_ROOT, default /tmp/huddle-edge-root,
# is kept for the next run). It prints the packages the edge root had to install and passes when
# both clients finish the job and it accepted both updates every round. A figure script, not a
# CI test: it needs root and the Debian mirror.
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="$(cd "${1:-$SOURCE_DIR/build}" && pwd)"
ROOT="${EDGE_ROOT:-/tmp/huddle-edge-root}"
DATA=/usr/share/datasets/fashion-mnist
# libhuddle_client.so's runtime libraries, as `ldd` + `dpkg -S` name their packages (Debian 12).
RUNTIME_PACKAGES=(libzmq5 libsodium23 libssl3 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10
  libfmt9 libgloo0 zlib1g)
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/huddle_edge.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  umount "$ROOT/proc" 2>/dev/null || true
}
trap cleanup EXIT
fail() {
  echo "edge_install_check: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap and chroot)"

# 1. A minimal Debian 12 root, then the runtime packages alone.
if [ ! -x "$ROOT/bin/sh" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  echo "== debootstrap --variant=minbase bookworm $ROOT"
  debootstrap --variant=minbase bookworm "$ROOT" http://deb.debian.org/debian >"$SCRATCH/debootstrap.log"
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
mount -t proc proc "$ROOT/proc"
chroot "$ROOT" dpkg-query -W -f='${Package}\n' | sort >"$SCRATCH/before.txt"
echo "== apt-get install ${RUNTIME_PACKAGES[*]} (in the edge root)"
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${RUNTIME_PACKAGES[@]}" >"$SCRATCH/apt.log"
chroot "$ROOT" dpkg-query -W -f='${Package}\n' | sort >"$SCRATCH/after.txt"
added="$(comm -13 "$SCRATCH/before.txt" "$SCRATCH/after.txt" | tr '\n' ' ')"
echo "packages on top of minbase: ${added:-none (installed by an earlier run)}"
for tool in cc gcc g++ c++ clang cmake make ld nvcc; do
  if chroot "$ROOT" sh -c "command -v $tool" >/dev/null 2>&1; then
    fail "the edge root has $tool: it is not a runtime-only machine"
  fi
done
[ ! -e "$ROOT/usr/local/cuda" ] || fail "the edge root has /usr/local/cuda"
if chroot "$ROOT" dpkg-query -W -f='${Package}\n' | grep -- '-dev$'; then
  fail "the edge root has -dev packages (above)"
fi

# 2. The installed SDK and the example built against it (on this machine), copied in.
echo "== install and build examples/embed_client"
cmake --install "$BUILD_DIR" --prefix "$SCRATCH/prefix" >"$SCRATCH/install.log"
cmake -S "$SOURCE_DIR/examples/embed_client" -B "$SCRATCH/example" \
  -DCMAKE_PREFIX_PATH="$SCRATCH/prefix" -DCMAKE_BUILD_TYPE=Release >"$SCRATCH/configure.log"
cmake --build "$SCRATCH/example" -j 2 >"$SCRATCH/build.log"
rm -rf "$ROOT/opt/huddle" "$ROOT/data"
mkdir -p "$ROOT/opt/huddle/lib" "$ROOT/opt/huddle/bin" "$ROOT/data"
find "$SCRATCH/prefix" -name 'libhuddle_client.so*' -exec cp -a {} "$ROOT/opt/huddle/lib/" \;
strip --strip-debug "$ROOT/opt/huddle/lib/libhuddle_client.so.0."*
cp "$SCRATCH/example/embed_client" "$ROOT/opt/huddle/bin/"
cp "$DATA"/*-ubyte.gz "$ROOT/data/"
edge=(chroot "$ROOT" env LD_LIBRARY_PATH=/opt/huddle/lib)
if "${edge[@]}" ldd /opt/huddle/bin/embed_client | grep 'not found'; then
  fail "a library of embed_client is missing on the edge root (above)"
fi
"${edge[@]}" /opt/huddle/bin/embed_client --version
echo "libhuddle_client.so on the edge: $(du -h "$ROOT"/opt/huddle/lib/libhuddle_client.so.0.* | cut -f1)"

# 3. A federation: the coordinator here, two clients in the edge root.
port=$((20000 + RANDOM % 40000))
timeout -k 10 300 "$BUILD_DIR/cli/huddle" coordinator \
  --config "$SOURCE_DIR/examples/embed_client/job.yaml" \
  --bind "tcp://127.0.0.1:$port" --out "$SCRATCH/out" --insecure >"$SCRATCH/coordinator.log" 2>&1 &
coordinator=$!
pids+=("$coordinator")
clients=()
for shard in 0 1; do
  timeout -k 10 300 "${edge[@]}" /opt/huddle/bin/embed_client \
    --coordinator "tcp://127.0.0.1:$port" --insecure --client-id "edge-$shard" --data /data \
    --shard "$shard" --num-shards 2 --give-up-after-s 60 >"$SCRATCH/client-$shard.log" 2>&1 &
  clients+=($!)
  pids+=($!)
done
for shard in 0 1; do
  wait "${clients[$shard]}" || { tail -20 "$SCRATCH/client-$shard.log"; fail "edge client $shard"; }
done
wait "$coordinator" || { tail -20 "$SCRATCH/coordinator.log"; fail "the coordinator failed"; }
grep -c '"results":2,' "$SCRATCH/out/metrics.jsonl" | grep -qx 2 ||
  { cat "$SCRATCH/out/metrics.jsonl"; fail "a round did not accept both edge clients' updates"; }
grep -o '"test_accuracy":[0-9.]*' "$SCRATCH/out/metrics.jsonl" | tail -n 1
echo "edge_install_check: PASS (outputs in $SCRATCH)"
