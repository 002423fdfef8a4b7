"""Eager loads of many small tensors (_index.Entries.tensors_in: every array made with
NumPy's C API in one pass over the index, the pure twin with np.ndarray, while the data
section is read on a thread of its own: _memory.BackgroundRead) and AprFile.get_tensors'
batched reads."""

from __future__ import annotations

import errno
import gc
import os
import sys
import zlib

import hostile_builders as hb
import numpy as np
import pytest

import aprfast
from aprfast import RawTensor, _memory
from aprfast.errors import AprIOError, ChecksumError, CorruptError, TensorNotFoundError
from aprfast.files import reader
from aprfast.io import sources


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
    """tensors_in over a buffer of the data section gives what views of the map, made
    one by one, give (the pure twin runs the same test in the suite's pure-backend pass)."""
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
        views = {name: f.get_tensor(name) for name in f.keys()}
    assert list(got) == list(views)
    for name in views:
        np.testing.assert_array_equal(np.asarray(getattr(got[name], "data", got[name])),
                                      np.asarray(getattr(views[name], "data", views[name])))


def _same_view(got, one):
    """``got`` (from tensors()) is what get_tensor gave as ``one``: the same type, bytes,
    dtype, shape and flags."""
    assert type(got) is type(one)
    if not isinstance(one, np.ndarray):  # QuantizedTensor, RawTensor: same bytes
        assert got.shape == one.shape and got.dtype == one.dtype
        assert np.asarray(got.data).tobytes() == np.asarray(one.data).tobytes()
        return
    assert got.dtype == one.dtype and got.shape == one.shape and got.strides == one.strides
    np.testing.assert_array_equal(got, one)
    assert not got.flags.owndata and got.flags.c_contiguous
    assert got.flags.writeable == one.flags.writeable
    if got.nbytes:
        assert got.ctypes.data == one.ctypes.data  # the same bytes of the map: a view, not a copy


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_mapped_tensors_in_one_pass(tmp_path, layout):
    """tensors() of a mapped file (load_file's default) builds every view in one pass
    (_index.Entries.tensors_in over the map): the same views get_tensor makes one by
    one, read-only, keeping the map alive after the file is closed."""
    want = _moe(quantized=layout == "apr2")
    if layout == "apr2":  # one storage under two names
        want["tied.a"] = want["tied.b"] = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "moe.apr"
    aprfast.save_file(want, path, layout=layout)
    with aprfast.open(path) as f:
        views = f.tensors()
        one_by_one = {name: f.get_tensor(name) for name in f.keys()}
    assert list(views) == list(one_by_one) == sorted(want)
    for name in views:
        _same_view(views[name], one_by_one[name])
        if isinstance(views[name], np.ndarray):
            assert not views[name].flags.writeable
    # every view has the one base np.ndarray gives a view of the map (the mapped array)
    assert views["l0.experts.0.gate"].base is views["l2.experts.9.gate"].base
    loaded = aprfast.load_file(path)  # the handle is closed on return
    del views, one_by_one
    gc.collect()
    for name, value in want.items():  # the map lives as long as the arrays do
        if isinstance(value, aprfast.QuantizedTensor):
            assert np.asarray(loaded[name].data).tobytes() == np.asarray(value.data).tobytes()
            continue
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == np.asarray(value).dtype
    with pytest.raises(ValueError, match="read-only"):
        loaded["l0.experts.0.gate"][0, 0] = 1


_SHAPES = {"a": ((5,), np.float32), "b": ((0, 4), np.int32), "c": ((), np.float64), "d": ((2, 3, 4), np.float16),
           "e": ((1, 1, 5), np.uint8), "f": ((3,), np.bool_), "g": ((2, 0, 3), np.int64), "h": ((4, 1), np.int16)}


