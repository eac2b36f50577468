#!/usr/bin/env python3
"""Time to a target accuracy: buffered asynchronous training (FedBuff) against synchronous
FedAvg(M) and FedAsync (buffer 1), on the simulation's virtual clock (issue 36's first figure);
with `dp`, FedBuff under client-level central DP against synchronous DP-FedAvg at the same epsilon
(its second).

Every run is the shipped binary's `huddle run` on an in-process simulation of CLIENTS Fashion-MNIST
clients (IID shards, the MLP 784-128-10) with log-normal per-client slowdowns (sigma SIGMA: the
slowest decile at >= 5x the median for sigma >= 1.26), the same local work per task (EPOCHS epochs
of batch 16 at learning rate 0.05), and the same link model. The virtual clock makes each run a
deterministic function of its seed: nothing waits in real time, and the times compare exactly.
For each mode and seed it reads metrics.jsonl and takes the first row whose test accuracy reaches
TARGET: its `elapsed_s` (virtual seconds) and its count of client updates. Medians over the seeds,
and the ratios sync / FedBuff and FedAsync / FedBuff, are printed as a Markdown table.

The `dp` figure runs examples/dp_central.yaml's job (MLP 784-64-10, secret Poisson cohorts q = 0.1,
60 rounds, epsilon 8 at delta 1e-4: add/remove, amplified by sampling) and examples/fedbuff_dp.yaml's
(100 in flight, a step every 200 updates, each client at most 10 times: epsilon 8 at delta 1e-4 for
the worst client, replace-one, unsampled) on the same virtual clock, and prints each one's final
and best accuracy, its virtual time to the end and to TARGET (default 0.78 here), and its epsilon.
The noise is the OS CSPRNG's, so runs of one seed differ; medians over the seeds.

The `secagg` figure runs examples/fedbuff_secagg.yaml's job (200 clients, MLP 784-128-10, steps of 20
updates as SecAgg+ sessions, 3 in flight; with and without over-selection: 25 sent, the first 20 to
train kept) against synchronous secure rounds of 20, each beside the same job without secure
aggregation, and prints the virtual time and updates to TARGET (default
0.80 here), the real seconds of each run (on this machine, all its clients' masking included),
and the final accuracy.

Usage: scripts/async_figures.py [BUILD_DIR] [dp|secagg]
Environment: SEEDS (default "1 2 3"), CLIENTS (1000), TARGET (0.85; dp: 0.78), SIGMA (1.3),
EPOCHS (2), KEEP_WORK=1 keeps the runs' directories.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
DP = len(sys.argv) > 2 and sys.argv[2] == "dp"
SECAGG = len(sys.argv) > 2 and sys.argv[2] == "secagg"
HUDDLE = os.path.join(BUILD, "cli", "huddle")
SEEDS = [int(s) for s in os.environ.get("SEEDS", "1 2 3").split()]
CLIENTS = int(os.environ.get("CLIENTS", "200" if SECAGG else "1000"))
TARGET = float(os.environ.get("TARGET", "0.78" if DP else "0.80" if SECAGG else "0.85"))
SIGMA = float(os.environ.get("SIGMA", "1.3"))
EPOCHS = int(os.environ.get("EPOCHS", "2"))

COMMON = f"""
simulation:
  clients: {CLIENTS}
  threads: 2
  clock: virtual
  slowdown: {{distribution: lognormal, sigma: {SIGMA}}}
  seconds_per_example: 0.005
  latency_s: 0.05
  bandwidth_mbit_s: 100
model: {{kind: mlp, hidden: [128]}}
train: {{epochs: {EPOCHS}, batch_size: 16, learning_rate: 0.05}}
data: {{path: /usr/share/datasets/fashion-mnist, partition: iid}}
"""

# name -> (job-specific YAML, the rows' evaluation interval)
# name -> job-specific YAML. The server optimizers were chosen on seed 1 (scripts' defaults): the
# synchronous rounds with FedAvgM's usual learning rate 1 and momentum 0.9; FedBuff from learning
# rate {0.7, 1, 2, 3} x momentum {0, 0.5, 0.9} (momentum makes its stale updates diverge, 2 and 3
# diverge; 1 without momentum is best); FedAsync from {0.1, 0.3, 0.5} without momentum (0.3).
MODES = {
    # Synchronous FedAvgM: 100 clients a round, every round waits for its slowest member.
    "sync FedAvgM (100 a round)": """
