"""The PyTorch client example (examples/pytorch_client/), shortened: a coordinator started from its
job.yaml (the CNN) or from the quickstart's examples/fashion_mnist.yaml (the MLP), 2 rounds, a
cohort of 2, over CurveZMQ with enrolled keys, and 2 client.py processes on 2000 examples each.
The job must exit 0 with both updates accepted in every round, the test accuracy well above
chance, and the clients must leave cleanly and log their per-round timings. Also torch_model's
choice of network from a job's tensors.
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

    def shortened_job(self, path):
        with open(path) as f:
            job = f.read()
        job, n = re.subn(r"^rounds: \d+", f"rounds: {ROUNDS}", job, flags=re.M)
        self.assertEqual(n, 1, f"no 'rounds:' line in {path}")
        for text, replacement in [("size: 10}", f"size: {CLIENTS}}}"),
                                  ("quorum: 8,", f"quorum: {CLIENTS},"),
                                  ("min_clients: 10", f"min_clients: {CLIENTS}")]:
            self.assertIn(text, job, f"the shortening '{text}' matches nothing in {path}")
            job = job.replace(text, replacement)
        return job

    def keygen(self, *args):
        subprocess.run([harness.huddle_bin(), "keygen", *args, "--out", self.keys], check=True,
                       stdout=subprocess.DEVNULL, timeout=30)

    def test_two_pytorch_clients_train_the_cnn_job(self):
        self.federate(os.path.join(self.example, "job.yaml"), "the CNN")

    def test_two_pytorch_clients_train_the_quickstart_mlp_job(self):
        self.federate(os.path.join(harness.source_dir(), "examples", "fashion_mnist.yaml"),
                      "an MLP 784-128-10")

    def federate(self, job, network):
        self.keys = os.path.join(self.dir, "keys")
        self.keygen("server")
        os.makedirs(os.path.join(self.keys, "allowed"))
        for i in range(CLIENTS):
            self.keygen("client", "--id", f"torch-{i}")
            os.link(os.path.join(self.keys, f"torch-{i}.pub"),
                    os.path.join(self.keys, "allowed", f"torch-{i}.pub"))
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        coordinator = self.start_coordinator(
            self.shortened_job(job), endpoint,
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
            self.assertIn(f"tensors, {network};", log)
            self.assertEqual(len(re.findall(r"round \d+ fit: [\d.]+ s training, [\d.]+ s outside "
                                            r"the training function", log)), ROUNDS, log)
            self.assertEqual(len(re.findall(r"round \d+ fit: [\d.]+ s in Trainer.fit, [\d.]+ s in "
                                            r"the binding", log)), ROUNDS, log)


class TorchModelTest(unittest.TestCase):
    """torch_model.network_for: the network whose tensors a job has, or an error naming one."""

    def setUp(self):
        sys.path.insert(0, os.path.join(harness.source_dir(), "examples", "pytorch_client"))
        import torch_model
        self.tm = torch_model

    def test_the_cnn_and_mlps_are_recognised_by_their_shapes(self):
        cnn = self.tm.Cnn()
        shapes = [(n, tuple(t.shape)) for n, t in cnn.state_dict().items()]
        self.assertIsInstance(self.tm.network_for(shapes), self.tm.Cnn)
        mlp = self.tm.network_for([("fc0.weight", (64, 784)), ("fc0.bias", (64,)),
                                   ("fc1.weight", (32, 64)), ("fc1.bias", (32,)),
                                   ("fc2.weight", (10, 32)), ("fc2.bias", (10,))])
        self.assertEqual(mlp.sizes, [784, 64, 32, 10])
        self.assertEqual(self.tm.describe(mlp), "an MLP 784-64-32-10")

    def test_other_networks_are_refused_naming_the_tensor(self):
        for tensors, named in [
                ([("fc0.weight", (64, 784)), ("fc0.bias", (64,)), ("fc1.weight", (10, 63)),
                  ("fc1.bias", (10,))], "tensor 2 ('fc1.weight' [10, 63])"),
                ([("fc0.weight", (64, 784)), ("fc0.bias", (65,))], "tensor 0"),
                ([("fc0.weight", (64, 784))], "tensor 0"),
                ([("conv.weight", (16, 1, 3, 3)), ("conv.bias", (16,))], "tensor 0")]:
            with self.assertRaises(ValueError) as e:
                self.tm.network_for(tensors)
            self.assertIn(named, str(e.exception))


if __name__ == "__main__":
    unittest.main()
