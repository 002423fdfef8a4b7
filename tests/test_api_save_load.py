"""The safetensors-shaped API: save_file/save/load_file/load/open/inspect, end to end."""

import gc
import io
import os
import stat
import struct
import textwrap
import threading
import zlib

import numpy as np
import pytest
from ml_dtypes import bfloat16

import aprfast
from aprfast.errors import AprError, AprIOError, LayoutError, TensorNotFoundError


def sample_tensors():
    rng = np.random.default_rng(7)
    return {
        "embed.weight": rng.standard_normal((32, 16)).astype(np.float32),
        "norm.bias": np.array([-0.0, np.nan, np.inf, 1.0], np.float16),
        "step": np.array(12345, np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "ids": np.arange(-5, 5, dtype=np.int8),
    }


def assert_tensors_equal(got, want):
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def dir_entries(path):
    return sorted(os.listdir(path))


# --- atomic writes -------------------------------------------------------------------
class ExplodingArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no array for you")


def test_save_file_leaves_target_unchanged_when_a_tensor_cannot_be_read(tmp_path):
    target = tmp_path / "model.apr"
    target.write_bytes(b"previous contents")
    with pytest.raises(LayoutError, match="bad"):
        aprfast.save_file({"good": np.ones(3), "bad": ExplodingArray()}, target)
    assert target.read_bytes() == b"previous contents"
    assert dir_entries(tmp_path) == ["model.apr"]


def test_save_file_with_an_unsupported_dtype_raises_before_creating_anything(tmp_path):
    target = tmp_path / "model.apr"
    with pytest.raises(LayoutError, match="datetime64"):
        aprfast.save_file({"z": np.zeros(4, "datetime64[s]")}, target)
    assert dir_entries(tmp_path) == []


def test_save_file_leaves_target_unchanged_when_writing_fails_midway(tmp_path, monkeypatch):
    target = tmp_path / "model.apr"
    target.write_bytes(b"previous contents")
    real_write = os.write
    calls = []

    def failing_write(fd, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    real_writev = getattr(os, "writev", None)

    def failing_writev(fd, pieces):  # save_file's vectored path (POSIX)
        calls.append(sum(len(p) for p in pieces))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_writev(fd, pieces)

    monkeypatch.setattr(os, "write", failing_write)
    if real_writev is not None:
        monkeypatch.setattr(os, "writev", failing_writev)
    big = np.ones(5 << 20, np.float32)  # 20 MiB each: more than one writev batch
    with pytest.raises(AprIOError):
        aprfast.save_file({"a": big, "b": big}, target)
    monkeypatch.undo()
    assert len(calls) >= 2
    assert target.read_bytes() == b"previous contents"
    assert dir_entries(tmp_path) == ["model.apr"]


WRITE_FAILS_SCRIPT = textwrap.dedent("""
    import os, resource, signal, sys
    import numpy as np
    import aprfast
    target = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
    try:
        aprfast.save_file({"x": np.zeros(1 << 18, np.float32)}, target)
    except BaseException as exc:
        print(type(exc).__name__, isinstance(exc, aprfast.AprIOError), isinstance(exc, OSError))
    else:
        print("no error")
""")


def test_save_file_reports_an_os_write_failure_as_apr_io_error(tmp_path, run_child):
    # A real EFBIG from the kernel halfway through the file (RLIMIT_FSIZE), in a child process.
    target = tmp_path / "model.apr"
    target.write_bytes(b"previous contents")
    out = run_child(WRITE_FAILS_SCRIPT, target)
    assert out.returncode == 0, out.stderr
    assert target.read_bytes() == b"previous contents"
    assert dir_entries(tmp_path) == ["model.apr"]
    # E007 is the code for "the operating system refused a read or write".
    assert out.stdout.split() == ["AprIOError", "True", "True"], out.stdout


# --- every target gives the same bytes ----------------------------------------------------
def test_save_file_to_a_path_equals_save(tmp_path):
    tensors = sample_tensors()
    meta = {"name": "m", "hidden_size": 16}
    aprfast.save_file(tensors, tmp_path / "a.apr", meta)
    aprfast.save_file(tensors, str(tmp_path / "b.apr"), meta, durable=False)
    data = aprfast.save(tensors, meta)
    assert (tmp_path / "a.apr").read_bytes() == data
    assert (tmp_path / "b.apr").read_bytes() == data


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_save_file_to_an_open_binary_file_equals_save(tmp_path, layout):
    tensors = sample_tensors()
    with open(tmp_path / "m.apr", "wb") as fh:
        aprfast.save_file(tensors, fh, {"k": 1}, layout=layout)
    assert (tmp_path / "m.apr").read_bytes() == aprfast.save(tensors, {"k": 1}, layout=layout)


def test_save_file_to_bytesio_equals_save():
    tensors = sample_tensors()
    buf = io.BytesIO()
    aprfast.save_file(tensors, buf)
    assert buf.getvalue() == aprfast.save(tensors)


@pytest.mark.parametrize("buffering", [0, -1])
def test_save_file_to_a_pipe_equals_save(buffering):
    tensors = sample_tensors()
    tensors["big"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: more than a pipe buffer
    read_fd, write_fd = os.pipe()
    received = []

    def drain():
        with os.fdopen(read_fd, "rb") as r:
            received.append(r.read())

    reader = threading.Thread(target=drain)
    reader.start()
    with os.fdopen(write_fd, "wb", buffering=buffering) as w:
        aprfast.save_file(tensors, w)
    reader.join(timeout=30)
    assert received == [aprfast.save(tensors)]


def test_save_file_refuses_an_unwritable_target():
    with pytest.raises(TypeError):
        aprfast.save_file({"x": np.ones(2)}, 12.5)


# --- permissions ------------------------------------------------------------------
def test_saved_file_permissions_follow_the_umask_in_force_at_each_save(tmp_path):
    modes = {}
    previous = os.umask(0o022)
    try:
        for umask in (0o022, 0o077, 0o002):
            os.umask(umask)
            aprfast.save_file({"x": np.ones(2)}, tmp_path / f"s{umask:o}.apr")
            with aprfast.Writer(tmp_path / f"w{umask:o}.apr") as w:
                w.add("x", np.ones(2))
            modes[umask] = (stat.S_IMODE(os.stat(tmp_path / f"s{umask:o}.apr").st_mode),
                            stat.S_IMODE(os.stat(tmp_path / f"w{umask:o}.apr").st_mode))
    finally:
        os.umask(previous)
    assert modes == {0o022: (0o644, 0o644), 0o077: (0o600, 0o600), 0o002: (0o664, 0o664)}


def test_saved_file_is_not_private_under_the_usual_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        aprfast.save_file({"x": np.ones(2)}, tmp_path / "m.apr")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "m.apr").st_mode) == 0o644


# --- loading --------------------------------------------------------------------
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_load_accepts_bytes_like_objects(wrap):
    tensors = sample_tensors()
    got = aprfast.load(wrap(aprfast.save(tensors)))
    assert_tensors_equal(got, tensors)
    for array in got.values():
        assert array.flags.writeable


def test_load_refuses_a_path():
    with pytest.raises(TypeError):
        aprfast.load("model.apr")


def test_load_file_mmap_arrays_are_read_only_and_outlive_the_file(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    loaded = aprfast.load_file(path, mmap=True)
    gc.collect()
    for name, array in loaded.items():
        assert not array.flags.writeable, name
        with pytest.raises(ValueError):
            array[...] = 0
    os.unlink(path)  # the mapping keeps the data alive, the dict is the only reference
    gc.collect()
    assert_tensors_equal(loaded, tensors)


def test_load_file_mmap_views_survive_losing_every_other_array(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a": np.arange(100, dtype=np.int32), "b": np.ones(5)}, path)
    only = aprfast.load_file(path)["a"]
    gc.collect()
    assert np.array_equal(only, np.arange(100, dtype=np.int32))


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_load_file_without_mmap_gives_writable_64_byte_aligned_arrays(tmp_path, threads):
    tensors = sample_tensors()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    loaded = aprfast.load_file(path, mmap=False, threads=threads)
    assert_tensors_equal(loaded, tensors)
    for name, array in loaded.items():
        assert array.flags.writeable, name
        if array.size:
            assert array.ctypes.data % 64 == 0, name
    loaded["embed.weight"][0, 0] = 42.0
    assert loaded["embed.weight"][0, 0] == 42.0
    assert aprfast.load_file(path)["embed.weight"][0, 0] == tensors["embed.weight"][0, 0]


def test_load_file_without_mmap_checks_the_file_crc(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"x": np.arange(64, dtype=np.float32)}, path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01  # inside the tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(aprfast.ChecksumError):
        aprfast.load_file(path, mmap=False)
    assert aprfast.load_file(path, mmap=False, verify=False)["x"][62] != 62.0  # the flipped element


# --- open ------------------------------------------------------------------------
def _check_open(f, tensors):
    assert sorted(f.keys()) == sorted(tensors)
    assert len(f) == len(tensors)
    assert "step" in f and "nope" not in f
    for name, array in tensors.items():
        for copy in (False, True):
            got = f.get_tensor(name, copy=copy)
            assert got.dtype == array.dtype and got.shape == array.shape
            assert got.tobytes() == array.tobytes()
    f.verify()


def test_open_a_path_file_object_bytesio_and_bytes(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    data = path.read_bytes()
    with aprfast.open(path) as f:
        _check_open(f, tensors)
        assert f.path == str(path)
    with open(path, "rb") as fh, aprfast.open(fh) as f:
        _check_open(f, tensors)
    with aprfast.open(io.BytesIO(data)) as f:
        _check_open(f, tensors)
    with aprfast.open(data) as f:
        _check_open(f, tensors)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_open_in_pread_mode_reads_owned_writable_arrays(tmp_path, layout):
    tensors = sample_tensors()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, layout=layout)
    with aprfast.open(path, mode="pread") as f:
        _check_open(f, tensors)
        assert f.get_tensor("embed.weight").flags.writeable
        assert f.layout == layout


def test_open_with_an_unknown_mode_raises_value_error(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"x": np.ones(1)}, path)
    with pytest.raises(ValueError):
        aprfast.open(path, mode="stream")


def test_reading_a_closed_file_raises_apr_io_error(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"x": np.ones(1)}, path)
    f = aprfast.open(path)
    f.close()
    assert f.closed
    with pytest.raises(AprIOError):
        f.get_tensor("x")


def test_missing_tensor_raises_tensor_not_found_error_naming_it():
    data = aprfast.save({"present": np.ones(2)})
    with aprfast.open(data) as f:
        with pytest.raises(TensorNotFoundError) as info:
            f.get_tensor("absent.weight")
        with pytest.raises(KeyError):
            f.get_slice("absent.weight")
        with pytest.raises(KeyError):
            f.info("absent.weight")
    assert isinstance(info.value, KeyError) and isinstance(info.value, AprError)
    assert "absent.weight" in str(info.value)
    assert info.value.code == "E001"


def test_opening_a_nonexistent_path_raises_apr_io_error(tmp_path):
    with pytest.raises(AprIOError) as info:
        aprfast.open(tmp_path / "missing.apr")
    assert isinstance(info.value, OSError)
    assert "missing.apr" in str(info.value)


# --- layouts and their limits ----------------------------------------------------------
def test_aprender_layout_refuses_an_int16_tensor():
    with pytest.raises(LayoutError, match="I16"):
        aprfast.save({"x": np.zeros(2, np.int16)}, layout="aprender")


def test_aprender_layout_refuses_a_name_longer_than_256_bytes():
    aprfast.save({"n" * 256: np.zeros(1)}, layout="aprender")
    with pytest.raises(LayoutError):
        aprfast.save({"n" * 300: np.zeros(1)}, layout="aprender")
    with pytest.raises(LayoutError):
        aprfast.save({"é" * 129: np.zeros(1)}, layout="aprender")  # 258 bytes in 129 chars


def test_aprender_layout_refuses_alignment_32():
    with pytest.raises(LayoutError):
        aprfast.save({"x": np.zeros(1)}, layout="aprender", alignment=32)


def test_unknown_layout_name_raises_layout_error():
    with pytest.raises(LayoutError):
        aprfast.save({"x": np.zeros(1)}, layout="safetensors")


@pytest.mark.parametrize("layout", ["apr2", "auto"])
def test_apr2_with_alignment_32_aligns_every_tensor_to_32_bytes(layout):
    tensors = {f"t{i}": np.arange(i, dtype=np.uint8) for i in range(1, 12)}
    data = aprfast.save(tensors, layout=layout, alignment=32)
    with aprfast.open(data) as f:
        assert f.layout == "apr2"
        offsets = [f.info(name).offset for name in sorted(tensors)]
        assert all(offset % 32 == 0 for offset in offsets)
        assert any(offset % 64 for offset in offsets)  # really 32, not 64 in disguise
        assert "ALIGNED_32" in f.header["flag_names"]
        f.verify()
    assert_tensors_equal(aprfast.load(data), tensors)


@pytest.mark.parametrize("alignment", [0, 16, 48, 128])
def test_apr2_refuses_alignments_other_than_32_and_64(alignment):
    with pytest.raises(LayoutError):
        aprfast.save({"x": np.zeros(1)}, layout="apr2", alignment=alignment)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_default_alignment_puts_every_tensor_on_64_bytes(layout):
    tensors = {f"t{i}": np.arange(i, dtype=np.uint8) for i in range(0, 70, 7)}
    with aprfast.open(aprfast.save(tensors, layout=layout)) as f:
        assert all(f.info(name).offset % 64 == 0 for name in tensors)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_bf16_arrays_round_trip(layout, tmp_path):
    values = np.array([[1.0, -2.5, np.nan], [np.inf, -0.0, 3.140625]], dtype=bfloat16)
    path = tmp_path / "bf16.apr"
    aprfast.save_file({"w": values}, path, layout=layout)
    for loaded in (aprfast.load_file(path), aprfast.load_file(path, mmap=False),
                   aprfast.load(path.read_bytes())):
        assert loaded["w"].dtype == np.dtype(bfloat16)
        assert loaded["w"].tobytes() == values.tobytes()
    with aprfast.open(path) as f:
        assert f.info("w").dtype.name == "BF16"


# --- inspect --------------------------------------------------------------------------
class RecordingStream(io.RawIOBase):
    """A seekable stream without a descriptor that records every byte range read."""

    def __init__(self, data):
        self._data = data
        self._pos = 0
        self.ranges = []

    def seekable(self):
        return True

    def readable(self):
        return True

    def seek(self, offset, whence=0):
        self._pos = {0: offset, 1: self._pos + offset, 2: len(self._data) + offset}[whence]
        return self._pos

    def read(self, n=-1):
        end = len(self._data) if n < 0 else min(len(self._data), self._pos + n)
        self.ranges.append((self._pos, end))
        out = self._data[self._pos:end]
        self._pos = end
        return out


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_inspect_reports_header_metadata_and_index_without_reading_tensor_data(layout):
    tensors = {"a": np.arange(1000, dtype=np.float32), "b": np.ones((7, 9), np.float64)}
    data = aprfast.save(tensors, {"name": "m"}, layout=layout)
    stream = RecordingStream(data)
    report = aprfast.inspect(stream)
    assert report["layout"] == layout
    assert report["metadata"]["name"] == "m"
    assert report["header"]["tensor_count"] == 2
    assert report["header"]["file_size"] == len(data)
    assert report["tensors"]["a"]["dtype"] == "F32"
    assert report["tensors"]["a"]["shape"] == [1000]
    assert report["tensors"]["b"]["nbytes"] == 7 * 9 * 8
    for t in report["tensors"].values():
        for lo, hi in stream.ranges:
            assert hi <= t["offset"] or lo >= t["offset"] + t["nbytes"], (lo, hi, t)


def test_inspect_a_path(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"x": np.zeros((2, 3), np.int32)}, path)
    report = aprfast.inspect(path)
    assert report["tensors"] == {"x": {"dtype": "I32", "shape": [2, 3],
                                       "offset": report["header"]["data_offset"], "nbytes": 24}}


