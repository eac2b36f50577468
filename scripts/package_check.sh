#!/usr/bin/env bash
# Huddle from its packages on a fresh Debian 12: builds the .debs (scripts/package.sh), makes a
# minimal Debian root (debootstrap --variant=minbase), installs the CPU packages there with apt
# (apt resolves their Depends from Debian's archive: a missing Depends fails here), provisions a
# server, three sites and an operator (huddle provision), installs each kit as its README says,
# boots the root with systemd (systemd-nspawn), starts huddle.service and huddle-agent@SITE.service,
# submits a one-round job with the operator's kit and waits for it to finish.
#
#   scripts/package_check.sh [BUILD_DIR]        (default: build; as root, with Debian's mirror)
#
# It also checks every package's Depends (no -dev package, no build tool, no CUDA outside
# huddle-cuda), that the version names the binary's revision, `systemd-analyze verify` and
# `systemd-analyze security` on the installed units, that the units run as non-root users, and the
# restart policy (a crash restarts an agent, a configuration error does not); it writes an OCI image
# of the minbase + huddle root (umoci, when installed) and runs its huddle once unpacked; and it
# prints the figures of issue 35: the time from nothing to the first round, and the installed size
# of the huddle package's closure over minbase.
# CTest runs it (package_install, label package). KEEP_ROOT=1 keeps the root for a look.
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="$(cd "${1:-$SOURCE_DIR/build}" && pwd)"
T0=$(date +%s.%N)
EXTRA=0  # seconds of the checks that a plain installation does not do (the figure leaves them out)
extra_since() { EXTRA="$(python3 -c "import sys; print(float(sys.argv[1]) + float(sys.argv[3]) - float(sys.argv[2]))" "$EXTRA" "$1" "$(date +%s.%N)")"; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$T0" "$(date +%s.%N)"; }
log() { echo "[$(elapsed) s] $*"; }
fail() {
  echo "package_check: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || { echo "package_check: SKIP: needs root (debootstrap, systemd-nspawn)"; exit 77; }
for tool in debootstrap systemd-nspawn systemd-analyze dpkg-deb; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/setup.sh test installs it)"
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/huddle_package.XXXXXX")"
ROOT="$WORK/root"
NSPAWN_PID=""
cleanup() {
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
  fi
  if [ "${KEEP_ROOT:-0}" = "1" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# 1. The packages.
log "building the packages (scripts/package.sh $BUILD_DIR)"
"$SOURCE_DIR/scripts/package.sh" "$BUILD_DIR" | tee "$WORK/packages.txt"
PKG="$BUILD_DIR/packages"
deb_of() { ls "$PKG"/"$1"_*.deb 2>/dev/null | head -1; }
for name in huddle libhuddle-client0 libhuddle-client-dev; do
  [ -n "$(deb_of "$name")" ] || fail "no $name package in $PKG"
done

extra_since "$T0"  # building the packages is not installing them
# 2. Their Depends: computed from the binaries, runtime libraries only.
t_extra="$(date +%s.%N)"
for deb in "$PKG"/*.deb; do
  name="$(dpkg-deb -f "$deb" Package)"
  depends="$(dpkg-deb -f "$deb" Depends)"
  [ -n "$depends" ] || fail "$name has no Depends"
  IFS=',' read -ra deps <<<"$depends"
  for dep in "${deps[@]}"; do
    dep_name="$(echo "$dep" | awk '{print $1}')"
    case "$dep_name" in
      *-dev) fail "$name depends on the -dev package $dep_name" ;;
      gcc* | g++* | cpp* | cmake* | make | clang* | binutils* | nvidia-cuda-toolkit | cuda-toolkit*)
        fail "$name depends on the build tool $dep_name" ;;
    esac
    if [ "$name" != huddle-cuda ]; then
      case "$dep_name" in
        *cuda* | *cublas* | *nccl* | *nvidia*) fail "$name (a CPU package) depends on $dep_name" ;;
      esac
    fi
  done
done
version="$(dpkg-deb -f "$(deb_of huddle)" Version)"
if [ -n "$(deb_of huddle-cuda)" ]; then
  dpkg-deb -f "$(deb_of huddle-cuda)" Depends | grep -q "huddle (= $version)" ||
    fail "huddle-cuda does not depend on huddle (= $version)"
fi
for deb in "$PKG"/*.deb; do
  [ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "$(basename "$deb") is not version $version"
done
log "Depends checked: no -dev package, no build tool, CUDA only in huddle-cuda; version $version"

extra_since "$t_extra"
# 3. A fresh minimal Debian 12, then the CPU packages with apt (Depends resolved from the archive).
log "debootstrap --variant=minbase bookworm"
debootstrap --variant=minbase bookworm "$ROOT" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
  >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap failed"; }
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
in_root() { chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
in_root dpkg-query -W -f='${Package} ${Installed-Size}\n' | sort >"$WORK/minbase.txt"
mkdir -p "$ROOT/tmp/debs"
cp "$(deb_of huddle)" "$ROOT/tmp/debs/"
log "apt-get install ./$(basename "$(deb_of huddle)") (in the root)"
in_root apt-get update -qq >/dev/null
in_root apt-get install -y -qq --no-install-recommends /tmp/debs/"$(basename "$(deb_of huddle)")" \
  >"$WORK/apt_huddle.log" 2>&1 || { tail -30 "$WORK/apt_huddle.log"; fail "apt could not install huddle"; }
in_root dpkg-query -W -f='${Package} ${Installed-Size}\n' | sort >"$WORK/with_huddle.txt"
added_kib="$(comm -13 "$WORK/minbase.txt" "$WORK/with_huddle.txt" | awk '{s += $2} END {print s}')"
added_pkgs="$(comm -13 "$WORK/minbase.txt" "$WORK/with_huddle.txt" | wc -l)"
huddle_kib="$(dpkg-deb -f "$(deb_of huddle)" Installed-Size)"
log "huddle's closure over minbase: $added_pkgs packages, $((added_kib / 1024)) MiB installed (huddle itself $((huddle_kib / 1024)) MiB)"
comm -13 "$WORK/minbase.txt" "$WORK/with_huddle.txt" | sort -k2 -n -r | head -12 | sed 's/^/    /'
for tool in cc gcc g++ cmake make nvcc; do
  if in_root sh -c "command -v $tool" >/dev/null 2>&1; then fail "installing huddle brought $tool"; fi
done
installed_version="$(in_root huddle --version)"
echo "  $installed_version"
revision="${version#*+git}"
revision="${revision#*.}"
revision="${revision%.dirty}"
[[ "$installed_version" == *"git $revision"* ]] || fail "huddle --version ($installed_version) is not the package's revision ($version)"
# An OCI image of this root (minbase and the huddle package, apt's lists and caches dropped),
# built offline with umoci, then unpacked again and run: no container engine runs here.
t_extra="$(date +%s.%N)"
if command -v umoci >/dev/null; then
  log "OCI image (umoci) of minbase + huddle"
  cp -a "$ROOT" "$WORK/image-root"
  rm -rf "$WORK/image-root/var/lib/apt/lists"/* "$WORK/image-root/var/cache/apt"/*.bin \
    "$WORK/image-root/tmp/debs" "$WORK/image-root/etc/resolv.conf"
  tag="${version//+/_}"
  umoci init --layout "$WORK/oci"
  umoci new --image "$WORK/oci:$tag"
  umoci unpack --image "$WORK/oci:$tag" "$WORK/bundle" >/dev/null
  rm -rf "$WORK/bundle/rootfs"
  mv "$WORK/image-root" "$WORK/bundle/rootfs"
  umoci repack --image "$WORK/oci:$tag" "$WORK/bundle"
  umoci config --image "$WORK/oci:$tag" --author "Huddle" --config.entrypoint /usr/bin/huddle \
    --config.cmd=--help --config.user 65534:65534 --config.workingdir /var/lib/huddle \
    --config.volume /etc/huddle --config.volume /var/lib/huddle \
    --config.exposedports 5555/tcp --config.exposedports 9464/tcp \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.title=huddle"
  umoci gc --layout "$WORK/oci"
  mkdir -p "$BUILD_DIR/packages"
  tar -C "$WORK/oci" -cf "$BUILD_DIR/packages/huddle-oci_${version}_amd64.tar" .
  rm -rf "$WORK/bundle"
  umoci unpack --image "$WORK/oci:$tag" "$WORK/check" >/dev/null
  image_version="$(chroot --userspec=65534:65534 "$WORK/check/rootfs" /usr/bin/huddle --version)"
  [ "$image_version" = "$installed_version" ] || fail "the image's huddle --version: $image_version"
  echo "  huddle-oci_${version}_amd64.tar: $(( $(stat -c %s "$BUILD_DIR/packages/huddle-oci_${version}_amd64.tar") / 1048576 )) MiB, runs: $image_version"
  rm -rf "$WORK/check" "$WORK/oci"
fi
for deb in libhuddle-client0 python3-huddle-client; do
  [ -n "$(deb_of "$deb")" ] && cp "$(deb_of "$deb")" "$ROOT/tmp/debs/"
done
log "apt-get install the SDK's runtime package and the Python binding"
sdk_debs=()
for deb in "$ROOT"/tmp/debs/libhuddle-client0_*.deb "$ROOT"/tmp/debs/python3-huddle-client_*.deb; do
  [ -f "$deb" ] && sdk_debs+=("/tmp/debs/$(basename "$deb")")
done
in_root apt-get install -y -qq --no-install-recommends "${sdk_debs[@]}" \
  >"$WORK/apt_sdk.log" 2>&1 || { tail -30 "$WORK/apt_sdk.log"; fail "apt could not install the SDK packages"; }
if [ -n "$(deb_of python3-huddle-client)" ]; then
  in_root python3 -c 'import huddle_client; print("  python3: huddle_client", huddle_client.__version__, huddle_client.build_revision())'
fi

extra_since "$t_extra"
# 4. systemd in the root, to boot it (every real host has it; not part of huddle's closure).
log "apt-get install systemd (to boot the root)"
in_root apt-get install -y -qq --no-install-recommends systemd systemd-sysv dbus >"$WORK/apt_systemd.log" 2>&1 ||
  { tail -20 "$WORK/apt_systemd.log"; fail "apt could not install systemd"; }
for unit in huddle.service huddle-agent@.service; do
  [ -f "$ROOT/usr/lib/systemd/system/$unit" ] || [ -f "$ROOT/lib/systemd/system/$unit" ] ||
    fail "the huddle package has no $unit"
done

# 5. Kits for a server, three sites and an operator; each installed as its README says.
read -r AGENTS_PORT OPERATORS_PORT HTTP_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
mkdir -p "$ROOT/usr/share/datasets"
cp -r /usr/share/datasets/fashion-mnist "$ROOT/usr/share/datasets/"
chmod -R a+rX "$ROOT/usr/share/datasets"
cat >"$ROOT/root/project.yaml" <<YAML
project: package-check
server:
  address: 127.0.0.1
  port: $AGENTS_PORT
  operator_bind: tcp://127.0.0.1:$OPERATORS_PORT
  http_bind: 127.0.0.1:$HTTP_PORT
sites:
  site-a: {datasets: {fmnist: {path: /usr/share/datasets/fashion-mnist, partition: iid, num_shards: 3, shard: 0}}}
  site-b: {datasets: {fmnist: {path: /usr/share/datasets/fashion-mnist, partition: iid, num_shards: 3, shard: 1}}}
  site-c: {datasets: {fmnist: {path: /usr/share/datasets/fashion-mnist, partition: iid, num_shards: 3, shard: 2}}}
operators: [alice]
YAML
log "huddle provision project.yaml --out kits/ (in the root)"
in_root sh -c 'cd /root && huddle provision project.yaml --out kits' >"$WORK/provision.log" 2>&1 ||
  { cat "$WORK/provision.log"; fail "huddle provision failed"; }
in_root mkdir -p /etc/huddle
for kit in server site-a site-b site-c operator-alice; do
  [ -f "$ROOT/root/kits/$kit.tar.gz" ] || fail "no kit $kit.tar.gz"
  in_root tar -xzf "/root/kits/$kit.tar.gz" -C /etc/huddle --no-same-owner
done
for key in "$ROOT"/etc/huddle/keys/server.key "$ROOT"/etc/huddle/agents/*/*.key; do
  [ "$(stat -c %a "$key")" = 600 ] || fail "$key is mode $(stat -c %a "$key"), not 0600"
done
cat >"$ROOT/root/job.yaml" <<'YAML'
name: package-check
seed: 1
rounds: 1
model: {kind: mlp, hidden: [32]}
train: {epochs: 1, batch_size: 32, learning_rate: 0.02, momentum: 0.9}
cohort: {sampling: fixed, size: 3}
round: {deadline_s: 120, quorum: 3}
evaluation: {every: 1}
coordinator: {min_clients: 3, wait_for_clients_s: 120}
data: {name: fmnist}
YAML

# 6. Boot the root with systemd and start the units.
log "systemd-nspawn --boot"
systemd-nspawn -D "$ROOT" --register=no --keep-unit --boot >"$WORK/boot.log" 2>&1 &
NSPAWN_PID=$!
init_pid=""
for _ in $(seq 1 100); do
  init_pid="$(pgrep -P "$NSPAWN_PID" -x systemd || true)"
  [ -n "$init_pid" ] && break
  sleep 0.2
done
[ -n "$init_pid" ] || { tail -20 "$WORK/boot.log"; fail "the root did not boot"; }
in_box() { nsenter -t "$init_pid" -a env LC_ALL=C "$@"; }
for _ in $(seq 1 150); do
  state="$(in_box systemctl is-system-running 2>/dev/null || true)"
  case "$state" in running | degraded) break ;; esac
  sleep 0.2
done
log "booted ($state)"
t_extra="$(date +%s.%N)"
in_box systemd-analyze verify /usr/lib/systemd/system/huddle.service \
  /usr/lib/systemd/system/huddle-agent@site-a.service 2>&1 | tee "$WORK/verify.txt"
[ ! -s "$WORK/verify.txt" ] || fail "systemd-analyze verify reported the above"
echo "  systemd-analyze verify: no findings"
for unit in huddle.service huddle-agent@site-a.service; do
  echo "  systemd-analyze security $unit: $(in_box systemd-analyze security --no-pager "$unit" | tail -1)"
done
extra_since "$t_extra"
in_box systemctl enable --now huddle.service huddle-agent@site-a.service huddle-agent@site-b.service \
  huddle-agent@site-c.service >/dev/null 2>&1 || true
OPERATOR=(--service "tcp://127.0.0.1:$OPERATORS_PORT" --server-key /etc/huddle/operators/alice/server.pub
  --key /etc/huddle/operators/alice/alice.key)
submitted=0
for _ in $(seq 1 100); do
  if in_box huddle submit /root/job.yaml "${OPERATOR[@]}" >"$WORK/submit.txt" 2>&1; then
    submitted=1
    break
  fi
  sleep 0.3
done
if [ "$submitted" != 1 ]; then
  cat "$WORK/submit.txt"
  in_box systemctl --no-pager status huddle.service 'huddle-agent@*' | tail -40
  fail "huddle submit failed"
fi
log "job submitted"
first_round=""
state=""
for _ in $(seq 1 600); do
  read -r state round < <(in_box huddle status package-check --json "${OPERATOR[@]}" 2>/dev/null |
    python3 -c 'import json, sys
try:
    j = json.load(sys.stdin)
    j = j.get("job", j)
    print(j.get("state", "?"), (j.get("last_round") or {}).get("round", 0))
except Exception:
    print("? 0")' || echo "? 0")
  if [ -z "$first_round" ] && [ "${round:-0}" -ge 1 ]; then
    first_round="$(python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(elapsed)" "$EXTRA")"
    log "first round done: $first_round s from nothing (debootstrap, apt, provision, boot, units, submit; without this script's ${EXTRA%.*} s of packaging and checks)"
  fi
  case "$state" in completed | failed | stopped) break ;; esac
  sleep 0.5
done
log "job $state"
if [ "$state" != completed ]; then
  in_box journalctl --no-pager -u huddle.service -u 'huddle-agent@*' | tail -60
  fail "the job did not complete (state: $state)"
fi
for unit in huddle.service huddle-agent@site-a.service huddle-agent@site-b.service huddle-agent@site-c.service; do
  [ "$(in_box systemctl is-active "$unit")" = active ] || fail "$unit is not active"
  user="$(in_box systemctl show -p User --value "$unit")"
  pid="$(in_box systemctl show -p MainPID --value "$unit")"
  uid="$(in_box awk '/^Uid:/ {print $2}' "/proc/$pid/status")"
  [ "$uid" != 0 ] || fail "$unit runs as root"
done
echo "  units active, each as its own dynamic user (not root)"

# 7. The restart policy follows the exit codes: a crash restarts, a configuration error does not.
in_box sh -c "kill -SEGV $(in_box systemctl show -p MainPID --value huddle-agent@site-c.service)"
restarted=""
for _ in $(seq 1 100); do
  if [ "$(in_box systemctl show -p NRestarts --value huddle-agent@site-c.service)" = 1 ] &&
    [ "$(in_box systemctl is-active huddle-agent@site-c.service)" = active ]; then
    restarted=1
    break
  fi
  sleep 0.2
done
[ -n "$restarted" ] || fail "huddle-agent@site-c was not restarted after a crash (SIGSEGV)"
echo "  a crashed agent (SIGSEGV) was restarted"
in_box mkdir -p /etc/huddle/agents/typo
in_box cp /etc/huddle/agents/site-a/site-a.key /etc/huddle/agents/typo/typo.key
in_box sh -c 'sed "s/^coordinator:/coordinatr:/" /etc/huddle/agents/site-a/agent.yaml >/etc/huddle/agents/typo/agent.yaml'
in_box systemctl start huddle-agent@typo.service || true
for _ in $(seq 1 50); do
  [ "$(in_box systemctl is-active huddle-agent@typo.service)" = failed ] && break
  sleep 0.2
done
sleep 6  # past RestartSec: a restart would have happened by now
typo_status="$(in_box systemctl show -p ExecMainStatus --value huddle-agent@typo.service)"
typo_restarts="$(in_box systemctl show -p NRestarts --value huddle-agent@typo.service)"
[ "$typo_status" = 2 ] && [ "$typo_restarts" = 0 ] ||
  fail "an agent with a configuration error: exit status $typo_status, $typo_restarts restarts (want 2, 0)"
echo "  an agent with a configuration error exited 2 and was not restarted: $(in_box journalctl --no-pager -o cat -u huddle-agent@typo.service | grep -m1 'huddle agent')"
in_box systemctl stop huddle-agent@site-a.service huddle-agent@site-b.service huddle-agent@site-c.service huddle.service
for unit in huddle.service huddle-agent@site-a.service; do
  result="$(in_box systemctl show -p Result --value "$unit")"
  [ "$result" = success ] || fail "$unit stopped with result $result"
done
log "PASS: packages installed with apt on minbase, kits provisioned, units started, one round trained (first round at ${first_round:-?} s)"
