"""Tests of the huddle_client module (client/python/): its types, the tensors it takes from Python,
and Python trainers driven by the real client SDK against a real `huddle coordinator`.

    PYTHONPATH=build/client/python HUDDLE_BIN=build/cli/huddle python3 -m unittest binding_test
"""

import os
import pathlib
import signal
import sys
import threading
import time
import unittest

import harness

harness.require_modules("numpy")

import numpy as np  # noqa: E402

import huddle_client  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# A tiny job: one dense layer 4 -> 3 (tensors fc0.weight [3, 4], fc0.bias [3]), no evaluation.
TINY_JOB = """name: binding-test
seed: 1
rounds: {rounds}
model: {{input: [4], layers: [{{dense: {{out: 3}}}}]}}
train: {{epochs: 2, batch_size: 8, learning_rate: 0.05, momentum: 0.5, weight_decay: 0.001}}
cohort: {{size: 1}}
round: {{deadline_s: 30, quorum: 1}}
evaluation: {{every: 0}}
coordinator: {{min_clients: 1, wait_for_clients_s: 60, heartbeat_interval_s: 0.2,
  max_rounds_without_update: 10}}
"""
LIKE = [huddle_client.TensorInfo("fc0.weight", (3, 4)), huddle_client.TensorInfo("fc0.bias", (3,))]


def torch_or_skip(test):
    try:
        import torch
    except ImportError:
        test.skipTest("torch is not importable (Debian package python3-torch)")
    return torch


class TypesTest(unittest.TestCase):
    def test_fit_config_round_trips_every_field(self):
        c = huddle_client.FitConfig(round=7, seed=2**64 - 1, epochs=3, batch_size=64,
                                    learning_rate=0.02, momentum=0.9, weight_decay=1e-4)
        self.assertEqual((c.round, c.seed, c.epochs, c.batch_size),
                         (7, 2**64 - 1, 3, 64))
        self.assertEqual((c.learning_rate, c.momentum, c.weight_decay), (0.02, 0.9, 1e-4))
        self.assertIsNone(c.dp_sgd)
        c.dp_sgd = huddle_client.DpSgdConfig(noise_multiplier=1.1, clip_norm=1.0,
                                             expected_batch_size=256, delta=1e-5)
        self.assertEqual((c.dp_sgd.noise_multiplier, c.dp_sgd.clip_norm,
                          c.dp_sgd.expected_batch_size, c.dp_sgd.delta), (1.1, 1.0, 256, 1e-5))
        self.assertIn("round=7", repr(c))
        self.assertIn("DpSgdConfig(noise_multiplier=1.1", repr(c))
        with self.assertRaises(TypeError):
            huddle_client.FitConfig(7)  # keyword-only

    def test_job_and_tensor_info_shapes_are_tuples(self):
        t = huddle_client.TensorInfo("conv0.weight", [16, 1, 5, 5])
        self.assertEqual(t.shape, (16, 1, 5, 5))
        self.assertEqual(t.shape, np.zeros((16, 1, 5, 5)).shape)
        t.shape = (3,)
        self.assertEqual(repr(t), "TensorInfo('conv0.weight', (3,))")
        self.assertEqual(huddle_client.TensorInfo("s", ()).shape, ())
        job = huddle_client.JobInfo(name="j", tensors=LIKE, model_kind="layers")
        self.assertEqual([x.name for x in job.tensors], ["fc0.weight", "fc0.bias"])
        self.assertEqual(job.tensors[0], LIKE[0])
        self.assertIn("2 tensors", repr(job))

    def test_results_keep_their_fields(self):
        report = huddle_client.DpSgdReport(noise_multiplier=1.0, sampling_rate=0.01, steps=100)
        r = huddle_client.FitResult(tensors=[np.zeros(3)], is_delta=True, num_examples=12,
                                    metrics={"loss": np.float32(0.5), "accuracy": 1},
                                    dp_sgd=report)
        self.assertEqual((r.is_delta, r.num_examples), (True, 12))
        self.assertEqual(r.metrics, {"loss": 0.5, "accuracy": 1.0})
        self.assertEqual(r.dp_sgd.steps, 100)
        self.assertEqual(len(r.tensors), 1)
        empty = huddle_client.FitResult()
        self.assertEqual((list(empty.tensors), empty.num_examples, empty.metrics, empty.dp_sgd),
                         ([], 0, {}, None))
        e = huddle_client.EvaluateResult(num_examples=5, loss=0.25, accuracy=0.8)
        self.assertEqual((e.num_examples, e.loss, e.accuracy), (5, 0.25, 0.8))

    def test_client_options_take_paths(self):
        o = huddle_client.ClientOptions(coordinator="tcp://h:1", secret_key_file=pathlib.Path("k"),
                                        server_key_file="s.pub", insecure=True,
                                        give_up_after_s=2.5, log_level="warn")
        self.assertEqual((o.coordinator, o.secret_key_file, o.server_key_file),
                         ("tcp://h:1", "k", "s.pub"))
        self.assertEqual((o.insecure, o.give_up_after_s, o.log_level, o.config_file),
                         (True, 2.5, "warn", ""))

    def test_version_and_error(self):
        self.assertEqual(huddle_client.version(), "0.1.0")
        self.assertEqual(huddle_client.__version__, "0.1.0")
        # The revision `huddle --version` prints: 12 hex digits (or "unknown" outside git).
        self.assertRegex(huddle_client.build_revision(), r"^([0-9a-f]{12}(-dirty)?|unknown)$")
        self.assertTrue(issubclass(huddle_client.Error, RuntimeError))

    def test_trainer_defaults(self):
        class Minimal(huddle_client.Trainer):
            def num_examples(self):
                return 1

        class Evaluating(Minimal):
            def evaluate(self, weights):
                return huddle_client.EvaluateResult(num_examples=1)

        self.assertFalse(Minimal().can_evaluate())
        self.assertTrue(Evaluating().can_evaluate())
        Minimal().start(huddle_client.JobInfo())  # the default does nothing
        with self.assertRaises(NotImplementedError):
            Minimal().fit([], huddle_client.FitConfig())

        class NoSuperInit(huddle_client.Trainer):
            def __init__(self):
                pass

        with self.assertRaisesRegex(TypeError, "__init__"):
            NoSuperInit()