@pytest.mark.parametrize("kind", ["aligned", "aligned-memoryview", "bytes", "bytearray", "read-only-array"])
def test_tensors_in_makes_what_np_ndarray_makes(kind):
    """Each array tensors_in makes (compiled: NumPy's C API; pure: np.ndarray) is the one
    np.ndarray(shape, dtype, buffer, offset) makes: dtype, shape, strides, every flag
    (writable exactly when the buffer is), address and base (a memoryview's object)."""
    rng = np.random.default_rng(3)
    want = {name: (rng.standard_normal(shape) * 9).astype(dtype) for name, (shape, dtype) in _SHAPES.items()}
    blob = aprfast.save(want)
    with aprfast.open(blob) as f:
        parsed = f._file
    section = blob[parsed.data_start:parsed.data_start + parsed.data_len]
    if kind.startswith("aligned"):
        owner = _memory.AlignedBuffer(len(section), 64)
        memoryview(owner)[:] = section
        buffer = memoryview(owner) if kind == "aligned-memoryview" else owner
    elif kind == "bytes":
        buffer = owner = bytes(section)
    elif kind == "bytearray":
        buffer = owner = bytearray(section)
    else:
        buffer = owner = np.frombuffer(bytes(section), np.uint8)
    got = parsed.entries.tensors_in(parsed.data_start, buffer, parsed.data_start, reader._plain_dtypes(parsed.ids),
                                    reader._maker_for(parsed.ids))
    assert list(got) == sorted(want)
    for name, value in want.items():
        _type, offset, _size, shape = parsed.entries.row(parsed.entries.find(name), 0)
        ref = np.ndarray(shape, value.dtype, buffer, offset)
        one = got[name]
        assert type(one) is np.ndarray and one.dtype == ref.dtype and one.shape == ref.shape == value.shape
        assert one.strides == ref.strides and one.flags == ref.flags
        assert one.ctypes.data == ref.ctypes.data and one.base is ref.base
        np.testing.assert_array_equal(one, value)
    assert got["a"].flags.writeable == (kind not in ("bytes", "read-only-array"))
    assert got["a"].base is got["d"].base  # one base for all (the pure twin's AlignedBuffer is an ndarray:
    assert got["a"].base is owner or aprfast.backend == "python"  # NumPy picks its bottom there)
    # an extent past the buffer is refused as np.ndarray refuses it, not read
    with pytest.raises(TypeError, match="too small"):
        last = parsed.entries.row(parsed.entries.find("h"), 0)[1]
        parsed.entries.tensors_in(parsed.data_start, bytes(section[:last + 4]), parsed.data_start,
                                  reader._plain_dtypes(parsed.ids), reader._maker_for(parsed.ids))


def test_tensors_of_a_writable_buffer_are_writable_as_get_tensor_gives_them():
    want = _moe(layers=1, experts=4, quantized=False)
    blob = bytearray(aprfast.save(want))
    with aprfast.open(blob) as f:
        views = f.tensors()
        for name in f.keys():
            _same_view(views[name], f.get_tensor(name))
    assert views["l0.experts.1.up"].flags.writeable
    views["l0.experts.1.up"][0, 0] = 7  # the caller's buffer, as get_tensor's view would write
    with aprfast.open(blob) as f:
        assert f.get_tensor("l0.experts.1.up")[0, 0] == 7
        for neighbour in ("l0.experts.0.up", "l0.experts.2.up", "l0.experts.1.gate"):
            np.testing.assert_array_equal(f.get_tensor(neighbour), want[neighbour])


