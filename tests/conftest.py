"""Shared test setup: hypothesis profiles and small helpers."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("expensive", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_TESTS = Path(__file__).resolve().parent
_INTEROP = _TESTS / "interop"
_ENGINES = _TESTS / "engines"
#: how to ask for the tests the default run leaves out (said in every skip reason)
_HOW_TO_RUN_ALL = "pytest --all (or APRFAST_TEST_ALL=1, or name the file)"


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def pytest_addoption(parser):
    parser.addoption("--interop", action="store_true",
                     help="also run tests/interop: the real aprender and Burn crates, built with cargo "
                          "(several minutes the first time); CI runs them (APRFAST_REQUIRE_INTEROP=1)")
    parser.addoption("--all", action="store_true", dest="aprfast_all",
                     help="run everything CI runs: the tests marked slow (kill -9 harnesses, hostile "
                          "servers, engines, clusters, long bound measurements) and tests/interop, as "
                          "APRFAST_TEST_ALL=1 does; the default run leaves them out to stay near five minutes")


def _all_wanted(config) -> bool:
    return bool(config.getoption("aprfast_all")) or _env_on("APRFAST_TEST_ALL")


def _named_paths(config) -> list:
    """The paths named on the command line (``pytest tests/test_edit.py``, a node id, a
    folder below tests/), not the root or tests/ themselves, nor the ini's testpaths."""
    source = getattr(config, "args_source", None)
    if source is not None and source != pytest.Config.ArgsSource.ARGS:
        return []
    root = Path(str(config.rootpath)).resolve()
    named = []
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path not in (root, _TESTS):
            named.append(path)
    return named


def _interop_wanted(config) -> bool:
    if config.getoption("--interop") or _env_on("APRFAST_REQUIRE_INTEROP") or _all_wanted(config):
        return True
    # named on the command line (pytest tests/interop, or one of its files)
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == _INTEROP or _INTEROP in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """The default ``pytest`` (the README's) stays fast: the interop tests, which build
    Rust harnesses, run with ``--interop`` or ``--all``, when named, or in CI."""
    if Path(collection_path).resolve() == _INTEROP and not _interop_wanted(config):
        return True
    return None


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


def _slow_wanted(config, item, named) -> bool:
    if _all_wanted(config):
        return True
    path = Path(str(item.path)).resolve()
    if any(p == path or p in path.parents for p in named):
        return True
    # APRFAST_REQUIRE_ENGINES=1 asks that the engine tests run (and fail, never skip).
    return _env_on("APRFAST_REQUIRE_ENGINES") and _ENGINES in path.parents


def pytest_collection_modifyitems(config, items):
    """The default ``pytest`` (the README's) stays near five minutes on 2 cores: the tests
    marked ``slow`` are skipped, with the way to run them in the reason, unless ``--all``,
    APRFAST_TEST_ALL=1 (CI) or their file or folder is named on the command line.

    Under tests/sanitize.sh (APRFAST_SANITIZED=1) ASan's redzones and quarantine
    inflate every allocation, so peak-RSS bounds are checked by the normal run only."""
    named = _named_paths(config)
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is not None and not _slow_wanted(config, item, named):
            what = marker.args[0] if marker.args else "slow"
            item.add_marker(pytest.mark.skip(reason=f"slow ({what}): left out of the default run; "
                                                     f"run it with {_HOW_TO_RUN_ALL}"))
    if not os.environ.get("APRFAST_SANITIZED"):
        return
    skip = pytest.mark.skip(reason="peak-RSS bounds are measured without ASan (tests/sanitize.sh)")
    for item in items:
        if "peak_memory" in item.keywords:
            item.add_marker(skip)


# --- the pure-Python backend (APRFAST_BACKEND=python, aprfast._pure) ------------------
#: Fixtures whose tests are about the compiled implementation only.
_COMPILED_ONLY_FIXTURES = {
    "fresh_cache": "the cache of freed buffers belongs to the compiled allocator (csrc/buffers.c)",
}
#: Tests (by name) about the compiled implementation only.
_COMPILED_ONLY_TESTS = {
    "test_the_environment_sets_the_cap": "the cache of freed buffers belongs to the compiled allocator",
    "test_the_default_cap_is_a_quarter_of_physical_memory":
        "the cache of freed buffers belongs to the compiled allocator",
    "test_a_fresh_mapped_block_is_populated_and_decides_its_page_size":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    "test_one_slow_huge_step_keeps_huge_pages":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    "test_two_slow_huge_steps_in_a_row_move_to_small_pages_until_they_prove_dearer":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    "test_a_direct_reads_destination_keeps_huge_pages_up_to_its_own_mark":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    "test_small_pages_try_huge_ones_again_after_256_mib_then_after_twice_as_long":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    "test_cold_memory_keeps_huge_pages_once_small_ones_prove_dearer":
        "the timed huge-page choice belongs to the compiled allocator (csrc/buffers.c)",
    # a 1 s bound for walking a million distinct keys, which the pure walker takes seconds for
    # a tracemalloc bound on the compiled f16 and quantization kernels, which write into
    # their output; the pure twins compute through float32/float64 temporaries
    "test_peak_traced_memory_with_precision_and_quantize":
        "a traced-memory bound of the compiled conversion kernels",
    "test_hostile_json_is_refused_before_anything_is_built[many keys with empty arrays]":
        "a time bound of the compiled metadata scanner",
    "test_hostile_msgpack_is_refused_before_anything_is_built[many keys with empty arrays]":
        "a time bound of the compiled metadata scanner",
}


class _PureBackendSkips:
    """Under the pure backend, skip (with the reason) the tests that measure the compiled
    kernels' memory or speed, or exercise what only they have; every other test runs."""

    @staticmethod
    def pytest_collection_modifyitems(config, items):
        import aprfast

        if aprfast.backend != "python":
            return
        for item in items:
            reason = None
            if "peak_memory" in item.keywords:
                reason = "peak-RSS and time bounds measure the compiled kernels (the pure twins favour reading)"
            for fixture, why in _COMPILED_ONLY_FIXTURES.items():
                if fixture in getattr(item, "fixturenames", ()):
                    reason = why
            name = item.name.split("[", 1)[0]
            reason = _COMPILED_ONLY_TESTS.get(item.name, _COMPILED_ONLY_TESTS.get(name, reason))
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"pure backend: {reason}"))


def pytest_configure(config):
    config.pluginmanager.register(_PureBackendSkips(), "aprfast-pure-backend-skips")
