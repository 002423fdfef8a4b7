"""Eager loads of many small tensors (_index.Entries.tensors_in: runs of same-shaped
tensors become rows of one strided array) and AprFile.get_tensors' batched reads."""

from __future__ import annotations

import numpy as np
import pytest

import aprfast
from aprfast.errors import TensorNotFoundError
from aprfast.files import reader


def _moe(layers=3, experts=10, quantized=True):
    """Interleaved shapes, as sorted MoE names give them: gate/up (8, 16), down (16, 8)
    per expert, a norm and a router per layer, plus dtypes and shapes that break runs."""
    rng = np.random.default_rng(0)
    out = {}
    for layer in range(layers):
        for e in range(experts):
            for proj, shape in (("down", (16, 8)), ("gate", (8, 16)), ("up", (8, 16))):
                out[f"l{layer}.experts.{e}.{proj}"] = rng.standard_normal(shape).astype(np.float16)
        out[f"l{layer}.norm"] = rng.standard_normal(16, dtype=np.float32)
        out[f"l{layer}.router"] = rng.standard_normal((experts, 16), dtype=np.float32)
    out["scalar"] = np.float32(2.5)
    out["empty"] = np.zeros((0, 4), np.int32)
    out["empty2"] = np.zeros((0, 4), np.int32)
    if quantized:  # the apr2 layout only
        out["q"] = aprfast.quantize(np.ones((2, 32), np.float32), "q8_0")
    out["odd"] = np.arange(7, dtype=np.int8)
    return out


def _check(got, want):
    assert list(got) == sorted(want)
    for name, value in want.items():
        if isinstance(value, aprfast.QuantizedTensor):
            assert got[name].dtype == value.dtype and np.array_equal(np.asarray(got[name].data),
                                                                     np.asarray(value.data))
            continue
        value = np.asarray(value)
        assert got[name].shape == value.shape and got[name].dtype == value.dtype
        np.testing.assert_array_equal(got[name], value)
        assert got[name].flags.writeable and got[name].flags.c_contiguous


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
@pytest.mark.parametrize("backend", ["pread", "direct"])
def test_eager_load_of_interleaved_small_tensors(tmp_path, layout, backend):
    want = _moe(quantized=layout == "apr2")
    path = tmp_path / "moe.apr"
    aprfast.save_file(want, path, layout=layout)
    got = aprfast.load_file(path, backend=backend)
    _check(got, want)
    for value in got.values():
        if isinstance(value, np.ndarray):
            assert value.ctypes.data % 64 == 0
    got["l0.experts.0.gate"][0, 0] = 99  # one tensor's bytes, not its neighbours'
    assert got["l0.experts.1.gate"][0, 0] == want["l0.experts.1.gate"][0, 0]


def test_runs_match_the_mapped_views(tmp_path):
    """tensors_in over a buffer of the data section gives what views of the map give
    (the pure twin runs the same test in the suite's pure-backend pass)."""
    want = _moe(layers=2, experts=5)
    path = tmp_path / "moe.apr"
    aprfast.save_file(want, path)
    with aprfast.open(path, mode="pread") as f:
        parsed = f._file
        arena = reader.aligned_empty(parsed.data_len)
        f._source.readinto(parsed.data_start, arena)
        got = parsed.entries.tensors_in(parsed.data_start, arena.base, parsed.data_start,
                                        reader._plain_dtypes(parsed.ids), reader._maker_for(parsed.ids))
    with aprfast.open(path) as f:
        views = f.tensors()
    assert list(got) == list(views)
    for name in views:
        np.testing.assert_array_equal(np.asarray(getattr(got[name], "data", got[name])),
                                      np.asarray(getattr(views[name], "data", views[name])))


def test_twenty_thousand_tensors(tmp_path):
    rng = np.random.default_rng(1)
    want = {f"e.{i:05d}": rng.standard_normal(int(rng.integers(1, 4)) * 16, dtype=np.float32) for i in range(20000)}
    path = tmp_path / "many.apr"
    aprfast.save_file(want, path)
    got = aprfast.load_file(path, mmap=False)
    assert len(got) == 20000
    for name in list(want)[::997]:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("mode", ["mmap", "pread", "direct"])
def test_get_tensors_batches_reads(tmp_path, mode, monkeypatch):
    want = _moe(layers=2, experts=4)
    want["far"] = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: a gap the batch does not read
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    names = ["l1.experts.3.up", "far", "l0.norm", "scalar", "l0.norm", "q"]
    with aprfast.open(path, mode=mode) as f:
        reads = []
        source = f._source
        original = type(source).readinto
        monkeypatch.setattr(type(source), "readinto",
                            lambda self, offset, out, **kw: reads.append(offset) or original(self, offset, out, **kw))
        got = f.get_tensors(names)
        assert list(got) == ["l1.experts.3.up", "far", "l0.norm", "scalar", "q"]
        for name in got:
            value = want[name]
            if isinstance(value, aprfast.QuantizedTensor):
                assert np.array_equal(np.asarray(got[name].data), np.asarray(value.data))
            else:
                np.testing.assert_array_equal(got[name], value)
        if mode != "mmap":
            assert len(reads) <= 3  # not one read per tensor
        copies = f.get_tensors(names, copy=True)
        assert all(v.flags.writeable for v in copies.values() if isinstance(v, np.ndarray))
        with pytest.raises(TensorNotFoundError):
            f.get_tensors(["l0.norm", "nope"])
        assert f.get_tensors([]) == {}
