"""Replay every input in tests/fuzz/regressions/ through every fuzz target, without atheris.

Each file is an input exactly as a fuzzer saved it (two control bytes, then the file:
see tests/fuzz/harness.py).  The oracle is the fuzzers': a target may refuse the bytes
with an AprError and nothing else - no other exception, no warning (pyproject turns
warnings into errors), no crash.

Inputs of bugs not fixed yet are listed in regressions/KNOWN_OPEN.txt and expected to
fail (not strictly: once a fix lands they pass, and the line should be deleted).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

FUZZ_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")
REGRESSIONS = os.path.join(FUZZ_DIR, "regressions")
KNOWN_OPEN_FILE = os.path.join(REGRESSIONS, "KNOWN_OPEN.txt")


def _load_harness():
    # A unique module name: "harness" alone could collide with anything on sys.path.
    spec = importlib.util.spec_from_file_location("aprfast_fuzz_harness", os.path.join(FUZZ_DIR, "harness.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


def _inputs():
    if not os.path.isdir(REGRESSIONS):
        return []
    return sorted(f for f in os.listdir(REGRESSIONS)
                  if not f.startswith(".") and not f.endswith((".txt", ".md")))


def _known_open() -> dict:
    """{(file, target or None): reason} from KNOWN_OPEN.txt lines ``FILE [TARGET ...]  # reason``."""
    known = {}
    if not os.path.exists(KNOWN_OPEN_FILE):
        return known
    with open(KNOWN_OPEN_FILE, encoding="utf-8") as f:
        for line in f:
            spec, _, reason = line.partition("#")
            words = spec.split()
            if not words:
                continue
            for target in words[1:] or [None]:
                known[(words[0], target)] = reason.strip() or "known open bug"
    return known


KNOWN_OPEN = _known_open()


def test_known_open_names_existing_inputs_and_targets():
    for name, target in KNOWN_OPEN:
        assert name in _inputs(), f"KNOWN_OPEN.txt names {name!r}, which is not in {REGRESSIONS}"
        assert target is None or target in harness.TARGETS, f"KNOWN_OPEN.txt: unknown target {target!r}"


@pytest.mark.parametrize("name", _inputs())
@pytest.mark.parametrize("target", sorted(harness.TARGETS))
def test_regression_input_is_refused_only_with_apr_errors(request, target, name):
    reason = KNOWN_OPEN.get((name, target)) or KNOWN_OPEN.get((name, None))
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    with open(os.path.join(REGRESSIONS, name), "rb") as f:
        data = f.read()
    with harness.fuzz_environment():
        harness.run_one(harness.TARGETS[target], data)
