#!/usr/bin/env python3
"""Checks that the Flower App starts from the model Huddle's coordinator starts from.

Runs `huddle coordinator` (plaintext on 127.0.0.1, one round, one client) with the model and seed of
examples/fashion_mnist_cnn.yaml (--model cnn) or examples/fashion_mnist.yaml (--model mlp), and one
client through the huddle_client binding whose fit records the weights the coordinator sends in
round 1 (the job's initial model) and returns them unchanged; then compares them, bit for bit, with
prepare_data.huddle_initial_model, which the Flower ServerApp starts from. Also checks that
prepare_data's shards are the row sets of Huddle's IID partition as
examples/pytorch_client/fmnist_data.py computes them (sizes, disjoint, covering the training set).

    PYTHONPATH=build/client/python /usr/bin/python3 scripts/flower/check_init.py [--huddle PATH]
        [--model cnn|mlp]
"""
from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import prepare_data  # noqa: E402

import huddle_client  # noqa: E402  (PYTHONPATH=build/client/python)

JOBS = {"cnn": "fashion_mnist_cnn.yaml", "mlp": "fashion_mnist.yaml"}


class Recorder(huddle_client.Trainer):
    def __init__(self):
        super().__init__()
        self.weights = None

    def num_examples(self):
        return 1

    def fit(self, weights, config):
        self.weights = [np.array(w, copy=True) for w in weights]
        return huddle_client.FitResult(tensors=weights, num_examples=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--huddle", default=str(ROOT / "build" / "cli" / "huddle"))
    ap.add_argument("--model", choices=sorted(JOBS), default="cnn")
    args = ap.parse_args()

    job_file = ROOT / "examples" / JOBS[args.model]
    job = re.sub(r"^rounds: [0-9]+", "rounds: 1", job_file.read_text(encoding="utf-8"),
                 flags=re.M)
    edits = {"size: 10}": "size: 1}", "quorum: 8,": "quorum: 1,",
             "min_clients: 10": "min_clients: 1",
             "evaluation: {every: 1,": "evaluation: {every: 0,"}
    for old, new in edits.items():
        if old not in job:
            print(f"check_init: {job_file} has no '{old}'", file=sys.stderr)
            return 2
        job = job.replace(old, new)
    seed = int(next(ln for ln in job.splitlines() if ln.startswith("seed:")).split(":")[1])

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "job.yaml").write_text(job, encoding="utf-8")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        coord = subprocess.Popen(
            [args.huddle, "coordinator", "--config", f"{tmp}/job.yaml", "--out", f"{tmp}/out",
             "--bind", f"tcp://127.0.0.1:{port}", "--insecure"],
            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/coordinator.log", "wb"))
        trainer = Recorder()
        options = huddle_client.ClientOptions(coordinator=f"tcp://127.0.0.1:{port}",
                                              client_id="init-check", insecure=True,
                                              give_up_after_s=60)
        failure = []

        def client():
            try:
                huddle_client.run(trainer, options)
            except Exception as e:  # noqa: BLE001
                failure.append(e)
        t = threading.Thread(target=client, daemon=True)
        t.start()
        try:
            rc = coord.wait(timeout=120)
        except subprocess.TimeoutExpired:
            coord.kill()
            rc = -1
        t.join(timeout=30)
        if trainer.weights is None:
            print(f"check_init: no round-1 weights (coordinator exit {rc}, client {failure}); "
                  f"coordinator log:\n{Path(tmp, 'coordinator.log').read_text()}", file=sys.stderr)
            return 1

    ours = prepare_data.huddle_initial_model(seed, args.model)
    ok = len(ours) == len(trainer.weights) and all(
        a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
        for a, b in zip(ours, trainer.weights))
    print(f"initial {args.model} model: {'identical' if ok else 'DIFFERENT'} to the "
          f"coordinator's ({len(trainer.weights)} tensors, seed {seed})")

    labels = prepare_data.fmnist_data._read_idx(f"{prepare_data.DATA}/train-labels-idx1-ubyte")
    shards = [prepare_data.fmnist_data.iid_shard(len(labels), 10, i, seed) for i in range(10)]
    union = np.concatenate(shards)
    shards_ok = (sorted(len(s) for s in shards) == [len(labels) // 10] * 10
                 and len(np.unique(union)) == len(labels))
    print(f"IID shards: {'a partition' if shards_ok else 'NOT a partition'} of "
          f"{len(labels)} rows into 10 x {len(shards[0])}")
    return 0 if ok and shards_ok else 1


if __name__ == "__main__":
    sys.exit(main())
