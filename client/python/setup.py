"""`pip install ./client/python`: builds the huddle_client module with Huddle's own CMake build.

The module and the libhuddle_client.so it links come from the CMake project of the checkout this
file is in (../..), configured in a fresh build tree under pip's build directory with only what
they need (no tests, benchmarks or CUDA plugin), built (target huddle_client_python) and installed
by `cmake --install` (components python and sdk) into a staging prefix. The wheel then holds

    huddle_client.cpython-*.so                  the module
    huddle_client.libs/libhuddle_client.so.0    the client SDK, found through the module's RUNPATH
                                                ($ORIGIN/huddle_client.libs)

so the environment it is installed into needs Huddle's runtime packages only. Building needs the
C++ build's Debian packages (scripts/setup.sh) and takes minutes: it compiles the client library.

Environment (read by this build script only):
  HUDDLE_CMAKE_BUILD_DIR  build in this already configured Huddle build tree instead (e.g. build/,
                          as scripts/test.sh leaves it; tests/python's pip test does this): its
                          configuration is left as it is, only huddle_client_python is built
  HUDDLE_CMAKE_ARGS       more arguments for the fresh configuration (shell words)
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: the machine's cores)
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIBS_DIR = "huddle_client.libs"  # beside the module; client/python/CMakeLists.txt's RUNPATH


def huddle_version() -> str:
    """The version in the top-level CMakeLists.txt's project()."""
    cmake = ROOT / "CMakeLists.txt"
    match = re.search(r"project\(\s*huddle\s+VERSION\s+([0-9][0-9.]*)", cmake.read_text())
    if not match:
        raise RuntimeError(f"{cmake}: no 'project(huddle VERSION x.y.z' line")
    return match.group(1)


def run(argv: list) -> None:
    argv = [str(a) for a in argv]
    print("huddle-client:", shlex.join(argv), flush=True)
    try:
        subprocess.run(argv, check=True)
    except FileNotFoundError:
        raise RuntimeError(f"'{argv[0]}' was not found: building huddle_client needs CMake and "
                           "Huddle's C++ build dependencies (scripts/setup.sh)") from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"'{shlex.join(argv)}' failed with status {e.returncode}") from None


class CMakeBuild(build_ext):
    """Builds the one extension, huddle_client, with CMake instead of compiling sources."""

    def build_extension(self, ext: Extension) -> None:
        if not (ROOT / "client" / "sdk.cc").exists():
            raise RuntimeError(f"{ROOT} is not a Huddle source tree: pip must build "
                               "client/python in place, inside a Huddle checkout")
        build = self.cmake_tree()
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        run(["cmake", "--build", build, "--target", "huddle_client_python", "-j", jobs])

        staging = Path(self.build_temp).resolve() / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        for component in ("python", "sdk"):
            run(["cmake", "--install", build, "--prefix", staging, "--component", component])

        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        modules = sorted(staging.rglob("huddle_client.*.so"))
        if not modules:
            raise RuntimeError(f"cmake --install put no huddle_client module under {staging}")
        module = next((m for m in modules if m.name == "huddle_client" + suffix), None)
        if module is None:
            raise RuntimeError(
                f"the build made {modules[0].name}, not huddle_client{suffix}: it was configured "
                f"for another Python than {sys.executable} (configure with "
                f"-DPython3_EXECUTABLE={sys.executable}, or leave HUDDLE_CMAKE_BUILD_DIR unset)")
        library = next(iter(staging.rglob("libhuddle_client.so.[0-9]")), None)
        if library is None:
            raise RuntimeError(f"cmake --install put no libhuddle_client.so.N under {staging}")

        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module, target)
        libs = target.parent / LIBS_DIR
        libs.mkdir(exist_ok=True)
        # Wheels hold no symbolic links: the library is copied under its SONAME, the name the
        # module asks the loader for.
        shutil.copyfile(library.resolve(), libs / library.name)

    def cmake_tree(self) -> Path:
        given = os.environ.get("HUDDLE_CMAKE_BUILD_DIR")
        if given:
            tree = Path(given).resolve()
            if not (tree / "CMakeCache.txt").exists():
                raise RuntimeError(f"HUDDLE_CMAKE_BUILD_DIR={given}: not a configured CMake build "
                                   "tree (no CMakeCache.txt)")
            return tree
        tree = Path(self.build_temp).resolve() / "cmake"
        run(["cmake", "-S", ROOT, "-B", tree, "-DCMAKE_BUILD_TYPE=Release",
             "-DHUDDLE_BUILD_TESTS=OFF", "-DHUDDLE_BUILD_BENCH=OFF", "-DHUDDLE_ENABLE_CUDA=OFF",
             "-DHUDDLE_BUILD_PYTHON=ON", "-DHUDDLE_REQUIRE_PYTHON=ON",
             f"-DPython3_EXECUTABLE={sys.executable}",
             *shlex.split(os.environ.get("HUDDLE_CMAKE_ARGS", ""))])
        return tree


setup(
    version=huddle_version(),
    py_modules=[],
    packages=[],
    ext_modules=[Extension("huddle_client", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
