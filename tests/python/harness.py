"""Helpers of the Python tests: real `huddle` and Python processes on 127.0.0.1, every wait with a
deadline, every process killed when its test ends (tests/integration/process.h in Python).

CTest sets HUDDLE_BIN (the binary), PYTHONPATH (the built huddle_client module) and
HUDDLE_SOURCE_DIR (the repository). A test whose Python packages are missing exits with
SKIP (77), which CTest reports as skipped with the reason printed.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SKIP = 77
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def require_modules(*names):
    """Exits with SKIP, naming what is missing, unless every module imports."""
    for name in names:
        try:
            __import__(name)
        except ImportError as e:
            print(f"SKIP: python module {name} is not importable ({e}); "
                  f"Debian package python3-{name}", file=sys.stderr)
            sys.exit(SKIP)


def huddle_bin():
    path = os.environ.get("HUDDLE_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise unittest.SkipTest("HUDDLE_BIN is not set to the huddle binary")
    return path


def source_dir():
    return os.environ.get("HUDDLE_SOURCE_DIR",
                          os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A subprocess with stdout and stderr in `log`; killed (SIGKILL) by kill() or close()."""

    def __init__(self, argv, log, env=None):
        self.log = log
        self._file = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._file, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)

    def wait(self, timeout_s):
        """The exit code (negative: the signal), or None after timeout_s."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._file.close()

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


def wait_for(predicate, timeout_s, poll_s=0.05):
    """Polls predicate until true or timeout_s; its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll_s)


def json_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class ProcessTestCase(unittest.TestCase):
    """A temporary directory per test (kept when the test fails) and processes killed at the end."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=f"huddle_py_{self._testMethodName}_")
        self.processes = []

    def tearDown(self):
        for p in self.processes:
            p.close()
        outcome = getattr(self, "_outcome", None)
        failed = outcome is not None and not getattr(outcome, "success", True)
        if not failed:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"kept {self.dir}", file=sys.stderr)

    def start(self, argv, name, env=None):
        p = Process(argv, os.path.join(self.dir, name + ".log"), env)
        self.processes.append(p)
        return p

    def start_coordinator(self, job_yaml, endpoint, extra=()):
        path = os.path.join(self.dir, "job.yaml")
        with open(path, "w") as f:
            f.write(job_yaml)
        return self.start([huddle_bin(), "coordinator", "--config", path, "--out",
                           os.path.join(self.dir, "out"), "--bind", endpoint, *extra],
                          "coordinator")

    def metrics(self):
        return json_lines(os.path.join(self.dir, "out", "metrics.jsonl"))

    def logs(self):
        text = ""
        for p in self.processes:
            text += f"--- {p.log}\n{p.output()}\n"
        return text