# --- on-disk facts ----------------------------------------------------------------
def test_apr2_footer_is_crc_magic_and_file_size():
    data = aprfast.save({"x": np.arange(10, dtype=np.int16)}, layout="apr2")
    assert data[:4] == b"APR2"
    crc, magic, size = struct.unpack("<I4sQ", data[-16:])
    assert magic == b"2RPA"
    assert size == len(data)
    assert crc == zlib.crc32(data[:-16])


def test_aprender_footer_is_the_crc_of_everything_before_it():
    data = aprfast.save({"x": np.arange(10, dtype=np.int32)}, layout="aprender")
    assert data[:4] == b"APR\x00"
    assert struct.unpack("<I", data[-4:])[0] == zlib.crc32(data[:-4])


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">u4", ">f8", ">i2", ">f2"])
def test_big_endian_arrays_are_stored_little_endian(dtype):
    big = np.arange(0, 12, dtype=dtype).reshape(3, 4)
    data = aprfast.save({"x": big})
    with aprfast.open(data) as f:
        info = f.info("x")
        assert data[info.offset:info.end] == big.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
        got = f.get_tensor("x")
    assert got.dtype == np.dtype(dtype).newbyteorder("<")
    assert np.array_equal(got, big)


def test_non_contiguous_views_are_saved_in_c_order():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    views = {"t": base.T, "every_other": base[:, ::2], "reversed": base[::-1], "f": np.asfortranarray(base)}
    loaded = aprfast.load(aprfast.save(views))
    for name, view in views.items():
        assert loaded[name].shape == view.shape
        assert np.array_equal(loaded[name], view), name
        assert loaded[name].flags.c_contiguous


