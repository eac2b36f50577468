"""Python clients that binding_test.py runs as processes of their own (their stderr, where the
SDK logs, is the test's to read; a SIGINT is theirs to take):

    trainer_child.py MODE ENDPOINT

  faults  round 1's fit raises ValueError, round 2's returns a tensor of the wrong shape, round 3's
          one of an integer dtype; later rounds return the global model plus 1
  hang    fit never returns by itself (prints "fit started" first)
  refuse  start raises RuntimeError

Exit codes: 0 when run() returned, 1 on huddle_client.Error, 130 on KeyboardInterrupt.
"""

import signal
import sys

import numpy as np

import huddle_client


class Faults(huddle_client.Trainer):
    def num_examples(self):
        return 10

    def fit(self, weights, config):
        if config.round == 1:
            raise ValueError("boom in round 1")
        tensors = [w + 1 for w in weights]
        if config.round == 2:
            tensors[0] = np.zeros((3, 5), dtype=np.float32)
        if config.round == 3:
            tensors[1] = np.zeros(3, dtype=np.int64)
        return huddle_client.FitResult(tensors=tensors, metrics={"loss": 0.5})


class Hang(huddle_client.Trainer):
    def num_examples(self):
        return 10

    def fit(self, weights, config):
        print("fit started", file=sys.stderr, flush=True)
        while True:
            sum(range(1000))


class Refuse(huddle_client.Trainer):
    def num_examples(self):
        return 10

    def start(self, job):
        raise RuntimeError(f"not my network: {len(job.tensors)} tensors")

    def fit(self, weights, config):
        raise AssertionError("fit after a refused start")


def main():
    mode, endpoint = sys.argv[1], sys.argv[2]
    # A shell's background job inherits SIGINT ignored; Ctrl-C must reach run() here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    trainer = {"faults": Faults, "hang": Hang, "refuse": Refuse}[mode]()
    options = huddle_client.ClientOptions(coordinator=endpoint, insecure=True,
                                          client_id=f"py-{mode}", give_up_after_s=60)
    try:
        huddle_client.run(trainer, options)
    except KeyboardInterrupt:
        print("run raised KeyboardInterrupt", file=sys.stderr, flush=True)
        return 130
    except huddle_client.Error as e:
        print(f"run raised huddle_client.Error: {e}", file=sys.stderr, flush=True)
        return 1
    print("run returned", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