rounds: 80
cohort: {size: 100}
round: {deadline_s: 3600, quorum: 1, upload_slots: 16}
server: {learning_rate: 1.0, momentum: 0.9}
evaluation: {every: 1}
""",
    # FedBuff: 100 clients training at all times, a server step every 10 updates.
    "FedBuff (C 100, K 10)": """
rounds: 1500
async: {concurrency: 100, buffer: 10, staleness: {weight: polynomial, exponent: 0.5}, max_staleness: 1000}
round: {deadline_s: 3600, upload_slots: 16}
server: {learning_rate: 1.0, momentum: 0.0}
evaluation: {every: 5}
""",
    # FedAsync: a server step on every update.
    "FedAsync (C 100, K 1)": """
rounds: 15000
async: {concurrency: 100, buffer: 1, staleness: {weight: polynomial, exponent: 0.5}, max_staleness: 1000}
round: {deadline_s: 3600, upload_slots: 16}
server: {learning_rate: 0.3, momentum: 0.0}
evaluation: {every: 50}
""",
}


# The DP figure's jobs: the two examples' settings, on the virtual clock above.
DP_COMMON = COMMON.replace("hidden: [128]", "hidden: [64]").replace(
    "learning_rate: 0.05}", "learning_rate: 0.05, momentum: 0.9}")
DP_MODES = {
    "sync DP-FedAvgM (Poisson q 0.1)": """
rounds: 60
cohort: {sampling: poisson, rate: 0.1}
round: {deadline_s: 3600, quorum: 1, upload_slots: 16}
server: {learning_rate: 1.0, momentum: 0.9}
evaluation: {every: 5}
privacy: {mode: central, expected_cohort_size: 100, clip_norm: 1.0, epsilon: 8, delta: 1.0e-4}
""",
    "FedBuff DP (C 100, K 200, m 10)": """
