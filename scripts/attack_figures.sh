#!/usr/bin/env bash
# What one enrolled, hostile client costs a real coordinator (issue 18, items 1 and 6), measured on
# the shipped binary with CurveZMQ keys from `huddle keygen` and an allow-list:
#
#   (a) one enrolled key streams a never-ending multipart message for ENDLESS_S seconds (default 60;
#       it reconnects each time it is cut): the coordinator's VmRSS / VmHWM sampled every second,
#       peak against idle, and how many connections it cut;
#   (b) round time (metrics.jsonl duration_s) of a small job with 3 honest clients, without a flood
#       and while one enrolled key floods messages over 1 and over 8 connections;
#   (c) one enrolled key opens HOLD_CONNECTIONS (default 781) connections, each holding an
#       unfinished 3.75 MiB message (reconnecting when cut), during a job of 3 honest clients:
#       the coordinator's peak RSS (VmHWM), its exit code and round times, without a memory limit
#       and in a memory cgroup of 1 GiB (memory.max, or memory.limit_in_bytes on cgroup v1; needs
#       root; skipped otherwise), and its RSS once the attack has stopped.
#
# Usage: scripts/attack_figures.sh [BUILD_DIR]   (needs build/cli/huddle and build/bench/hostile_peer)
#        SECTIONS=c scripts/attack_figures.sh     (only some of the sections; default abc)
set -euo pipefail

BUILD=${1:-build}
HUDDLE=$BUILD/cli/huddle
ATTACK=$BUILD/bench/hostile_peer
ENDLESS_S=${ENDLESS_S:-60}
ROUNDS=${ROUNDS:-5}
SECTIONS=${SECTIONS:-abc}
for bin in "$HUDDLE" "$ATTACK"; do
  [[ -x $bin ]] || { echo "missing $bin: cmake --build $BUILD --target huddle hostile_peer" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/huddle_attack.XXXXXX)
