#!/usr/bin/env python3
"""A PyTorch client of a Huddle federation: the CNN of examples/fashion_mnist_cnn.yaml trained on
this client's IID shard of Fashion-MNIST, through the huddle_client binding (client/python/).

It joins the same job the built-in clients train (job.yaml here), so a federation may mix both:

    huddle coordinator --config examples/pytorch_client/job.yaml --out runs/torch --insecure
    PYTHONPATH=build/client/python python3 examples/pytorch_client/client.py \\
        --coordinator tcp://127.0.0.1:5555 --insecure --shard 0 --num-shards 10

run.sh starts a coordinator and ten of these; README.md has the details.
"""

import argparse
import logging
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fmnist_data

try:
    import huddle_client
except ImportError as e:
    sys.exit(f"client.py: cannot import huddle_client ({e}); build it (target "
             "huddle_client_python) and set PYTHONPATH=build/client/python")

log = logging.getLogger("torch-client")


class Cnn(nn.Module):
    """The job's model, layer for layer: conv2d 16 k5 p2 > relu > max_pool2d 2 > conv2d 32 k5 p2 >
    relu > max_pool2d 2 > flatten > dense 128 > relu > dense 10. Huddle's tensors have PyTorch's
    layouts (conv weight [out, in, k, k], dense weight [out, in], bias [out]; flatten in C order)
    and its order: each layer's weight, then its bias, layer by layer, as state_dict() lists
    them."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 16, kernel_size=5, padding=2)
        self.conv1 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        self.fc0 = nn.Linear(32 * 7 * 7, 128)
        self.fc1 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc1(F.relu(self.fc0(x)))


class TorchTrainer(huddle_client.Trainer):
    """Trains Cnn on (x, y); evaluates on (test_x, test_y) when given."""

    def __init__(self, x, y, test_x=None, test_y=None):
        super().__init__()
        self.model = Cnn()
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.test = None
        if test_x is not None:
            self.test = (torch.from_numpy(test_x), torch.from_numpy(test_y))
        self.params = list(self.model.state_dict().keys())

    def num_examples(self):
        return len(self.y)

    def start(self, job):
        """Maps the model's tensors to the job's, by order, and checks every shape."""
        ours = [(name, tuple(t.shape)) for name, t in self.model.state_dict().items()]
        theirs = [(t.name, t.shape) for t in job.tensors]
        if len(ours) != len(theirs):
            raise ValueError(f"job '{job.name}' has {len(theirs)} tensors "
                             f"({', '.join(n for n, _ in theirs)}); this CNN has {len(ours)}")
        for (name, shape), (job_name, job_shape) in zip(ours, theirs):
            if shape != job_shape:
                raise ValueError(f"job '{job.name}': tensor '{job_name}' has shape {job_shape}; "
                                 f"this CNN's '{name}' has {shape}: not this network")
        log.info("job '%s': %d tensors, %s mapped by order to this CNN", job.name, len(theirs),
                 ", ".join(f"{j}->{o}" for (o, _), (j, _) in zip(ours, theirs)))

    def _load(self, weights):
        # The binding's arrays are our own copies: the parameters become views of them.
        with torch.no_grad():
            for param, w in zip(self.model.parameters(), weights):
                param.data = torch.from_numpy(w)

    def fit(self, weights, config):
        began = time.perf_counter()
        if config.dp_sgd is not None:
            raise NotImplementedError("this example trains without DP-SGD")
        self._load(weights)
        training = time.perf_counter()
        loss, accuracy = self._train(config)
        trained = time.perf_counter()
        # Views of the parameters (no grad, on the CPU): the binding copies each once.
        tensors = [t.numpy() for t in self.model.state_dict().values()]
        result = huddle_client.FitResult(tensors=tensors, num_examples=len(self.y),
                                         metrics={"loss": loss, "accuracy": accuracy})
        ended = time.perf_counter()
        log.info("round %d fit: %.3f s training, %.4f s outside the training function "
                 "(loss %.4f, accuracy %.4f)", config.round, trained - training,
                 (ended - began) - (trained - training), loss, accuracy)
        return result

    def _train(self, config):
        """config.epochs of SGD over shuffled minibatches (the last one may be short)."""
        torch.manual_seed(config.seed)
        shuffle = torch.Generator().manual_seed(config.seed)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=config.learning_rate,
                                    momentum=config.momentum, weight_decay=config.weight_decay)
        self.model.train()
        n = len(self.y)
        total_loss, correct, seen = 0.0, 0, 0
        for _ in range(config.epochs):
            order = torch.randperm(n, generator=shuffle)
            for start in range(0, n, config.batch_size):
                rows = order[start:start + config.batch_size]
                x, y = self.x[rows], self.y[rows]
                optimizer.zero_grad(set_to_none=True)
                logits = self.model(x)
                loss = F.cross_entropy(logits, y)
                loss.backward()
                optimizer.step()
                total_loss += loss.item() * len(rows)
                correct += (logits.argmax(1) == y).sum().item()
                seen += len(rows)
        return total_loss / seen, correct / seen

    def can_evaluate(self):
        return self.test is not None

    def evaluate(self, weights):
        self._load(weights)
        self.model.eval()
        x, y = self.test
        total_loss, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(y), 1000):
                logits = self.model(x[start:start + 1000])
                total_loss += F.cross_entropy(logits, y[start:start + 1000], reduction="sum").item()
                correct += (logits.argmax(1) == y[start:start + 1000]).sum().item()
        return huddle_client.EvaluateResult(num_examples=len(y), loss=total_loss / len(y),
                                            accuracy=correct / len(y))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator", required=True, help="tcp://HOST:PORT")
    p.add_argument("--key", help="this client's secret key file (huddle keygen client)")
    p.add_argument("--server-key", help="the coordinator's public key file")
    p.add_argument("--insecure", action="store_true",
                   help="plaintext, unauthenticated (a coordinator started with --insecure)")
    p.add_argument("--client-id", help="default: the key's id; with --insecure torch-SHARD")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the IDX files (gzipped or raw)")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--num-shards", type=int, default=1)
    p.add_argument("--partition-seed", type=int, default=1,
                   help="the job's seed (job.yaml: seed: 1), as huddle run passes it")
    p.add_argument("--limit", type=int, default=0, help="train on the shard's first N examples")
    p.add_argument("--local-test", action="store_true",
                   help="evaluate on this client's shard of the t10k split")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--give-up-after", type=float, default=120,
                   help="seconds without a coordinator before giving up (0: never)")
    p.add_argument("--log-level", default="info")
    args = p.parse_args()

    client_id = args.client_id or (f"torch-{args.shard}" if args.insecure else "")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s.%(msecs)03d [{client_id or f'torch-{args.shard}'}] "
                        "%(message)s",
                        datefmt="%H:%M:%S")
    # The binding's own line per round: its share of each fit call (tensors in and out).
    logging.getLogger("huddle_client").setLevel(logging.DEBUG)
    torch.set_num_threads(args.threads)

    began = time.perf_counter()
    x, y = fmnist_data.load_split(args.data, "train", args.num_shards, args.shard,
                                  args.partition_seed, args.limit)
    test_x = test_y = None
    if args.local_test:
        test_x, test_y = fmnist_data.load_split(args.data, "t10k", args.num_shards, args.shard,
                                                args.partition_seed)
    log.info("shard %d of %d: %d examples (labels %s), loaded in %.2f s; torch %s, %d threads",
             args.shard, args.num_shards, len(y), np.bincount(y, minlength=10).tolist(),
             time.perf_counter() - began, torch.__version__, torch.get_num_threads())

    options = huddle_client.ClientOptions(
        coordinator=args.coordinator, client_id=client_id, secret_key_file=args.key,
        server_key_file=args.server_key, insecure=args.insecure,
        give_up_after_s=args.give_up_after, log_level=args.log_level)
    # SIGTERM stops the client the way Ctrl-C does (run() raises KeyboardInterrupt).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        huddle_client.run(TorchTrainer(x, y, test_x, test_y), options)
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
    except huddle_client.Error as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
