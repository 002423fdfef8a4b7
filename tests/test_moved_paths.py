"""Nothing users wrote before the package was split into layers breaks (issue 24).

Every module path of the flat layout still imports and is the moved module itself; public
old paths warn once with a DeprecationWarning naming the new path, private ones (named
only by pickles) and the documented ``aprfast.stats``/``aprfast.distributed`` answer
silently.  Pickles made by the flat layout (commit 0579739, in tests/pickles/) still
unpickle.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import aprfast
from aprfast import _moved

PICKLES = Path(__file__).parent / "pickles"
TINY = Path(__file__).parent.parent / "examples" / "tiny.apr"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_old_path_is_the_moved_module(old):
    new, warns = _moved.MOVED[old]
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    if warns:
        assert messages == [messages[0]] and new in messages[0] and old in messages[0]
    else:
        assert messages == []


def test_public_paths_kept_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import aprfast.crypto
        import aprfast.distributed
        import aprfast.stats
        import aprfast.v1
        from aprfast.codecs import compress  # noqa: F401  (the old flat module's names)
        from aprfast.crypto import sign  # noqa: F401

        assert aprfast.v1.save_model and aprfast.distributed.load_shard and aprfast.stats.tensor_stats
        for name in aprfast.__all__:
            assert getattr(aprfast, name) is not None


def test_a_handle_pickled_before_the_move_reopens(tmp_path):
    data = (PICKLES / "aprfile-0579739.pkl0").read_bytes()
    data = data.replace(b"/PLACEHOLDER-PATH-FOR-PICKLE-COMPAT/tiny.apr", str(TINY.resolve()).encode())
    sys.modules.pop("aprfast._pickling", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pickle names aprfast._pickling: no warning for a path nobody wrote
        handle = pickle.loads(data)
    with handle, aprfast.open(TINY) as fresh:
        assert type(handle) is aprfast.AprFile and handle.keys() == fresh.keys()
        for name in fresh.keys():
            assert handle.get_tensor(name).tobytes() == fresh.get_tensor(name).tobytes()


def test_tensor_info_and_dtype_pickled_before_the_move_load():
    info = pickle.loads((PICKLES / "tensorinfo-0579739.pkl").read_bytes())
    dtype = pickle.loads((PICKLES / "dtype-0579739.pkl").read_bytes())
    with aprfast.open(TINY) as f:
        now = f.info("encoder.bias")
    # a DType is compared by identity (one object per type in the registry); an unpickled
    # one is a twin with the same fields, as it was before the move
    assert dataclasses.replace(info, dtype=now.dtype) == now and info.dtype.name == now.dtype.name == "F32"
    assert isinstance(dtype, aprfast.DType) and dtype.name == "F32" and dtype.itemsize == 4


def test_import_aprfast_loads_no_cli_tool_or_crypto_module():
    code = ("import sys, aprfast; print(sorted(m for m in sys.modules if m.startswith(("
            "'aprfast.cli', 'aprfast.tui', 'aprfast.tools', 'aprfast.crypto.core'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
