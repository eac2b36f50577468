"""`pip install ./client/python` as a user runs it (client/python/setup.py): into a fresh virtualenv
made from the interpreter the module is built for, with --system-site-packages (Debian's numpy),
building in this test's CMake tree (HUDDLE_CMAKE_BUILD_DIR, already built: no compiling here).
The installed module must import from the venv alone (no PYTHONPATH, run from outside the source
tree), load libhuddle_client.so from the wheel's huddle_client.libs/, and train: binding_test's
RunTest (real coordinator, Python trainers through the SDK) passes with it.
"""

import os
import subprocess
import sys
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


class PipInstallTest(harness.ProcessTestCase):
    def setUp(self):
        super().setUp()
        self.build = os.environ.get("HUDDLE_BUILD_DIR", "")
        if not os.path.exists(os.path.join(self.build, "CMakeCache.txt")):
            self.skipTest("HUDDLE_BUILD_DIR is not set to the CMake build tree")
        try:
            import venv  # noqa: F401
            import ensurepip  # noqa: F401
        except ImportError as e:
            self.skipTest(f"no venv/ensurepip for {sys.executable} ({e}): Debian package "
                          "python3-venv")
        self.venv = os.path.join(self.dir, "venv")
        self.python = os.path.join(self.venv, "bin", "python")
        # Nothing of the build tree's module may leak in.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def check(self, argv, timeout_s, **kwargs):
        """Runs argv; its output, or a failure that shows it."""
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout_s, env=kwargs.pop("env", self.env), **kwargs)
        self.assertEqual(p.returncode, 0, f"{' '.join(argv)}:\n{p.stdout}")
        return p.stdout

    def test_pip_install_gives_a_working_module(self):
        self.check([sys.executable, "-m", "venv", "--system-site-packages", self.venv], 120)
        # Offline, with the venv's setuptools and wheel (python3-venv's, Debian's python3-wheel)
        # and Debian's numpy: the build isolation a networked user gets would download the first.
        env = dict(self.env, HUDDLE_CMAKE_BUILD_DIR=self.build)
        out = self.check([self.python, "-m", "pip", "install", "--no-build-isolation",
                          "--no-index", "--disable-pip-version-check",
                          os.path.join(harness.source_dir(), "client", "python")], 600, env=env)
        self.assertIn("Successfully installed huddle-client", out)

        # From outside the source tree: the module and its library come from the venv.
        probe = ("import huddle_client, sys\n"
                 "print('module', huddle_client.__file__)\n"
                 "print('version', huddle_client.version())\n"
                 "with open('/proc/self/maps') as f:\n"
                 "    libs = {l.split()[-1] for l in f if 'libhuddle_client.so' in l}\n"
                 "print('library', *sorted(libs))\n")
        out = self.check([self.python, "-c", probe], 60, cwd=self.dir)
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        site = os.path.realpath(self.venv)
        self.assertTrue(os.path.realpath(lines["module"]).startswith(site), out)
        self.assertEqual(len(lines["library"].split()), 1, out)
        library = os.path.realpath(lines["library"])
        self.assertTrue(library.startswith(site), out)
        self.assertEqual(os.path.basename(os.path.dirname(library)), "huddle_client.libs", out)

        # The installed module trains: a real coordinator and Python trainers.
        self.check([self.python, "-m", "unittest", "binding_test.RunTest"], 300,
                   env=dict(self.env, PYTHONPATH=HERE))


if __name__ == "__main__":
    unittest.main()