@pytest.mark.parametrize("layout", [hb.APRENDER, hb.APR2])
def test_mapped_tensors_with_an_unknown_dtype(layout):
    """An unknown dtype id (unknown_dtypes="raw") between runs of plain tensors: a
    RawTensor of its bytes, the runs around it views as before."""
    parts = hb.honest(layout, {f"a{i}": np.full(4, i, np.float32) for i in range(6)})
    parts.entries.insert(3, hb.Entry("a2x", 200, (3,), len(parts.data), 6))
    parts.data += hb.pad(b"\x01\x02\x03\x04\x05\x06")
    data = hb.build(layout, parts)
    with aprfast.open(data, unknown_dtypes="raw") as f:
        views = f.tensors()
        for name in f.keys():
            _same_view(views[name], f.get_tensor(name))
    assert isinstance(views["a2x"], RawTensor) and views["a2x"].dtype_id == 200
    assert views["a2x"].data.tobytes() == b"\x01\x02\x03\x04\x05\x06"
    assert [views[f"a{i}"][0] for i in range(6)] == list(range(6))
    assert aprfast.load(data, unknown_dtypes="raw")["a2x"].data.tobytes() == views["a2x"].data.tobytes()


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_readinto_many(tmp_path, kind):
    """Source.readinto_many (get_tensors' buffered reads): each buffer filled from its
    offset; every range checked before anything is read; a file that shrank is corrupt."""
    data = bytes(range(256)) * 16
    path = tmp_path / "bytes"
    path.write_bytes(data)
    with open(path, "rb") as fh:
        source = sources.FileSource(fh.fileno(), str(path)) if kind == "file" else sources.StreamSource(fh)
        first, second, empty = bytearray(10), _memory.AlignedBuffer(300, 64), bytearray()
        source.readinto_many([(5, first), (3000, second), (4096, empty)])
        assert bytes(first) == data[5:15] and bytes(second) == data[3000:3300]
        untouched = bytearray(4)
        with pytest.raises(CorruptError):
            source.readinto_many([(0, untouched), (4090, bytearray(8))])
        assert untouched == bytearray(4)
        if kind == "file":
            os.truncate(path, 100)  # the size checked at open no longer holds
            with pytest.raises(CorruptError, match="shrank"):
                source.readinto_many([(0, bytearray(4)), (200, bytearray(8))])
        source.close()


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
        many = type(source).readinto_many
        monkeypatch.setattr(type(source), "readinto_many",
                            lambda self, pieces: reads.extend(o for o, _ in pieces) or many(self, pieces))
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
        assert all(v.ctypes.data % 64 == 0 for v in copies.values() if isinstance(v, np.ndarray) and v.nbytes)
        with pytest.raises(TensorNotFoundError):
            f.get_tensors(["l0.norm", "nope"])
        assert f.get_tensors([]) == {}
    gc.collect()  # the handle is closed: each array's base keeps its buffer alive
    for name in ("l1.experts.3.up", "far", "l0.norm"):
        np.testing.assert_array_equal(copies[name], want[name])
        if mode != "mmap":
            np.testing.assert_array_equal(got[name], want[name])


def _python_calls(fn):
    """How many Python functions run during fn() (C functions not counted)."""
    calls = [0]

    def profile(frame, event, arg):
        if event == "call":
            calls[0] += 1
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


@pytest.mark.parametrize("mode", ["mmap", "mmap-copy", "pread", "direct"])
def test_no_python_runs_per_tensor(tmp_path, mode):
    """get_tensors and an eager load run the same Python code for 20 tensors as for
    2,000: the names are found, the reads planned and the arrays made in C and NumPy
    (issue 29 item 6: O(1) Python work per tensor)."""
    if aprfast.backend == "python":
        pytest.skip("the pure twins are Python per tensor by nature")
    want = {f"t.{i:05d}": np.full(16, i, np.float32) for i in range(2000)}
    path = tmp_path / "many.apr"
    aprfast.save_file(want, path)
    names = list(want)
    mode, copy = ("mmap", True) if mode == "mmap-copy" else (mode, False)
    with aprfast.open(path, mode=mode) as f:
        f.get_tensors(names[:3], copy=copy)  # first calls: makers, dtype tables
        few = _python_calls(lambda: f.get_tensors(names[:20], copy=copy))
        many = _python_calls(lambda: f.get_tensors(names[::-1], copy=copy))
        got = f.get_tensors(names[::-1], copy=copy)
    assert many <= few  # (20 names may take a Python helper 2,000 do not: the small direct arena)
    assert list(got) == names[::-1]
    for name in names[::97]:
        np.testing.assert_array_equal(got[name], want[name])
        assert got[name].flags.writeable == (copy or mode != "mmap") and got[name].ctypes.data % 64 == 0
    # (half the tensors: the index still past the first 16 KiB read at open, as the whole one)
    half = tmp_path / "half.apr"
    aprfast.save_file({name: want[name] for name in names[:1000]}, half)
    aprfast.load_file(half, mmap=mode == "mmap")
    assert _python_calls(lambda: aprfast.load_file(path, mmap=mode == "mmap")) == \
        _python_calls(lambda: aprfast.load_file(half, mmap=mode == "mmap"))