class HasArray:
    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)


def test_objects_with_array_interface_are_accepted():
    want = np.arange(6, dtype=np.int64).reshape(2, 3)
    loaded = aprfast.load(aprfast.save({"x": HasArray(want)}))
    assert loaded["x"].dtype == np.int64 and np.array_equal(loaded["x"], want)


def test_memoryview_buffers_are_accepted_with_their_format():
    floats = np.linspace(0, 1, 5, dtype=np.float32)
    loaded = aprfast.load(aprfast.save({"m": memoryview(floats), "raw": memoryview(b"\x01\x02\x03"),
                                        "ba": bytearray(b"\x04\x05")}))
    assert loaded["m"].dtype == np.float32 and np.array_equal(loaded["m"], floats)
    assert loaded["raw"].dtype == np.uint8 and loaded["raw"].tolist() == [1, 2, 3]
    assert loaded["ba"].dtype == np.uint8 and loaded["ba"].tolist() == [4, 5]


def test_bytes_buffers_are_accepted_as_uint8():
    # bytes is a buffer like bytearray; it should not become a 0-d |S string array.
    loaded = aprfast.load(aprfast.save({"b": b"\x01\x02\x03"}))
    assert loaded["b"].dtype == np.uint8
    assert loaded["b"].tolist() == [1, 2, 3]


