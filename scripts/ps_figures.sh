#!/usr/bin/env bash
# Issue 36's datacenter figure: with 1 of 4 compute ranks slowed 3x, wall time and final test
# accuracy of the all-reduce mode (4 ranks, batch 32 each, one step per global batch of 128) against
# the parameter-server mode with 1 server and 4 workers (batch 32 per worker step): async, and sync
# with one backup worker (each step takes the first 3 of 4 gradients). Same data (Fashion-MNIST),
# model (MLP 784-256-128-10) and epochs; learning rate 0.05 with momentum 0.9, and for the
# asynchronous mode also at 0.02, and at 0.05 without momentum; medians over SEEDS.
#
# Emulated devices (datacenter.slowdown_for_testing): every compute rank sleeps DEVICE_MS after each
# of its steps, as if its step ran on a device of its own rather than on this machine's few shared
# cores (where ranks sharing the cores would hide a slow one: a sleeping rank hands its core to
# the others), and the slow rank sleeps 2 x DEVICE_MS more, so its steps take 3x as long. The real
# compute (a few ms a step here) comes on top of each. SHARED=1 measures without the emulated
# devices instead (only the slow rank sleeps, 2x an unslowed step): the earlier, CPU-bound figure.
#
#   bash scripts/ps_figures.sh   # BUILD_DIR=build EPOCHS=2 SEEDS="1 2 3" DEVICE_MS=30 OUT=/tmp/ps_figures
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
EPOCHS="${EPOCHS:-2}"
SEEDS="${SEEDS:-1 2 3}"
OUT="${OUT:-/tmp/ps_figures}"
DEVICE_MS="${DEVICE_MS:-30}"
HUDDLE="$BUILD_DIR/cli/huddle"
[[ -x "$HUDDLE" ]] || { echo "build $HUDDLE first" >&2; exit 1; }
mkdir -p "$OUT"
uptime

# config NAME SEED EXTRA_DATACENTER_YAML [LEARNING_RATE] [MOMENTUM]
config() {
  cat > "$OUT/$1.yaml" <<YAML
name: $1
seed: $2
model: {kind: mlp, hidden: [256, 128]}
train: {epochs: $EPOCHS, batch_size: 32, learning_rate: ${4:-0.05}, momentum: ${5:-0.9}}
data: {path: /usr/share/datasets/fashion-mnist, format: idx}
evaluation: {every: $EPOCHS, data: /usr/share/datasets/fashion-mnist}
datacenter:
  device: cpu
  timeout_s: 60
$3
output: {dir: $OUT/$1}
YAML
  echo "$OUT/$1.yaml"
}

if [[ "${SHARED:-0}" == 1 ]]; then
  # One step's time: an unslowed 4-rank all-reduce run's.
  if [[ -z "${SLEEP_MS:-}" ]]; then
    "$HUDDLE" datacenter --config "$(config calibrate 1 "")" --nproc 4 >/dev/null
    SLEEP_MS=$(python3 -c "
import json; s = json.load(open('$OUT/calibrate/summary.json'))
print(max(1, round(2 * 1000 * s['seconds_this_session'] / s['steps'])))")
  fi
  EVERY_MS=0
  echo "slow rank sleeps $SLEEP_MS ms after each step (2x an unslowed 4-rank step)"
else
  SLEEP_MS=$((2 * DEVICE_MS))
  EVERY_MS=$DEVICE_MS
  echo "every compute rank sleeps $EVERY_MS ms after each step, the slow one $SLEEP_MS ms more"
fi
SLOW="{sleep_ms: $SLEEP_MS, every_rank_ms: $EVERY_MS"

# run NAME NPROC CONFIG: once (SKIP_EXISTING=1 keeps a finished run's summary).
run() {
  if [[ "${SKIP_EXISTING:-0}" == 1 && -f "$OUT/$1/summary.json" ]]; then return; fi
  rm -rf "${OUT:?}/$1"
  "$HUDDLE" datacenter --config "$3" --nproc "$2" >/dev/null
}
for seed in $SEEDS; do
  run "allreduce-$seed" 4 "$(config "allreduce-$seed" "$seed" \
    "  slowdown_for_testing: $SLOW, rank: 3}")"
  run "ps-async-$seed" 5 "$(config "ps-async-$seed" "$seed" \
    "  slowdown_for_testing: $SLOW, rank: 4}
  parameter_server: {servers: 1, mode: async}")"
  # Asynchrony adds implicit momentum: the same run at a lower learning rate.
  run "ps-async-lr02-$seed" 5 "$(config "ps-async-lr02-$seed" "$seed" \
    "  slowdown_for_testing: $SLOW, rank: 4}
  parameter_server: {servers: 1, mode: async}" 0.02)"
  # Or without momentum: asynchrony itself acts like momentum (Mitliagkas et al. 2016).
  run "ps-async-mom0-$seed" 5 "$(config "ps-async-mom0-$seed" "$seed" \
    "  slowdown_for_testing: $SLOW, rank: 4}
  parameter_server: {servers: 1, mode: async}" 0.05 0)"
  run "ps-sync-b1-$seed" 5 "$(config "ps-sync-b1-$seed" "$seed" \
    "  slowdown_for_testing: $SLOW, rank: 4}
  parameter_server: {servers: 1, mode: sync, backup_workers: 1}")"
  echo "seed $seed done"
done

python3 - "$OUT" "$SEEDS" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split()
rows = [("all-reduce sync, 4 ranks", "allreduce"), ("PS async, 1 server + 4 workers", "ps-async"),
        ("PS async, learning rate 0.02", "ps-async-lr02"),
        ("PS async, momentum 0", "ps-async-mom0"),
        ("PS sync + 1 backup, 1 server + 4 workers", "ps-sync-b1")]
print(f"{'mode':44} {'wall s':>8} {'examples/s':>11} {'test acc':>9}  (medians of {len(seeds)} seeds)")
for label, prefix in rows:
    s = [json.load(open(f"{out}/{prefix}-{seed}/summary.json")) for seed in seeds]
    secs = statistics.median(x["seconds_this_session"] for x in s)
    acc = statistics.median(x["final_test_accuracy"] for x in s)
    per = statistics.median(60000 * x["epochs"] / x["seconds_this_session"] for x in s)
    extra = ""
    if "staleness_mean" in s[0] and s[0]["ps_mode"] == "async":
        extra = f"  staleness mean {statistics.median(x['staleness_mean'] for x in s):.2f}"
    if s[0].get("ps_mode") == "sync":
        extra = f"  late gradients dropped {statistics.median(x['backup_dropped'] for x in s)}"
    print(f"{label:44} {secs:8.1f} {per:11.0f} {acc:9.4f}{extra}")
PY
