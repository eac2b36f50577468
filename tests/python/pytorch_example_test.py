"""The PyTorch client example (examples/pytorch_client/), shortened: a coordinator started from its
job.yaml (2 rounds, a cohort of 2) over CurveZMQ with enrolled keys, and 2 client.py processes
on 2000 examples each. The job must exit 0 with both updates accepted in every round, the test
accuracy well above chance, and the clients must leave cleanly and log their per-round timings.
"""

import os
import re
import subprocess
import sys
import unittest

import harness

harness.require_modules("numpy", "torch")

ROUNDS, CLIENTS, LIMIT = 2, 2, 2000


class PytorchExampleTest(harness.ProcessTestCase):
    def setUp(self):
        super().setUp()
        if not os.path.exists(os.path.join(harness.FASHION_MNIST, "train-images-idx3-ubyte.gz")):
            self.skipTest("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")
        self.example = os.path.join(harness.source_dir(), "examples", "pytorch_client")

    def shortened_job(self):
        with open(os.path.join(self.example, "job.yaml")) as f:
            job = f.read()
        for text, replacement in [("rounds: 30", f"rounds: {ROUNDS}"),
                                  ("size: 10}", f"size: {CLIENTS}}}"),
                                  ("quorum: 8,", f"quorum: {CLIENTS},"),
                                  ("min_clients: 10", f"min_clients: {CLIENTS}")]:
            self.assertIn(text, job, f"the shortening '{text}' matches nothing in job.yaml")
            job = job.replace(text, replacement)
        return job

    def keygen(self, *args):
        subprocess.run([harness.huddle_bin(), "keygen", *args, "--out", self.keys], check=True,
                       stdout=subprocess.DEVNULL, timeout=30)

    def test_two_pytorch_clients_train_the_cnn_job(self):
        self.keys = os.path.join(self.dir, "keys")
        self.keygen("server")
        os.makedirs(os.path.join(self.keys, "allowed"))
        for i in range(CLIENTS):
            self.keygen("client", "--id", f"torch-{i}")
            os.link(os.path.join(self.keys, f"torch-{i}.pub"),
                    os.path.join(self.keys, "allowed", f"torch-{i}.pub"))
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        coordinator = self.start_coordinator(
            self.shortened_job(), endpoint,
            ["--server-key", os.path.join(self.keys, "server.key"),
             "--allow", os.path.join(self.keys, "allowed")])
        clients = [
            self.start([sys.executable, os.path.join(self.example, "client.py"),
                        "--coordinator", endpoint,
                        "--key", os.path.join(self.keys, f"torch-{i}.key"),
                        "--server-key", os.path.join(self.keys, "server.pub"),
                        "--shard", str(i), "--num-shards", str(CLIENTS), "--limit", str(LIMIT),
                        "--give-up-after", "120"], f"torch-{i}")
            for i in range(CLIENTS)]

        self.assertEqual(coordinator.wait(500), 0, self.logs())
        for client in clients:
            self.assertEqual(client.wait(30), 0, self.logs())

        metrics = self.metrics()
        self.assertEqual([m["round"] for m in metrics], list(range(1, ROUNDS + 1)), self.logs())
        for m in metrics:
            self.assertEqual(m["results"], CLIENTS, m)
            self.assertTrue(m["updated"], m)
            self.assertEqual(m["examples"], CLIENTS * LIMIT, m)
        accuracies = [m["test_accuracy"] for m in metrics]
        self.assertGreater(accuracies[-1], 0.3, accuracies)  # chance is 0.1
        for client in clients:
            log = client.output()
            self.assertEqual(len(re.findall(r"round \d+ fit: [\d.]+ s training, [\d.]+ s outside "
                                            r"the training function", log)), ROUNDS, log)
            self.assertEqual(len(re.findall(r"round \d+ fit: [\d.]+ s in Trainer.fit, [\d.]+ s in "
                                            r"the binding", log)), ROUNDS, log)


if __name__ == "__main__":
    unittest.main()
