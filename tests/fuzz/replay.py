#!/usr/bin/env python3
"""Replay fuzz inputs through the targets without atheris; exit 1 if any fails.

    python tests/fuzz/replay.py [-t TARGET] PATH ...

PATH is a file or a directory (a corpus/<target> directory, crashes, regressions;
directories are read recursively).  Without -t every input goes through every target.
The oracle is the fuzzers' (harness.run_one).  Its use: run a corpus a long fuzzing
session grew against the sanitizer build, which atheris cannot drive (a gcc ASan
runtime hides atheris's coverage), e.g.

    tests/sanitize.sh --run tests/fuzz/replay.py "$PWD/fuzz-out/corpus"
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402


def inputs(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, _dirs, files in os.walk(path):
                for name in sorted(files):
                    if not name.endswith((".txt", ".md")):
                        yield os.path.join(root, name)
        else:
            yield path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-t", "--target", action="append", choices=sorted(harness.TARGETS))
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    targets = args.target or sorted(harness.TARGETS)
    warnings.simplefilter("error")
    count = failures = 0
    with harness.fuzz_environment():
        for path in inputs(args.paths):
            with open(path, "rb") as f:
                data = f.read()
            for target in targets:
                count += 1
                try:
                    harness.run_one(harness.TARGETS[target], data)
                except Exception:  # noqa: BLE001 - every escape is a finding
                    failures += 1
                    print(f"FAIL {target} {path}", file=sys.stderr)
                    traceback.print_exc()
    print(f"replay: {count - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