def test_tensors_must_be_a_mapping():
    with pytest.raises(TypeError):
        aprfast.save([("x", np.ones(1))])


def test_tensor_names_must_be_str():
    with pytest.raises(LayoutError):
        aprfast.save({1: np.ones(1)})


# --- verification switches and I/O errors ------------------------------------------------
def _corrupted_copy(tmp_path, layout="aprender"):
    """A file whose tensor data no longer matches its footer CRC."""
    path = tmp_path / f"corrupt-{layout}.apr"
    aprfast.save_file({"x": np.arange(64, dtype=np.float32)}, path, layout=layout)
    with aprfast.open(path) as f:
        offset = f.info("x").offset
    data = bytearray(path.read_bytes())
    data[offset + 8] ^= 0x40  # element 2
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_verification_catches_a_flipped_data_bit_wherever_it_is_asked_for(tmp_path, layout):
    path = _corrupted_copy(tmp_path, layout)
    data = path.read_bytes()
    with pytest.raises(aprfast.ChecksumError):
        aprfast.load(data)  # verify=True by default
    with pytest.raises(aprfast.ChecksumError):
        aprfast.load_file(path, mmap=True, verify=True)
    with pytest.raises(aprfast.ChecksumError):
        aprfast.open(path, verify=True)
    with aprfast.open(path, mode="pread") as f, pytest.raises(aprfast.ChecksumError):
        f.verify()
    # Without verification the (wrong) bytes are handed back as stored.
    for loaded in (aprfast.load(data, verify=False), aprfast.load_file(path),
                   aprfast.load_file(path, mmap=False, verify=False)):
        assert loaded["x"][2] != 2.0 and loaded["x"][3] == 3.0


