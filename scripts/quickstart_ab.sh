#!/usr/bin/env bash
# Paired A/B of the quickstart (examples/fashion_mnist.yaml through `huddle run`) between two
# builds of the `huddle` binary, run alternately on this machine:
#   scripts/quickstart_ab.sh BASE_HUDDLE HEAD_HUDDLE [PAIRS=5] [JOB=examples/fashion_mnist.yaml]
# Prints per run: final test accuracy, median and mean round duration (metrics.jsonl duration_s),
# the run's wall time and its model's hash; then the medians per side. Keep the machine idle.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1 head=$2 pairs=${3:-5} job=${4:-examples/fashion_mnist.yaml}
out=$(mktemp -d /tmp/quickstart_ab.XXXXXX)
for i in $(seq 1 "$pairs"); do
  for side in base head; do
    bin=$base; [[ $side == head ]] && bin=$head
    dir=$out/$side-$i
    start=$(date +%s.%N)
    "$bin" run "$job" --out "$dir" > "$dir.log" 2>&1 || { echo "$side run $i failed: see $dir.log" >&2; exit 1; }
    end=$(date +%s.%N)
    echo "$side $i $dir $start $end"
  done
done > "$out/runs.txt"
python3 - "$out/runs.txt" <<'PY'
import hashlib, json, statistics, sys
runs = {"base": [], "head": []}
for line in open(sys.argv[1]):
    side, i, d, start, end = line.split()
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    durations = [r["duration_s"] for r in rows]
    model = hashlib.sha256(open(d + "/model.bin", "rb").read()).hexdigest()[:16]
    r = dict(acc=rows[-1]["test_accuracy"], median=statistics.median(durations),
             mean=statistics.mean(durations), wall=float(end) - float(start), model=model)
    runs[side].append(r)
    print(f"{side} run {i}: final acc {r['acc']:.4f} | round median {r['median']:.3f} s "
          f"mean {r['mean']:.3f} s | wall {r['wall']:.1f} s | model {model}")
for side, rs in runs.items():
    print(f"{side}: median of round medians {statistics.median(r['median'] for r in rs):.3f} s, "
          f"median wall {statistics.median(r['wall'] for r in rs):.1f} s, "
          f"accuracies {sorted(set(round(r['acc'], 4) for r in rs))}, "
          f"models {sorted(set(r['model'] for r in rs))}")
PY
rm -rf "$out"