rounds: 100
async: {concurrency: 100, buffer: 200, staleness: {weight: polynomial, exponent: 0.5}, max_staleness: 1000}
round: {deadline_s: 3600, upload_slots: 16}
server: {learning_rate: 1.0, momentum: 0.0}
evaluation: {every: 5}
privacy: {mode: central, clip_norm: 1.0, epsilon: 8, delta: 1.0e-4, max_participations: 10}
""",
}
# The secure aggregation figure's jobs: examples/fedbuff_secagg.yaml's (200 clients, steps of 20
# updates, 3 sessions in flight) against synchronous secure rounds of 20, each beside the same job
# without secure aggregation (every update clipped to 5 all the same).
SECAGG_KEYS = """aggregation: {max_update_norm: 5}
secure_aggregation: {enabled: true, corrupt_fraction: 0.2, dropout_fraction: 0.1, min_survivors: 0.6}
"""
SYNC_20 = """
rounds: 60
cohort: {size: 20}
round: {deadline_s: 3600, quorum: 1, upload_slots: 8}
server: {learning_rate: 1.0, momentum: 0.9}
evaluation: {every: 2}
"""
ASYNC_20 = """
rounds: 120
async: {concurrency: 60, buffer: 20, staleness: {weight: polynomial, exponent: 0.5}, max_staleness: 10}
round: {deadline_s: 3600, upload_slots: 8}
server: {learning_rate: 1.0, momentum: 0.0}
evaluation: {every: 2}
"""
SECAGG_MODES = {
    "sync SecAgg (20 a round)": SYNC_20 + SECAGG_KEYS,
    "sync plain (20 a round)": SYNC_20 + "aggregation: {max_update_norm: 5}\n",
    "FedBuff SecAgg sessions (C 60, K 20)": ASYNC_20 + SECAGG_KEYS,
    "FedBuff SecAgg sessions, over-selected 1.25": ASYNC_20.replace(
        "max_staleness: 10}", "max_staleness: 10, over_selection: 1.25}") + SECAGG_KEYS,
    "FedBuff plain (C 60, K 20)": ASYNC_20 + "aggregation: {max_update_norm: 5}\n",
}
if DP:
    COMMON = DP_COMMON
    MODES = DP_MODES
if SECAGG:
    MODES = SECAGG_MODES


def run(mode, yaml, seed, work):
    d = os.path.join(work, f"{mode.split()[0].lower()}-{seed}")
    os.makedirs(d, exist_ok=True)
    config = os.path.join(d, "job.yaml")
    with open(config, "w") as f:
        f.write(f"name: async-figures\nseed: {seed}\n" + COMMON + yaml)
    out = os.path.join(d, "out")
    t0 = time.monotonic()
    with open(os.path.join(d, "log"), "w") as log:
        p = subprocess.run([HUDDLE, "run", config, "--out", out, "--force"], stdout=log,
                           stderr=subprocess.STDOUT)
    real_s = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{mode} seed {seed}: huddle run exited {p.returncode}; see {d}/log")
    hit = None
    updates = 0
    best = 0.0
    # Under DP the counts and times are operator-only, in operator_metrics.jsonl.
    operator = {}
    if os.path.exists(os.path.join(out, "operator_metrics.jsonl")):
        for line in open(os.path.join(out, "operator_metrics.jsonl")):
            row = json.loads(line)
            operator[row["round"]] = row
    for line in open(os.path.join(out, "metrics.jsonl")):
        row = json.loads(line)
        row = {**operator.get(row["round"], {}), **row}
        updates += row.get("results", 0)
        acc = row.get("test_accuracy")
        if acc is None:
            continue
        best = max(best, acc)
        if acc >= TARGET and hit is None:
            hit = (row["elapsed_s"], updates, row["round"])
    summary = json.load(open(os.path.join(out, "summary.json")))
    return hit, best, real_s, summary


def main():
    if not os.access(HUDDLE, os.X_OK):
        sys.exit(f"missing {HUDDLE}: cmake --build {BUILD} --target huddle")
    work = tempfile.mkdtemp(prefix="huddle_async_")
    results = {}
    summaries = {}
    try:
        for mode, yaml in MODES.items():
            for seed in SEEDS:
                hit, best, real_s, summary = run(mode, yaml, seed, work)
                results.setdefault(mode, []).append(hit)
                summaries.setdefault(mode, []).append((summary, best, real_s))
                where = (f"{hit[0]:.1f} virtual s, {hit[1]} updates, step {hit[2]}" if hit
                         else f"not reached (best {best:.4f})")
                print(f"{mode} seed {seed}: {TARGET:.0%} at {where} ({real_s:.0f} s real)",
                      flush=True)
    finally:
        if os.environ.get("KEEP_WORK"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    def median(mode, i):
        hits = results[mode]
        if any(h is None for h in hits):
            return None
        return statistics.median(h[i] for h in hits)

    if DP:
        print_dp(results, summaries)
        return
    if SECAGG:
        print_secagg(results, summaries)
        return
    base = "FedBuff (C 100, K 10)"
    print()
    print(f"| mode | virtual s to {TARGET:.0%} (median of {len(SEEDS)}) | updates to it | "
          f"time / FedBuff's |")
    print("|---|---|---|---|")
    for mode in MODES:
        t = median(mode, 0)
        u = median(mode, 1)
        ratio = t / median(base, 0) if t is not None and median(base, 0) else None
        print(f"| {mode} | {'not reached' if t is None else f'{t:.1f}'} | "
              f"{'-' if u is None else f'{u:.0f}'} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} |")


def med(values):
    return statistics.median(values) if values else None


def print_secagg(results, summaries):
    print()
    print(f"| mode | virtual s to {TARGET:.0%} | updates to it | real s of the run | final accuracy "
          f"| (medians of {len(SEEDS)}) |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        hits = results[mode]
        ok = all(h is not None for h in hits)
        t = med([h[0] for h in hits]) if ok else None
        u = med([h[1] for h in hits]) if ok else None
        real = med([r for _, _, r in summaries[mode]])
        final = med([s.get("final_test_accuracy") or 0 for s, _, _ in summaries[mode]])
        print(f"| {mode} | {'not reached by all' if t is None else f'{t:.1f}'} | "
              f"{'-' if u is None else f'{u:.0f}'} | {real:.1f} | {final:.4f} | |")


def print_dp(results, summaries):
    print()
    print(f"| mode | final accuracy | best | virtual s to the end | virtual s to {TARGET:.0%} | "
          f"epsilon (delta) | (medians of {len(SEEDS)}) |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        rows = summaries[mode]
        final = med([s.get("final_test_accuracy") or 0 for s, _, _ in rows])
        best = med([b for _, b, _ in rows])
        # Under DP the elapsed time is operator-only (summary.json's `operator`).
        end = med([(s.get("operator") or s).get("elapsed_s") or 0 for s, _, _ in rows])
        hits = [h[0] for h in results[mode] if h is not None]
        to = med(hits) if len(hits) == len(rows) else None
        eps = med([s["privacy"]["epsilon"] for s, _, _ in rows])
        delta = rows[0][0]["privacy"]["delta"]
        print(f"| {mode} | {final:.4f} | {best:.4f} | {end:.1f} | "
              f"{'not reached by all' if to is None else f'{to:.1f}'} | {eps:.3g} ({delta:g}) | |")


if __name__ == "__main__":
    main()
