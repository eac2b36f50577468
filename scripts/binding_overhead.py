#!/usr/bin/env python3
"""Issue 20's overhead figure, from a run of examples/pytorch_client/run.sh: how much of each round
is spent outside the user's training function.

    examples/pytorch_client/run.sh runs/torch30
    python3 scripts/binding_overhead.py runs/torch30

Reads the coordinator's metrics.jsonl (each round's duration_s: from sending the instructions
until the last result is in; results are folded as they arrive, the evaluation after is not in it)
and the clients' logs (logs/torch-*.log; client.py's per-fit lines: time in the training
function, and in fit() outside it; the binding's: time in the binding outside Trainer.fit) and
prints, per round, the round's duration against its slowest client's training function, and over
all fits the binding's share. A round's time outside the slowest training function is everything
Huddle adds to the user's code on that round's critical path: the binding, the SDK (checks, delta,
clipping), the transport and the coordinator's fold.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

TRAIN = re.compile(r"round (\d+) fit: ([\d.]+) s training, ([\d.]+) s outside the training")
BINDING = re.compile(r"round (\d+) fit: ([\d.]+) s in Trainer\.fit, ([\d.]+) s in the binding")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="run.sh's OUT directory")
    args = ap.parse_args()
    metrics = args.run_dir / "metrics.jsonl"
    logs = sorted((args.run_dir / "logs").glob("torch-*.log"))
    if not metrics.exists() or not logs:
        print(f"binding_overhead: {args.run_dir} has no metrics.jsonl or logs/torch-*.log: "
              "give run.sh's OUT directory", file=sys.stderr)
        return 2
    training: dict[int, list[float]] = {}
    in_fit_outside, in_binding = [], []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if m := TRAIN.search(line):
                training.setdefault(int(m[1]), []).append(float(m[2]))
                in_fit_outside.append(float(m[3]))
            elif m := BINDING.search(line):
                in_binding.append(float(m[3]))
    rounds = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    shares = []
    print("round  duration_s  slowest training_s  outside (share of the round)")
    for r in rounds:
        if r["round"] not in training or not r.get("duration_s"):
            continue
        slowest = max(training[r["round"]])
        share = (r["duration_s"] - slowest) / r["duration_s"]
        shares.append(share)
        print(f"{r['round']:5d}  {r['duration_s']:10.3f}  {slowest:18.3f}  "
              f"{r['duration_s'] - slowest:.3f} s ({100 * share:.2f}%)")
    if not shares or not in_binding:
        print("binding_overhead: no round has both a duration and its clients' fit lines",
              file=sys.stderr)
        return 1
    print(f"\n{len(shares)} rounds: outside the slowest training function, median "
          f"{100 * statistics.median(shares):.2f}% of the round, max {100 * max(shares):.2f}%")
    print(f"{len(in_binding)} fits: in the binding mean {1e3 * statistics.mean(in_binding):.2f} ms, "
          f"median {1e3 * statistics.median(in_binding):.2f} ms, max "
          f"{1e3 * max(in_binding):.2f} ms; in fit() outside the training function mean "
          f"{1e3 * statistics.mean(in_fit_outside):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
