#!/usr/bin/env python3
"""A PyTorch client of a Huddle federation: the CNN of examples/fashion_mnist_cnn.yaml (or the MLP
of the quickstart, examples/fashion_mnist.yaml: whichever the job has) trained on this client's
IID shard of Fashion-MNIST, through the huddle_client binding (client/python/). The network, the
training loop and the evaluation are torch_model.py's; this file is the binding's side.

It joins the same job the built-in clients train (job.yaml here), so a federation may mix both:

    huddle coordinator --config examples/pytorch_client/job.yaml --out runs/torch --insecure
    PYTHONPATH=build/client/python python3 examples/pytorch_client/client.py \\
        --coordinator tcp://127.0.0.1:5555 --insecure --shard 0 --num-shards 10

run.sh starts a coordinator and ten of these; README.md has the details.
"""

import argparse
import logging
import signal
import sys
import time

import numpy as np
import torch

import fmnist_data
import torch_model

try:
    import huddle_client
except ImportError as e:
    sys.exit(f"client.py: cannot import huddle_client ({e}); build it (target "
             "huddle_client_python) and set PYTHONPATH=build/client/python")

log = logging.getLogger("torch-client")


class TorchTrainer(huddle_client.Trainer):
    """Trains the job's network (torch_model.network_for) on (x, y); evaluates on (test_x,
    test_y) when given."""

    def __init__(self, x, y, test_x=None, test_y=None):
        super().__init__()
        self.model = None  # chosen by start() from the job's tensors
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.test = None
        if test_x is not None:
            self.test = (torch.from_numpy(test_x), torch.from_numpy(test_y))

    def num_examples(self):
        return len(self.y)

    def start(self, job):
        """Builds the network whose tensors the job has (by order and shape), or refuses."""
        theirs = [(t.name, t.shape) for t in job.tensors]
        try:
            self.model = torch_model.network_for(theirs)
        except ValueError as e:
            raise ValueError(f"job '{job.name}': {e}") from None
        ours = list(self.model.state_dict().keys())
        log.info("job '%s': %d tensors, %s; %s mapped by order", job.name, len(theirs),
                 torch_model.describe(self.model),
                 ", ".join(f"{j}->{o}" for o, (j, _) in zip(ours, theirs)))

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
        return torch_model.train(self.model, self.x, self.y, epochs=config.epochs,
                                 batch_size=config.batch_size,
                                 learning_rate=config.learning_rate, momentum=config.momentum,
                                 weight_decay=config.weight_decay, seed=config.seed)

    def can_evaluate(self):
        return self.test is not None

    def evaluate(self, weights):
        self._load(weights)
        loss, accuracy = torch_model.evaluate(self.model, *self.test)
        return huddle_client.EvaluateResult(num_examples=len(self.test[1]), loss=loss,
                                            accuracy=accuracy)


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
