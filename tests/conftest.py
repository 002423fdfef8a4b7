"""Shared test setup: hypothesis profiles and small helpers."""

import os

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
def child_env():
    """Environment for a child Python that imports the same aprfast as this process
    (the installed package in CI, the in-place build in a checkout)."""
    import aprfast

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    return dict(os.environ, PYTHONPATH=package_parent)
