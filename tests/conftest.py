"""Shared test setup: hypothesis profiles and small helpers."""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("expensive", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def run_child():
    """Run a Python snippet in a child process that imports the same aprfast as this
    process (the installed package in CI, the in-place build in a checkout).  It runs
    from a neutral directory, since a child's working directory comes first on its path."""
    import aprfast

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env = dict(os.environ, PYTHONPATH=package_parent)

    def run(script, *args, timeout=60):
        return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                              cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=timeout)

    return run


def pytest_collection_modifyitems(config, items):
    """Under tests/sanitize.sh (APRFAST_SANITIZED=1) ASan's redzones and quarantine
    inflate every allocation, so peak-RSS bounds are checked by the normal run only."""
    if not os.environ.get("APRFAST_SANITIZED"):
        return
    skip = pytest.mark.skip(reason="peak-RSS bounds are measured without ASan (tests/sanitize.sh)")
    for item in items:
        if "peak_memory" in item.keywords:
            item.add_marker(skip)
