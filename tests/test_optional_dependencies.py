"""The core needs NumPy only (issue 14 part 7): with every optional package hidden,
``import aprfast`` and the v2 layouts work, and each feature that needs a missing package
says which extra to install.  Run in child processes whose import system refuses the
hidden packages, as an environment without them would."""

import os
import subprocess
import sys

import pytest

import aprfast
from aprfast._optional import EXTRAS

HIDE = r"""
import importlib.abc, sys
HIDDEN = set(sys.argv[1].split(","))
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


def run(hidden, body):
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env = dict(os.environ, PYTHONPATH=package_parent)
    return subprocess.run([sys.executable, "-c", HIDE + body, ",".join(hidden)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(package_parent))


ALL_OPTIONAL = sorted(EXTRAS)

CORE = r"""
import os, tempfile, numpy as np, aprfast
d = tempfile.mkdtemp()
p = os.path.join(d, "m.apr")
aprfast.save_file({"w": np.arange(6, dtype=np.float32)}, p)
assert (aprfast.load_file(p)["w"] == np.arange(6)).all()
with aprfast.open(p) as f:
    assert f.get_tensor("w")[5] == 5
loaded = [m for m in sys.modules if m.split(".")[0] in HIDDEN]
assert not loaded, loaded
print("core ok")
"""


def test_the_core_works_with_numpy_alone():
    out = run(ALL_OPTIONAL, CORE)
    assert out.returncode == 0, out.stderr
    assert "core ok" in out.stdout


FEATURES = {
    "zstd compression": (["zstandard"], "aprfast.save_file({'w': np.zeros(1000, np.float32)}, p, compression='zstd')",
                         "aprfast[compression]"),
    "LZ4 compression": (["lz4"], "aprfast.save_file({'w': np.zeros(1000, np.float32)}, p, compression='lz4')",
                        "aprfast[compression]"),
    "v1 metadata": (["msgpack"], "from aprfast import v1; v1.load_model(v1.save_model(b'x', model_type='Custom'))",
                    "aprfast[v1]"),
    "password encryption": (["nacl", "argon2"], "aprfast.save_file({'w': np.zeros(4, np.float32)}, p, password='pw')",
                            "aprfast[crypto]"),
    # the key is read (cryptography, the keyfiles extra) before model_signing is imported
    "OpenSSF model signing": (["model_signing"],
                              "from aprfast.crypto.ecdsa import save_ecdsa_keypair; save_ecdsa_keypair(p + '.key'); "
                              "open(p, 'wb').write(b'x'); aprfast.sign_model(p, p + '.key')",
                              "aprfast[signing]"),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_feature_without_its_package_names_the_extra(feature):
    hidden, call, extra = FEATURES[feature]
    body = ("import os, tempfile, numpy as np, aprfast\n"
            "from aprfast._optional import MissingDependencyError\n"
            "p = os.path.join(tempfile.mkdtemp(), 'm.apr')\n"
            "try:\n"
            f"    {call}\n"
            "except ImportError as exc:\n"
            "    print('ERROR', type(exc).__name__, exc)\n"
            "else:\n"
            "    print('NO ERROR')\n")
    out = run(hidden, body)
    assert out.returncode == 0, out.stderr
    assert "ERROR MissingDependencyError" in out.stdout, out.stdout
    assert extra in out.stdout


def _declared_extras():
    """(the project's root, pyproject's optional-dependencies); skips where pyproject is
    not next to the tests (an installed package)."""
    tomllib = pytest.importorskip("tomllib")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "pyproject.toml")
    if not os.path.exists(path):
        pytest.skip("pyproject.toml is not next to the tests (installed package)")
    with open(path, "rb") as f:
        return root, tomllib.load(f)["project"]["optional-dependencies"]


def test_every_extra_named_in_the_code_exists_in_pyproject():
    _, extras = _declared_extras()
    for module, (extra, _) in EXTRAS.items():
        assert extra in extras, f"{module}: extra {extra!r} is not declared"
    for name in ("keyfiles", "crypto", "compression", "v1", "all"):
        assert name in extras


def test_every_extra_named_in_docs_examples_and_tests_exists_in_pyproject():
    """``aprfast[NAME]`` in the README, docs/ (the site's pages, in subfolders too), examples/
    and the tests' skip reasons (such as the examples' extras, dask and ray, which no aprfast
    module imports) is declared."""
    import glob
    import re

    root, extras = _declared_extras()
    files = [os.path.join(root, "README.md")] + [p for pattern in ("docs/**/*.md", "examples/*.py", "tests/*.py")
                                                  for p in glob.glob(os.path.join(root, pattern), recursive=True)]
    named = {}
    for name in files:
        if not os.path.exists(name):
            continue
        with open(name, encoding="utf-8") as f:
            for group in re.findall(r"aprfast\[([a-z0-9_,-]+)\]", f.read()):
                for extra in group.split(","):
                    named.setdefault(extra, os.path.relpath(name, root))
    assert {"ray", "dask"} <= set(named), sorted(named)
    missing = {extra: where for extra, where in named.items() if extra not in extras}
    assert not missing, f"extras named but not declared in pyproject.toml: {missing}"


def test_the_framework_adapters_name_their_extra_when_the_framework_is_missing(tmp_path):
    # issue 28 item 6: one kind of missing-dependency error, the adapters included
    code = ("import sys, numpy as np, aprfast\n"
            "sys.modules['torch'] = None; sys.modules['jax'] = None\n"
            "aprfast.save_file({'a': np.zeros(2, np.float32)}, sys.argv[1])\n"
            "for stmt in ('import aprfast.torch', 'import aprfast.jax', "
            "'aprfast.safe_open(sys.argv[1], \"pt\")', 'aprfast.safe_open(sys.argv[1], \"jax\")'):\n"
            "    try:\n"
            "        exec(stmt)\n"
            "    except aprfast.MissingDependencyError as exc:\n"
            "        print('aprfast[torch]' in str(exc) or 'aprfast[jax]' in str(exc))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.apr")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"] * 4