def test_save_file_into_a_missing_directory_raises_apr_io_error(tmp_path):
    target = tmp_path / "missing" / "m.apr"
    with pytest.raises(AprIOError) as info:
        aprfast.save_file({"x": np.ones(1)}, target)
    assert info.value.code == "E007" and str(target) in str(info.value)


@pytest.mark.parametrize("mode", [None, "pread", "mmap"])
def test_opening_a_directory_raises_apr_io_error_in_every_mode(tmp_path, mode):
    # Whatever the mode, an OS refusal is E007 (the CLI catches AprError only).
    with pytest.raises(AprIOError) as info:
        aprfast.open(tmp_path, mode=mode)
    assert str(tmp_path) in str(info.value)


def test_unknown_dtypes_option_is_checked():
    with pytest.raises(ValueError):
        aprfast.open(aprfast.save({"x": np.ones(1)}), unknown_dtypes="ignore")


# --- unusual array inputs ---------------------------------------------------------------
def test_array_subclasses_broadcasts_and_odd_strides_are_saved_by_value(tmp_path):
    base = np.arange(12, dtype=np.float32)
    mm = np.memmap(tmp_path / "mm.bin", dtype=np.float32, mode="w+", shape=(3, 4))
    mm[:] = base.reshape(3, 4)

    class Sub(np.ndarray):
        pass

    inputs = {
        "memmap": mm,
        "memmap_t": mm.T,
        "subclass": np.arange(6, dtype=np.int16).reshape(2, 3).view(Sub),
        "broadcast": np.broadcast_to(np.arange(3, dtype=np.int32), (4, 3)),
        "relaxed": np.lib.stride_tricks.as_strided(base, shape=(3, 1, 4), strides=(16, 12345, 4)),
        "readonly": np.frombuffer(base.tobytes(), np.float32),
    }
    data = aprfast.save(inputs)
    loaded = aprfast.load(data)
    for name, value in inputs.items():
        want = np.asarray(value)
        assert loaded[name].shape == want.shape and np.array_equal(loaded[name], want), name
    buf = io.BytesIO()
    with aprfast.Writer(buf) as w:
        for name, value in inputs.items():
            w.add(name, value)
    assert buf.getvalue() == data
    del mm


