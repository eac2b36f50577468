#!/usr/bin/env python3
"""Checks the thread-safety annotations (absl/base/thread_annotations.h: ABSL_GUARDED_BY, ...)
with clang's -Wthread-safety: every source file that uses an annotated absl::Mutex is compiled
with -fsyntax-only and the warnings as errors, with its own flags from BUILD_DIR's
compile_commands.json (a clang configuration: scripts/fuzz.sh's). GCC ignores the annotations,
so this is where a field read without its mutex fails.

Usage: scripts/thread_safety.py BUILD_DIR [JOBS]. Exit 1 naming each file that fails.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKERS = ("absl::Mutex", "ABSL_GUARDED_BY")


def annotated(path):
    """Whether the file, or its own header (foo.cc -> foo.h), uses an annotated mutex."""
    text = ""
    for p in (path, os.path.splitext(path)[0] + ".h"):
        if os.path.exists(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                text += f.read()
    return any(m in text for m in MARKERS)


def syntax_command(entry):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-Werror="):
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety", "-Werror"]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = sys.argv[1]
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    if not any("clang" in os.path.basename((e.get("arguments") or shlex.split(e["command"]))[0])
               for e in entries):
        print(f"{build}: not a clang configuration (its compile commands are not clang's)",
              file=sys.stderr)
        return 2
    seen = set()
    todo = []
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not path.startswith(ROOT + os.sep) or path in seen:
            continue
        if re.search(r"/(build[^/]*|tests)/", path[len(ROOT):]) or not path.endswith(".cc"):
            continue
        seen.add(path)
        if annotated(path):
            todo.append((path, e))
    if not todo:
        print("no annotated source files found", file=sys.stderr)
        return 1

    def check(item):
        path, e = item
        r = subprocess.run(syntax_command(e), cwd=e["directory"], capture_output=True, text=True)
        return path, r.returncode, r.stderr

    failed = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for path, rc, err in pool.map(check, todo):
            rel = os.path.relpath(path, ROOT)
            if rc != 0:
                failed.append(rel)
                print(f"FAILED {rel}\n{err}", file=sys.stderr)
    print(f"thread-safety analysis: {len(todo) - len(failed)} of {len(todo)} annotated files pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
