"""The default run's gate (tests/conftest.py): tests marked ``slow`` are skipped by a plain
``pytest``, with the way to run them in the reason, and run with ``--all``, with
APRFAST_TEST_ALL=1 (CI) or when their file is named.

Each case runs pytest in a child on real tests of the suite, with ``--setup-only`` (the
gate's skip happens at setup; nothing slow is run), as a plain ``pytest`` would: no
positional argument, the selection given as the ini's ``testpaths``.
"""

import os
import subprocess
import sys

import pytest

import aprfast

#: a slow test marked per function, a slow test marked per module (neither has another
#: reason to skip, on any platform), and a fast test
SLOW = ["tests/test_metadata_bounds.py::test_hostile_json_is_refused_before_anything_is_built[top-level array]",
        "tests/test_hostile_http.py::test_hostile_behaviour[honest-open]"]
FAST = "tests/test_metadata_bounds.py::test_the_limit_error_names_the_numbers"
FILES = ["tests/test_metadata_bounds.py", "tests/test_hostile_http.py"]
SELECT = ["-k", "(hostile_json_is_refused and top and array) or limit_error_names"
                " or (hostile_behaviour and honest and open)"]


def _pytest(rootdir, *args, env_all=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("APRFAST_TEST_ALL", "APRFAST_REQUIRE_ENGINES", "PYTEST_ADDOPTS")}
    if env_all is not None:
        env["APRFAST_TEST_ALL"] = env_all
    # the same aprfast as this process (the installed wheel in CI, the checkout here)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--setup-only",
                           *SELECT, *args], cwd=rootdir, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _gated(out):
    """The node ids (file::function) the gate skipped, from the -rs summary."""
    lines = [line for line in out.splitlines() if line.startswith("SKIPPED") and "slow (" in line]
    for line in lines:
        assert "pytest --all" in line and "APRFAST_TEST_ALL=1" in line, line
    return lines


def _ran(out, node):
    return any(line.strip().startswith(node) for line in out.splitlines())


@pytest.fixture(scope="module")
def rootdir(pytestconfig):
    return str(pytestconfig.rootpath)


def test_a_plain_run_skips_the_slow_tests_and_says_how_to_run_them(rootdir):
    out = _pytest(rootdir, "-o", "testpaths=" + " ".join(FILES))
    gated = _gated(out)
    assert len(gated) == 2, out
    assert any("test_metadata_bounds.py" in line and "long memory-bound measurement" in line for line in gated), out
    assert any("test_hostile_http.py" in line and "hostile HTTP server" in line for line in gated), out
    assert _ran(out, FAST) and not any(_ran(out, node) for node in SLOW), out
    assert "2 skipped" in out, out


@pytest.mark.parametrize("how", ["--all", "APRFAST_TEST_ALL=1", "the files named"])
def test_the_flag_the_environment_or_naming_the_file_runs_them(rootdir, how):
    if how == "--all":
        out = _pytest(rootdir, "--all", "-o", "testpaths=" + " ".join(FILES))
    elif how == "APRFAST_TEST_ALL=1":
        out = _pytest(rootdir, "-o", "testpaths=" + " ".join(FILES), env_all="1")
    else:
        out = _pytest(rootdir, *FILES)
    assert _gated(out) == [], out
    assert all(_ran(out, node) for node in [FAST, *SLOW]), out
    assert "skipped" not in out, out


def test_aprfast_test_all_0_is_the_plain_run(rootdir):
    out = _pytest(rootdir, "-o", "testpaths=" + " ".join(FILES), env_all="0")
    assert len(_gated(out)) == 2, out