def test_masked_arrays_are_saved_as_data_or_refused_with_an_apr_error():
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    try:
        loaded = aprfast.load(aprfast.save({"m": masked}))
    except AprError:
        return  # refusing is fine, as long as it is aprfast's typed error
    assert np.array_equal(loaded["m"], masked.data)


# --- metadata values at the edges -------------------------------------------------------
@pytest.mark.parametrize("layout", ["aprender", "auto"])
def test_aprender_integer_fields_accept_numpy_integers(layout):
    # rope_theta already takes np.float32; the u64 fields should take np.int64 the same way,
    # and "auto" must not silently switch to apr2 (which aprender cannot read) because of it.
    meta = {"hidden_size": np.int64(4096), "num_layers": np.uint32(32), "rope_theta": np.float32(1e4)}
    with aprfast.open(aprfast.save({"x": np.ones(2, np.float32)}, meta, layout=layout)) as f:
        assert f.layout == "aprender"
        assert f.metadata["hidden_size"] == 4096 and type(f.metadata["hidden_size"]) is int
        assert f.metadata["num_layers"] == 32
        assert f.metadata["rope_theta"] == 10000.0


@pytest.mark.parametrize("layout", ["aprender", "apr2", "auto"])
def test_metadata_with_mixed_key_types_raises_layout_error(layout):
    with pytest.raises(LayoutError):
        aprfast.save({"x": np.ones(1)}, {"extra": {1: "a", "b": 2}}, layout=layout)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**64, -(2**63) - 1])
def test_metadata_json_cannot_hold_raises_layout_error(layout, value):
    with pytest.raises(LayoutError):
        aprfast.save({"x": np.ones(1)}, {"extra": [value]}, layout=layout)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_apr2_refuses_a_foreign_apr_version_and_aprender_keeps_it_as_a_custom_key(layout):
    meta = {"apr_version": "9.9"}
    if layout == "apr2":
        with pytest.raises(LayoutError):
            aprfast.save({"x": np.ones(1)}, meta, layout=layout)
    else:
        assert aprfast.open(aprfast.save({"x": np.ones(1)}, meta, layout=layout)).metadata["apr_version"] == "9.9"