PIDS=()
CGROUP=""
CGROUP_MADE=""
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  [[ -n $CGROUP_MADE ]] && rmdir "$CGROUP_MADE" 2>/dev/null
  if [[ -n ${KEEP_WORK:-} ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$2/status" 2>/dev/null || echo 0; }

# Keys: the coordinator's, honest clients c0..c2 and the attacker, all enrolled.
mkdir -p "$WORK/keys" "$WORK/allowed"
"$HUDDLE" keygen server --out "$WORK/keys" >/dev/null
for id in c0 c1 c2 mallory; do
  "$HUDDLE" keygen client --id "$id" --out "$WORK/keys" >/dev/null
  cp "$WORK/keys/$id.pub" "$WORK/allowed/"
done
# 8 rows of label + 784 features: every honest client's shard (the data does not matter here).
python3 - "$WORK/shard.csv" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    for row in range(8):
        f.write(str(row % 10) + "".join(",0.5" if (j + row) % 7 == 0 else ",0" for j in range(784)) + "\n")
EOF

job() {  # job.yaml for $1 clients, $2 rounds
  cat <<EOF
name: attack
seed: 1
rounds: $2
model: {hidden: [64]}
train: {epochs: 1, batch_size: 8, learning_rate: 0.01}
cohort: {size: $1}
round: {deadline_s: 120, quorum: $1}
evaluation: {every: 0}
coordinator: {min_clients: $1, wait_for_clients_s: 300}
security: {server_secret_key: $WORK/keys/server.key, allowed_clients: $WORK/allowed}
EOF
}

start_coordinator() {  # $1: run dir, $2: port; in the cgroup $CGROUP (a directory) if set
  CGROUP=${CGROUP:-} "$BASH" -c '[[ -z $CGROUP ]] || echo $$ >"$CGROUP/cgroup.procs"; exec "$@"' _ \
    "$HUDDLE" coordinator --config "$1/job.yaml" --bind "tcp://127.0.0.1:$2" --out "$1/out" \
    >"$1/coordinator.log" 2>&1 &
  COORD=$!
  PIDS+=("$COORD")
  for _ in $(seq 100); do grep -q "listening\|waiting" "$1/coordinator.log" 2>/dev/null && break; sleep 0.05; done
}

attack() {  # $1: run dir, $2: port, $3: mode, $4: connections, $5: seconds
  "$ATTACK" --port "$2" --server-key "$WORK/keys/server.pub" --key "$WORK/keys/mallory.key" \
    --mode "$3" --connections "$4" --seconds "$5" ${ATTACK_FLAGS:-} >"$1/attack.log" 2>&1 &
  ATTACKER=$!
  PIDS+=("$ATTACKER")
}

# (a) A never-ending message from one enrolled key.
if [[ $SECTIONS == *a* ]]; then
echo "== (a) one enrolled key streams a never-ending message for $ENDLESS_S s"
RUN=$WORK/endless; mkdir -p "$RUN"; job 2 1 >"$RUN/job.yaml"
PORT=$(free_port)
start_coordinator "$RUN" "$PORT"
sleep 2
IDLE=$(kib VmRSS "$COORD")
attack "$RUN" "$PORT" endless 1 "$ENDLESS_S"
PEAK=$IDLE; HWM=0; SAMPLES=""
while kill -0 "$ATTACKER" 2>/dev/null; do
  RSS=$(kib VmRSS "$COORD"); HWM=$(kib VmHWM "$COORD")
  (( RSS > PEAK )) && PEAK=$RSS
  SAMPLES+=" $((RSS / 1024))"
  sleep 1
done
wait "$ATTACKER" || true
kill "$COORD"; wait "$COORD" 2>/dev/null || true
echo "coordinator VmRSS per second (MiB):$SAMPLES"
printf 'idle RSS %.1f MiB; peak sampled RSS %.1f MiB; VmHWM %.1f MiB (growth %.1f MiB)\n' \
  "$(bc -l <<<"$IDLE/1024")" "$(bc -l <<<"$PEAK/1024")" "$(bc -l <<<"$HWM/1024")" \
  "$(bc -l <<<"($HWM-$IDLE)/1024")"
cat "$RUN/attack.log"
echo "coordinator log lines about cut connections: $(grep -c 'connections cut\|cut the connection' "$RUN/coordinator.log" || true)"
grep -m2 'cut the connection\|connections cut' "$RUN/coordinator.log" | cut -c1-240 || true
fi

# (b) Round time of a small job under a message flood from one enrolled key.
start_clients() {  # $1: run dir, $2: port; the three honest clients, their pids in CLIENTS
  CLIENTS=()
  for id in c0 c1 c2; do
    "$HUDDLE" client --coordinator "tcp://127.0.0.1:$2" --data "$WORK/shard.csv" --format csv \
      --device cpu --server-key "$WORK/keys/server.pub" --key "$WORK/keys/$id.key" \
      --give-up-after 60 --log-level warn >"$1/$id.log" 2>&1 &
    CLIENTS+=($!); PIDS+=($!)
  done
}
run_job() {  # $1: name (a directory name), $2: flood connections (0: none)
  local run=$WORK/$1; mkdir -p "$run"; job 3 "$ROUNDS" >"$run/job.yaml"
  local port; port=$(free_port)
  start_coordinator "$run" "$port"
  [[ $2 -gt 0 ]] && attack "$run" "$port" flood "$2" 300
  start_clients "$run" "$port"
  wait "$COORD" || echo "coordinator exited with $? (see $run/coordinator.log)"
  [[ $2 -gt 0 ]] && { kill "$ATTACKER" 2>/dev/null || true; wait "$ATTACKER" 2>/dev/null || true; }
  for c in "${CLIENTS[@]}"; do kill "$c" 2>/dev/null || true; wait "$c" 2>/dev/null || true; done
  python3 - "$run/out/metrics.jsonl" "$1" <<'EOF'
import json, statistics, sys
rounds = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = [r for r in rounds if "duration_s" in r]
d = [r["duration_s"] for r in rounds]
limited = sum(r.get("rate_limited", 0) for r in rounds)
print(f"{sys.argv[2]:>22}: {len(d)} rounds, round time median {statistics.median(d):.3f} s, "
      f"max {max(d):.3f} s; rate-limited messages counted {limited}")
EOF
  [[ $2 -gt 0 ]] && echo "  log lines about dropped messages: $(grep -c 'rate limit\|messages/s' "$run/coordinator.log" || true)"
  return 0
}
if [[ $SECTIONS == *b* ]]; then
echo "== (b) $ROUNDS rounds, 3 honest clients, round time from metrics.jsonl"
run_job no-flood 0
run_job flood-1-connection 1
run_job flood-8-connections 8
fi

# (c) One key, many connections, each holding an unfinished message just under the window.
HOLD_CONNECTIONS=${HOLD_CONNECTIONS:-781}
# A memory cgroup of $1 bytes; prints its directory, or nothing where none can be made.
make_cgroup() {
  local dir=""
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    dir=/sys/fs/cgroup/huddle_attack_$$
    mkdir "$dir" 2>/dev/null && echo "$1" >"$dir/memory.max" 2>/dev/null && { echo "$dir"; return; }
  elif [[ -d /sys/fs/cgroup/memory ]]; then
    dir=/sys/fs/cgroup/memory/huddle_attack_$$
    mkdir "$dir" 2>/dev/null && echo "$1" >"$dir/memory.limit_in_bytes" 2>/dev/null && { echo "$dir"; return; }
  fi
  [[ -n $dir ]] && rmdir "$dir" 2>/dev/null
  return 0
}
hold_job() {  # $1: name; with $CGROUP set, the coordinator runs in it
  local run=$WORK/$1; mkdir -p "$run"; job 3 "$ROUNDS" >"$run/job.yaml"
  local port; port=$(free_port)
  start_coordinator "$run" "$port"
  ATTACK_FLAGS="--hold-bytes 3932160" attack "$run" "$port" hold "$HOLD_CONNECTIONS" 600
  sleep 5  # the connections are open and holding before the clients come
  local peak=0 rss
  start_clients "$run" "$port"
  while kill -0 "$COORD" 2>/dev/null; do
    rss=$(kib VmHWM "$COORD"); [[ -n $rss ]] && (( rss > peak )) && peak=$rss
    sleep 0.5
  done
  local code=0; wait "$COORD" || code=$?
  kill "$ATTACKER" 2>/dev/null || true; wait "$ATTACKER" 2>/dev/null || true
  for c in "${CLIENTS[@]}"; do kill "$c" 2>/dev/null || true; wait "$c" 2>/dev/null || true; done
  printf '%s: coordinator exit %s, peak RSS (VmHWM) %.1f MiB\n' "$1" "$code" "$(bc -l <<<"$peak/1024")"
  cat "$run/attack.log"
  echo "  coordinator log lines about cut connections: $(grep -c 'cut the connection\|connections cut' "$run/coordinator.log" || true)"
  [[ -f $run/out/metrics.jsonl ]] && python3 - "$run/out/metrics.jsonl" <<'EOF'
import json, statistics, sys
rounds = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
d = [r["duration_s"] for r in rounds if "duration_s" in r]
cut = sum(r.get("connections_cut", 0) for r in rounds)
print(f"  {len(d)} rounds, round time median {statistics.median(d):.3f} s, max {max(d):.3f} s; "
      f"connections_cut in metrics {cut}")
EOF
  return 0
}
[[ $SECTIONS == *c* ]] || exit 0
echo "== (c) one key, $HOLD_CONNECTIONS connections each holding an unfinished 3.75 MiB message"
[[ $SECTIONS == *n* ]] && hold_job hold-no-limit
CGROUP_MADE=$(make_cgroup $((1 << 30)))
if [[ -n $CGROUP_MADE ]]; then
  CGROUP=$CGROUP_MADE hold_job hold-1GiB-cgroup
  echo "  (cgroup $CGROUP_MADE, limit 1 GiB)"
else
  echo "hold-1GiB-cgroup: skipped (cannot create a memory cgroup here: needs root and cgroup v1/v2 memory)"
fi

[[ $SECTIONS == *r* ]] || exit 0
# Memory returned after cuts: the attack runs for 20 s against an idle coordinator, then stops.
RUN=$WORK/hold-release; mkdir -p "$RUN"; job 2 1 >"$RUN/job.yaml"
PORT=$(free_port)
start_coordinator "$RUN" "$PORT"
sleep 2
IDLE=$(kib VmRSS "$COORD")
ATTACK_FLAGS="--hold-bytes 3932160" attack "$RUN" "$PORT" hold "$HOLD_CONNECTIONS" 20
wait "$ATTACKER" || true
sleep 3
printf 'after the attack: idle RSS %.1f MiB, peak (VmHWM) %.1f MiB, RSS 3 s after it stopped %.1f MiB\n' \
  "$(bc -l <<<"$IDLE/1024")" "$(bc -l <<<"$(kib VmHWM "$COORD")/1024")" "$(bc -l <<<"$(kib VmRSS "$COORD")/1024")"
kill "$COORD"; wait "$COORD" 2>/dev/null || true
