#!/usr/bin/env python3
"""Writes the files the Flower App reads (issue 20's comparison; tooling only).

  DIR/shard{I}_of{N}_seed{S}.npz   x float32 [n, 1, 28, 28] in [0, 1], y int64: client I's shard of
                                   Huddle's IID partition of the training set
  DIR/test.npz                     the 10k test set (the coordinator's `evaluation.data`)
  DIR/init_{M}_seed{S}.npz         w0, w1, ...: the model Huddle's coordinator starts from,
                                   models::InitModel(spec, DeriveSeed(seed, kInitStream)), for
                                   M = cnn (examples/fashion_mnist_cnn.yaml's model) or mlp
                                   (examples/fashion_mnist.yaml's, 784-128-10)

The data come from examples/pytorch_client/fmnist_data.py, the code the Huddle PyTorch clients load
their shards with (the same rows as the built-in clients' --partition iid), so both federations
train on the same data. The initial model re-implements models/model.cc's InitModel on
fmnist_data's copy of Huddle's Rng (common/rng.cc) plus Rng::Uniform: weights uniform in
+-sqrt(6 / fan_in) when a ReLU follows, +-sqrt(3 / fan_in) otherwise, drawn from
Rng(DeriveSeed(seed, tensor index)); zero biases. A Huddle PyTorch client receives exactly that
model from its coordinator in round 1; this gives Flower's ServerApp the same start.

    python3 scripts/flower/prepare_data.py --out /tmp/huddle-flower-data [--clients 10 --seed 1]
        [--model cnn|mlp]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "examples" / "pytorch_client"))
import fmnist_data  # noqa: E402  (examples/pytorch_client/fmnist_data.py)

DATA = "/usr/share/datasets/fashion-mnist"
INIT_STREAM = 0x696E6974  # coordinator/coordinator.cc's kInitStream ("init")

# (shape, a ReLU follows) of each job's parameter tensors in Huddle's order (models/model.cc
# Layout); None: a bias.
LAYOUTS = {
    "cnn": [((16, 1, 5, 5), True), ((16,), None), ((32, 16, 5, 5), True), ((32,), None),
            ((128, 1568), True), ((128,), None), ((10, 128), False), ((10,), None)],
    "mlp": [((128, 784), True), ((128,), None), ((10, 128), False), ((10,), None)],
}


def uniform(rng: fmnist_data.Rng) -> float:
    """Rng::Uniform: 53 random bits in [0, 1)."""
    return (rng.next() >> 11) * (1.0 / (1 << 53))


def huddle_initial_model(job_seed: int, model: str = "cnn") -> list[np.ndarray]:
    seed = fmnist_data.derive_seed(job_seed, INIT_STREAM)
    out = []
    for t, (shape, relu_follows) in enumerate(LAYOUTS[model]):
        if relu_follows is None:  # a bias
            out.append(np.zeros(shape, dtype=np.float32))
            continue
        fan_in = int(np.prod(shape[1:]))
        bound = np.sqrt((6.0 if relu_follows else 3.0) / fan_in)
        rng = fmnist_data.Rng(fmnist_data.derive_seed(seed, t))
        u = np.fromiter((uniform(rng) for _ in range(int(np.prod(shape)))), dtype=np.float64)
        out.append(((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape))
    return out


def shard_path(out: Path, shard: int, clients: int, seed: int) -> Path:
    return out / f"shard{shard}_of{clients}_seed{seed}.npz"


def prepare(out: Path, clients: int = 10, seed: int = 1, data: str = DATA,
            model: str = "cnn") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"shards": [shard_path(out, i, clients, seed) for i in range(clients)],
             "test": out / "test.npz", "init": out / f"init_{model}_seed{seed}.npz"}
    for i, p in enumerate(paths["shards"]):
        if not p.exists():
            x, y = fmnist_data.load_split(data, "train", clients, i, seed)
            np.savez(p, x=x, y=y)
    if not paths["test"].exists():
        x, y = fmnist_data.load_split(data, "t10k")
        np.savez(paths["test"], x=x, y=y)
    if not paths["init"].exists():
        np.savez(paths["init"],
                 **{f"w{i}": w for i, w in enumerate(huddle_initial_model(seed, model))})
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--model", choices=sorted(LAYOUTS), default="cnn")
    args = ap.parse_args()
    paths = prepare(Path(args.out), args.clients, args.seed, args.data, args.model)
    print(f"{len(paths['shards'])} shards, {paths['test']}, {paths['init']}")


if __name__ == "__main__":
    main()