@pytest.mark.parametrize("mode", [None, "pread"])
def test_open_on_a_file_object_leaves_it_open_and_its_position_alone(tmp_path, mode):
    path = tmp_path / "m.apr"
    aprfast.save_file({"x": np.arange(5, dtype=np.int32)}, path)
    with open(path, "rb") as fh:
        fh.seek(7)
        with aprfast.open(fh, mode=mode) as f:
            assert f.get_tensor("x").tolist() == [0, 1, 2, 3, 4]
        assert not fh.closed
        assert fh.tell() == 7
        fh.seek(0)
        assert fh.read(4) == b"APR\x00"


CLOSED_MAP_SCRIPT = """
import gc, sys
import numpy as np
import aprfast
path = sys.argv[1]
with aprfast.open(path) as f:
    kept = f.get_tensor("w")
views = aprfast.load_file(path)
gc.collect()
print(float(kept.sum()), float(views["w"].sum()))
"""


def test_arrays_outlive_the_file_that_mapped_them(tmp_path, run_child):
    # A zero-copy view must keep the map alive after close(); a dangling view would
    # crash the child (run in a child so a crash is a failure, not the end of the run).
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.arange(1 << 16, dtype=np.float32)}, path)
    out = run_child(CLOSED_MAP_SCRIPT, path)
    expected = float(np.arange(1 << 16, dtype=np.float32).sum())
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split() == [repr(expected), repr(expected)]


@pytest.mark.skipif(not hasattr(os, "writev"), reason="the vectored save path is POSIX")
def test_short_writevs_resume_mid_piece_and_give_the_same_bytes(tmp_path, monkeypatch):
    # save_file writes tensors of 16 KiB and more with writev from the caller's arrays;
    # a kernel may write fewer bytes than asked, anywhere inside a piece
    rng = np.random.default_rng(5)
    tensors = {f"t{i}": rng.standard_normal(n, dtype=np.float32)
               for i, n in enumerate([5, 4096, 20000, 3, 70000, 1 << 18])}
    aprfast.save_file(tensors, tmp_path / "whole.apr")
    real_writev = os.writev
    sizes = []

    def short_writev(fd, pieces):
        budget = 7777 + 13 * len(sizes)  # odd amounts: never on a piece boundary
        taken, cut = [], 0
        for p in pieces:
            p = memoryview(p)
            if cut + len(p) > budget:
                taken.append(p[:budget - cut])
                break
            taken.append(p)
            cut += len(p)
        sizes.append(sum(len(p) for p in taken))
        return real_writev(fd, taken)

    monkeypatch.setattr(os, "writev", short_writev)
    aprfast.save_file(tensors, tmp_path / "short.apr")
    monkeypatch.undo()
    assert len(sizes) > 10
    assert (tmp_path / "short.apr").read_bytes() == (tmp_path / "whole.apr").read_bytes()
    got = aprfast.load_file(tmp_path / "short.apr")
    assert all(np.array_equal(got[k], v) for k, v in tensors.items())


def test_a_save_sweeps_a_temp_left_after_its_last_save_there(tmp_path):
    # the sweep of abandoned temporary files runs when the directory changed since this
    # process last swept or saved there (one stat otherwise)
    from aprfast.io import atomic

    aprfast.save_file({"a": np.zeros(3, np.float32)}, tmp_path / "one.apr")
    orphan = tmp_path / ".two.apr.aprfast-999999-0123456789abcdef.tmp"  # a killed save's
    orphan.write_bytes(b"partial")
    aprfast.save_file({"a": np.zeros(3, np.float32)}, tmp_path / "two.apr")
    assert not orphan.exists()
    assert atomic._SWEPT[str(tmp_path)] == os.stat(tmp_path).st_mtime_ns


def test_an_unstorable_value_names_its_key(tmp_path):
    # issue 28 item 9: the caller's dict entry is named, not only the dtype
    with pytest.raises(LayoutError, match="tensor 'head.bad': arrays of dtype object cannot be stored"):
        aprfast.save_file({"ok": np.zeros(2, np.float32), "head.bad": np.array([object()])}, tmp_path / "m.apr")
    assert not (tmp_path / "m.apr").exists()