@pytest.mark.parametrize("mode", ["mmap", "mmap-copy", "pread", "direct"])
def test_get_tensors_gives_what_get_tensor_gives(tmp_path, mode):
    """Every kind of tensor (plain, 0-d, empty, packed, unknown dtype id) from
    get_tensors is what get_tensor gives for the name: type, dtype, shape, strides,
    writability, values; owned arrays 64-byte aligned."""
    parts = hb.honest(hb.APR2, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.float64(2.5),
                                "c": np.zeros((0, 3), np.int32), "d": np.arange(5, dtype=np.int8)})
    parts.entries.insert(1, hb.Entry("a2", 200, (3,), len(parts.data), 6))
    parts.data += hb.pad(b"\x01\x02\x03\x04\x05\x06")
    path = tmp_path / "kinds.apr"
    path.write_bytes(hb.build(hb.APR2, parts))
    mode, copy = ("mmap", True) if mode == "mmap-copy" else (mode, False)
    with aprfast.open(path, mode=mode, unknown_dtypes="raw") as f:
        names = ["d", "a2", "b", "c", "a"]
        got = f.get_tensors(names, copy=copy)
        assert list(got) == names
        for name in names:
            one = f.get_tensor(name, copy=copy)
            assert type(got[name]) is type(one)
            if isinstance(one, np.ndarray):
                assert got[name].dtype == one.dtype and got[name].shape == one.shape
                assert got[name].strides == one.strides and got[name].flags.writeable == one.flags.writeable
                np.testing.assert_array_equal(got[name], one)
                if (copy or mode != "mmap") and one.nbytes:
                    assert got[name].ctypes.data % 64 == 0
            else:
                assert np.asarray(got[name].data).tobytes() == np.asarray(one.data).tobytes()