class TensorsTest(unittest.TestCase):
    def test_a_list_in_order_becomes_float32_copies(self):
        w = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.array([1, 2, 3], dtype=np.float32)
        out = huddle_client.check_tensors([w, b], LIKE)
        self.assertEqual([a.dtype for a in out], [np.float32, np.float32])
        np.testing.assert_array_equal(out[0], w)
        self.assertTrue(out[0].flags.c_contiguous)
        w[0, 0] = 100  # a copy: the caller's array is not referenced
        self.assertEqual(out[0][0, 0], 0)

    def test_a_dict_by_name_in_any_order(self):
        out = huddle_client.check_tensors({"fc0.bias": np.ones(3), "fc0.weight": np.zeros((3, 4))},
                                          LIKE)
        np.testing.assert_array_equal(out[1], np.ones(3, dtype=np.float32))

    def test_other_floats_and_layouts_are_converted(self):
        w64 = np.random.default_rng(1).standard_normal((4, 3)).T  # float64, Fortran order
        strided = np.arange(6, dtype=np.float32)[::2]  # a non-contiguous view
        out = huddle_client.check_tensors([w64, strided], LIKE)
        np.testing.assert_array_equal(out[0], w64.astype(np.float32))
        np.testing.assert_array_equal(out[1], [0, 2, 4])
        half = np.full((3, 4), 0.5, dtype=np.float16)
        big = np.array([1, 2, 3], dtype=">f4")
        out = huddle_client.check_tensors((half, big), LIKE)
        np.testing.assert_array_equal(out[1], [1, 2, 3])
        scalar = huddle_client.check_tensors([np.float32(2.5)],
                                             [huddle_client.TensorInfo("s", ())])
        self.assertEqual(scalar[0].shape, ())

    def test_torch_tensors_are_read_without_grad(self):
        torch = torch_or_skip(self)
        out = huddle_client.check_tensors([torch.ones(3, 4), torch.arange(3.0)], LIKE)
        np.testing.assert_array_equal(out[1], [0, 1, 2])
        with self.assertRaisesRegex(TypeError, r"tensor 0 of 2, 'fc0.weight'.*detach"):
            huddle_client.check_tensors([torch.ones(3, 4, requires_grad=True), torch.ones(3)],
                                        LIKE)

    def test_errors_name_the_tensor(self):
        cases = [
            ([np.zeros((3, 4), dtype=np.int64), np.zeros(3)], TypeError,
             r"tensor 0 of 2, 'fc0.weight': dtype int64 is not a floating type"),
            ([np.zeros((3, 4)), np.zeros(3, dtype=np.complex64)], TypeError,
             r"tensor 1 of 2, 'fc0.bias': dtype complex64"),
            ([np.zeros((3, 5)), np.zeros(3)], ValueError,
             r"tensor 0 of 2, 'fc0.weight': shape \(3, 5\), the model's is \(3, 4\)"),
            ([np.zeros((3, 4)), np.zeros((1, 3))], ValueError,
             r"'fc0.bias': shape \(1, 3\), the model's is \(3,\)"),
            ([np.zeros((3, 4))], ValueError, r"got 1 tensors, the model has 2 \(fc0.weight"),
            ({"fc0.weight": np.zeros((3, 4))}, ValueError, r"'fc0.bias', is missing"),
            ({"fc0.weight": np.zeros((3, 4)), "fc0.bias": np.zeros(3), "x": 1}, ValueError,
             r"not the model's: 'x'"),
            (np.zeros((3, 4)), TypeError, r"got one ndarray"),
            (5, TypeError, r"got a value of type int"),
            ([object(), np.zeros(3)], TypeError, r"tensor 0 of 2, 'fc0.weight'"),
        ]
        for tensors, error, pattern in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(error, pattern):
                    huddle_client.check_tensors(tensors, LIKE)


