"""``get_tensors(names)`` on a sharded model and on every kind of v1 file: the contract
of ``AprFile.get_tensors`` (values as ``get_tensor`` gives them, in the order asked,
repeats read once, a missing name refused with TensorNotFoundError before anything is
read)."""

from __future__ import annotations

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.errors import AprIOError, TensorNotFoundError


def _tensors():
    rng = np.random.default_rng(3)
    out = {f"blk.{i}.w": rng.standard_normal((4, 8)).astype(np.float32) for i in range(6)}
    out["norm"] = rng.standard_normal(8).astype(np.float16)
    out["ids"] = np.arange(5, dtype=np.int64)
    out["scalar"] = np.float32(1.25)
    return out


ASKED = ["ids", "blk.5.w", "blk.0.w", "ids", "norm", "scalar", "blk.5.w"]
WANT_ORDER = ["ids", "blk.5.w", "blk.0.w", "norm", "scalar"]


def _check(f, want):
    for copy in (False, True):
        got = f.get_tensors(ASKED, copy=copy)
        assert list(got) == WANT_ORDER
        for name, value in got.items():
            assert value.dtype == want[name].dtype and value.shape == np.shape(want[name])
            np.testing.assert_array_equal(value, want[name])
            np.testing.assert_array_equal(value, f.get_tensor(name))
            if copy:  # owned: writable, sharing no memory with the file's view
                assert value.flags.writeable and not np.shares_memory(value, f.get_tensor(name))
    assert f.get_tensors([]) == {}
    assert list(f.get_tensors(iter(["norm", "ids"]))) == ["norm", "ids"]  # any iterable
    with pytest.raises(TensorNotFoundError) as info:
        f.get_tensors(["ids", "missing"])
    assert isinstance(info.value, KeyError) and "missing" in str(info.value)


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_sharded_get_tensors(tmp_path, mode):
    want = _tensors()
    path = tmp_path / "model.apr"
    aprfast.save_file(want, path, max_shard_size=300)  # several shards
    with aprfast.open(path, mode=mode) as f:
        assert type(f).__name__ == "ShardedFile" and len({f.shard_of(n) for n in want}) > 2
        _check(f, want)


def test_sharded_get_tensors_opens_only_the_shards_it_needs_and_none_for_a_missing_name(tmp_path):
    want = _tensors()
    path = tmp_path / "model.apr"
    aprfast.save_file(want, path, max_shard_size=300)
    with aprfast.open(path) as f:
        with pytest.raises(TensorNotFoundError):
            f.get_tensors(["blk.0.w", "nope"])
        assert f.opened_shards() == []  # checked against the manifest before any shard opened
        f.get_tensors(["blk.0.w"])
        assert f.opened_shards() == [f.shard_of("blk.0.w")]
    with pytest.raises(AprIOError):
        f.get_tensors(["blk.0.w"])  # closed


@pytest.mark.parametrize("kind", ["plain", "whole", "streaming", "trueno"])
@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_v1_get_tensors(tmp_path, kind, mode):
    want = _tensors()
    if kind == "trueno":  # TRUENO_NATIVE holds F32, F16, BF16, I8 and U8 only
        want["ids"] = np.arange(5, dtype=np.int8)
    options = {"plain": {}, "whole": {"compression": "zstd"}, "streaming": {"streaming": True, "chunk_size": 64},
               "trueno": {"trueno_native": True}}[kind]
    path = tmp_path / "v1.apr"
    v1.save_model(want, path, **options)
    with aprfast.open(path, mode=mode) as f:
        assert type(f).__name__ == "V1File" and f.kind == kind
        _check(f, want)
    with pytest.raises(AprIOError):
        f.get_tensors(["ids"])  # closed