@pytest.mark.parametrize("mode", ["mmap-copy", "pread", "direct"])
def test_get_tensors_shares_a_buffer_among_small_spans_only(tmp_path, mode):
    """Spread small tensors are read into one shared buffer (one allocation per call, not
    one per span), each still 64-byte aligned; a span of 1 MiB or more has a buffer of
    its own, so keeping a small tensor does not keep a large one's memory."""
    want = {f"s{i}": np.full(100 + i, i, np.float32) for i in range(6)}
    for i in range(5):  # 256 KiB between the small ones: a span each
        want[f"s{i}.gap"] = np.zeros(1 << 16, np.float32)
    want["s3.h"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB, after s3.gap and before s3.i (sorted)
    want["s3.i"] = np.zeros(1 << 16, np.float32)
    path = tmp_path / "spread.apr"
    aprfast.save_file(want, path)
    names = ["s5", "s3.h", "s0", "s2", "s4", "s1", "s3"]
    mode, copy = ("mmap", True) if mode == "mmap-copy" else (mode, False)
    with aprfast.open(path, mode=mode) as f:
        got = f.get_tensors(names, copy=copy)
    assert list(got) == names
    for name in names:
        np.testing.assert_array_equal(got[name], want[name])
        assert got[name].flags.writeable and got[name].ctypes.data % 64 == 0
    if mode != "direct":  # (direct I/O places each span for the device instead)
        assert len({id(got[f"s{i}"].base) for i in range(6)}) == 1
    assert got["s3.h"].base is not got["s0"].base


# --- the read overlapped with making the arrays (AprFile.load_all) -------------------------
def _overlapping_file(tmp_path, extra=64):
    """A file just over both overlap bounds: (path, tensors)."""
    n = reader.OVERLAP_MIN_TENSORS + extra
    elems = max(256, -(-reader.OVERLAP_MIN_BYTES // (4 * n)))
    rng = np.random.default_rng(7)
    want = {f"t.{i:05d}": rng.standard_normal(elems, dtype=np.float32) for i in range(n)}
    path = tmp_path / "overlap.apr"
    aprfast.save_file(want, path)
    return path, want


@pytest.fixture
def starts(monkeypatch):
    """The offsets FileSource.readinto_start was called with."""
    calls = []
    original = sources.FileSource.readinto_start
    monkeypatch.setattr(sources.FileSource, "readinto_start",
                        lambda self, offset, out, **kw: calls.append(offset) or original(self, offset, out, **kw))
    return calls


def test_an_overlapped_load_gives_what_a_sequential_one_gives(tmp_path, monkeypatch, starts):
    path, want = _overlapping_file(tmp_path)
    overlapped = aprfast.load_file(path, mmap=False)
    assert len(starts) == 1
    with aprfast.open(path, mode="pread") as f:
        unchecked = f.load_all(verify=False)  # no CRC asked of the read
    assert len(starts) == 2
    monkeypatch.setattr(reader, "OVERLAP_MIN_TENSORS", 1 << 62)
    sequential = aprfast.load_file(path, mmap=False)
    assert len(starts) == 2
    for got in (overlapped, unchecked):
        assert list(got) == list(sequential) == list(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)
            assert got[name].flags.writeable and got[name].ctypes.data % 64 == 0
            assert got[name].dtype == sequential[name].dtype and got[name].shape == sequential[name].shape
    gc.collect()
    np.testing.assert_array_equal(overlapped["t.00000"], want["t.00000"])  # the arena outlives the handle


def test_few_or_small_tensors_are_read_before_the_arrays_are_made(tmp_path, starts):
    few = {f"t.{i}": np.full(1 << 14, i, np.float32) for i in range(reader.OVERLAP_MIN_TENSORS // 8)}
    small = {f"t.{i:05d}": np.full(4, i, np.float32) for i in range(reader.OVERLAP_MIN_TENSORS + 1)}
    for i, tensors in enumerate((few, small)):
        aprfast.save_file(tensors, tmp_path / f"{i}.apr")
        got = aprfast.load_file(tmp_path / f"{i}.apr", mmap=False)
        np.testing.assert_array_equal(got["t.1" if i == 0 else "t.00001"], tensors["t.1" if i == 0 else "t.00001"])
    assert starts == []


def test_an_overlapped_load_still_refuses_a_damaged_tensor(tmp_path, starts):
    path, want = _overlapping_file(tmp_path)
    with aprfast.open(path) as f:
        info = f.info(list(want)[len(want) // 2])
    data = bytearray(path.read_bytes())
    data[info.offset + info.nbytes // 2] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError) as raised:
        aprfast.load_file(path, mmap=False)
    assert raised.value.code == "E004" and "[E004]" in str(raised.value)
    assert len(starts) == 1
    with aprfast.open(path, mode="pread") as f:  # unchecked: the damage is loaded as it is
        assert f.load_all(verify=False)[info.name].tobytes() != want[info.name].tobytes()


def test_an_overlapped_read_that_fails_raises_the_typed_error_and_leaves_the_source(tmp_path, monkeypatch):
    path, _ = _overlapping_file(tmp_path)
    with aprfast.open(path, mode="pread") as f:
        os.truncate(path, os.path.getsize(path) // 2)  # the size checked at open no longer holds
        with pytest.raises(CorruptError, match="shrank"):
            f.load_all()
        assert f._source._users == 0

    class Failing:
        def __init__(self, fd, offset, dst, threads=0, crc=None):
            pass

        def wait(self):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    path, _ = _overlapping_file(tmp_path)
    monkeypatch.setattr(sources._memory, "BackgroundRead", Failing)
    with aprfast.open(path, mode="pread") as f:
        with pytest.raises(AprIOError, match="read of .* failed") as raised:
            f.load_all()
        assert isinstance(raised.value.__cause__, OSError) and f._source._users == 0


def test_an_error_making_the_arrays_waits_for_the_read_and_is_what_is_raised(tmp_path, monkeypatch):
    path, _ = _overlapping_file(tmp_path)
    waited = []
    original = sources._PendingRead.wait
    monkeypatch.setattr(sources._PendingRead, "wait", lambda self: waited.append(1) or original(self))

    def broken(*args, **kwargs):
        raise MemoryError("no arrays today")
    monkeypatch.setattr(reader, "_slice_arena", broken)
    with aprfast.open(path, mode="pread") as f:
        os.truncate(path, f._file.data_start + 10)  # the read fails too: its error is not the one raised
        with pytest.raises(MemoryError, match="no arrays today"):
            f.load_all()
        assert waited == [1] and f._source._users == 0


def test_readinto_start_checks_the_range_and_the_source_and_counts_the_read_in_flight(tmp_path):
    data = os.urandom(3 << 20)
    path = tmp_path / "bytes"
    path.write_bytes(data)
    with open(path, "rb") as fh:
        source = sources.FileSource(fh.fileno(), str(path), mappable=False)
        out = _memory.AlignedBuffer(len(data) - 10)
        pending = source.readinto_start(10, out, crc=5)
        assert source._users == 1
        assert pending.wait() == pending.wait() == zlib.crc32(data[10:], 5)
        assert bytes(out) == data[10:] and source._users == 0
        with pytest.raises(CorruptError, match="lies outside"):
            source.readinto_start(11, out)
        dropped = source.readinto_start(0, bytearray(100))  # never waited for: leaves when freed
        del dropped
        gc.collect()
        assert source._users == 0
        source.close()
        with pytest.raises(AprIOError, match="closed"):
            source.readinto_start(0, bytearray(1))
    streamed = sources.StreamSource(__import__("io").BytesIO(data))  # the base class: read at once
    out = bytearray(20)
    assert streamed.readinto_start(5, out, crc=0).wait() == zlib.crc32(data[5:25]) and bytes(out) == data[5:25]


# --- _memory.BackgroundRead ------------------------------------------------------------------
@pytest.fixture
def data_file(tmp_path):
    data = os.urandom((5 << 20) + 123)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_background_read_gives_the_bytes_and_their_crc(data_file, threads):
    fd, data = data_file
    out = _memory.AlignedBuffer(len(data) - 77)
    read = _memory.BackgroundRead(fd, 77, out, threads, 12345)
    assert read.wait() == zlib.crc32(data[77:], 12345)
    assert read.wait() == zlib.crc32(data[77:], 12345)  # again: the same, no second read
    assert bytes(out) == data[77:]
    small = bytearray(10)
    assert _memory.BackgroundRead(fd, 3, small).wait() is None and bytes(small) == data[3:13]
    assert _memory.BackgroundRead(fd, 0, bytearray(), crc=7).wait() == 7  # nothing to read


def test_background_read_past_the_end_raises_eof_error_on_every_wait(data_file):
    fd, data = data_file
    read = _memory.BackgroundRead(fd, len(data) - 5, bytearray(10), crc=0)
    for _ in range(2):
        with pytest.raises(EOFError, match="file ended before 10 bytes at offset"):
            read.wait()
    bad = _memory.BackgroundRead(-1, 0, bytearray(10))
    for _ in range(2):
        with pytest.raises(OSError) as raised:
            bad.wait()
        assert raised.value.errno == errno.EBADF
    with pytest.raises(OverflowError):
        _memory.BackgroundRead(fd, 0, bytearray(10), crc=1 << 32)


def test_a_background_read_dropped_unwaited_still_fills_its_buffer(data_file):
    fd, data = data_file
    outs = [bytearray(len(data)) for _ in range(4)]
    reads = [_memory.BackgroundRead(fd, 0, out, crc=0) for out in outs]
    del reads  # freed unwaited: each waits for its read as it goes
    gc.collect()
    assert all(bytes(out) == data for out in outs)
    out = bytearray(len(data))
    read = _memory.BackgroundRead(fd, 0, out)
    read.wait()
    out.extend(b"x")  # the buffer is let go after the read: a bytearray may grow again
    del read