class Recording(huddle_client.Trainer):
    """Returns the global model plus 0.25 * round, recording every call."""

    def __init__(self):
        super().__init__()
        self.jobs, self.fits = [], []

    def num_examples(self):
        return 10

    def start(self, job):
        self.jobs.append((job.name, job.model_kind, [(t.name, t.shape) for t in job.tensors],
                          threading.get_ident()))

    def fit(self, weights, config):
        self.fits.append((config, [w.copy() for w in weights], threading.get_ident()))
        return huddle_client.FitResult(tensors=[w + 0.25 * config.round for w in weights],
                                       metrics={"loss": 0.125 * config.round, "accuracy": 0.5})


class RunTest(harness.ProcessTestCase):
    """Python trainers under the real client SDK (run), against a real coordinator."""

    def test_the_sdk_drives_a_python_trainer_from_its_worker_thread(self):
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        coordinator = self.start_coordinator(TINY_JOB.format(rounds=3), endpoint, ["--insecure"])
        trainer = Recording()
        huddle_client.run(trainer, huddle_client.ClientOptions(
            coordinator=endpoint, insecure=True, client_id="py-recording", give_up_after_s=60,
            log_level="error"))
        self.assertEqual(coordinator.wait(60), 0, self.logs())

        self.assertEqual(len(trainer.jobs), 1)
        name, kind, tensors, start_thread = trainer.jobs[0]
        self.assertEqual((name, tensors), ("binding-test", [("fc0.weight", (3, 4)),
                                                            ("fc0.bias", (3,))]))
        self.assertIn(kind, ("layers", "mlp"))
        self.assertEqual([c.round for c, _, _ in trainer.fits], [1, 2, 3])
        for config, weights, thread in trainer.fits:
            self.assertNotEqual(thread, threading.main_thread().ident)  # the SDK's worker
            self.assertEqual((config.epochs, config.batch_size), (2, 8))
            self.assertEqual((config.learning_rate, config.momentum, config.weight_decay),
                             (0.05, 0.5, 0.001))
            self.assertIsNone(config.dp_sgd)
            self.assertEqual([(w.dtype, w.shape) for w in weights],
                             [(np.float32, (3, 4)), (np.float32, (3,))])
        self.assertNotEqual(start_thread, threading.main_thread().ident)
        self.assertEqual(len({c.seed for c, _, _ in trainer.fits}), 3)  # a seed per round
        # One client, server learning rate 1: each round's global model is the last one returned.
        for (c, before, _), (_, after, _) in zip(trainer.fits, trainer.fits[1:]):
            for b, a in zip(before, after):
                np.testing.assert_allclose(a, b + 0.25 * c.round, atol=1e-5)
        metrics = self.metrics()
        self.assertEqual([m["results"] for m in metrics], [1, 1, 1])
        self.assertEqual([m["train_loss"] for m in metrics], [0.125, 0.25, 0.375])
        self.assertEqual([m["examples"] for m in metrics], [10, 10, 10])

    def test_python_errors_fail_the_round_with_their_message(self):
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        coordinator = self.start_coordinator(TINY_JOB.format(rounds=4), endpoint, ["--insecure"])
        client = self.start([sys.executable, os.path.join(HERE, "trainer_child.py"), "faults",
                             endpoint], "client")
        self.assertEqual(coordinator.wait(90), 0, self.logs())
        self.assertEqual(client.wait(30), 0, self.logs())
        metrics = self.metrics()
        self.assertEqual([m["failed"] for m in metrics], [1, 1, 1, 0], self.logs())
        self.assertEqual([m["results"] for m in metrics], [0, 0, 0, 1], self.logs())
        log = client.output()
        for expected in [
                "Trainer.fit raised ValueError: boom in round 1 (trainer_child.py:",
                "Traceback (most recent call last):",  # printed on the client's stderr
                "Trainer.fit returned an invalid result: ValueError: tensor 0 of 2, "
                "'fc0.weight': shape (3, 5), the model's is (3, 4)",
                "Trainer.fit returned an invalid result: TypeError: tensor 1 of 2, 'fc0.bias': "
                "dtype int64 is not a floating type",
                "run returned"]:
            self.assertIn(expected, log)
        # The message reaches the coordinator too.
        self.assertIn("Trainer.fit raised ValueError: boom in round 1", coordinator.output())

    def test_a_start_that_raises_refuses_the_job(self):
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        self.start_coordinator(TINY_JOB.format(rounds=1), endpoint, ["--insecure"])
        client = self.start([sys.executable, os.path.join(HERE, "trainer_child.py"), "refuse",
                             endpoint], "client")
        self.assertEqual(client.wait(60), 1, self.logs())
        self.assertRegex(client.output(), r"run raised huddle_client.Error: .*the trainer refused "
                         r"it: Trainer.start raised RuntimeError: not my network: 2 tensors")

    def test_ctrl_c_interrupts_a_long_fit_and_stops_the_client(self):
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"
        self.start_coordinator(TINY_JOB.format(rounds=1), endpoint, ["--insecure"])
        client = self.start([sys.executable, os.path.join(HERE, "trainer_child.py"), "hang",
                             endpoint], "client")
        self.assertTrue(harness.wait_for(lambda: "fit started" in client.output(), 60),
                        self.logs())
        interrupted = time.monotonic()
        client.signal(signal.SIGINT)
        self.assertEqual(client.wait(10), 130, self.logs())
        self.assertLess(time.monotonic() - interrupted, 5)
        log = client.output()
        self.assertIn("Trainer.fit raised KeyboardInterrupt", log)
        self.assertIn("run raised KeyboardInterrupt", log)

    def test_ctrl_c_stops_a_client_waiting_for_its_coordinator(self):
        endpoint = f"tcp://127.0.0.1:{harness.free_port()}"  # nobody listens
        client = self.start([sys.executable, os.path.join(HERE, "trainer_child.py"), "hang",
                             endpoint], "client")
        self.assertTrue(harness.wait_for(lambda: "not reachable" in client.output(), 30),
                        self.logs())
        client.signal(signal.SIGINT)
        self.assertEqual(client.wait(10), 130, self.logs())

    def test_fatal_errors_raise_huddle_client_error(self):
        trainer = Recording()
        no_keys = huddle_client.ClientOptions(coordinator="tcp://127.0.0.1:1", log_level="error")
        with self.assertRaises(huddle_client.Error):
            huddle_client.run(trainer, no_keys)
        gives_up = huddle_client.ClientOptions(coordinator=f"tcp://127.0.0.1:{harness.free_port()}",
                                               insecure=True, client_id="py-alone",
                                               give_up_after_s=0.5, log_level="error")
        with self.assertRaisesRegex(huddle_client.Error, "no coordinator"):
            huddle_client.run(trainer, gives_up)
        with self.assertRaisesRegex(TypeError, "must be a huddle_client.Trainer"):
            huddle_client.run(object(), gives_up)
        self.assertEqual(trainer.fits, [])


if __name__ == "__main__":
    unittest.main()
