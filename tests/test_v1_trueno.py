"""v1 TRUENO_NATIVE files (seed 000 §9.2-9.7): the §9.2 index, zero-copy aligned views
with strides, backend hints, prefetch, refusals and hostile indexes.

docs/FORMAT.md ("v1 trueno-native tensors") is the layout these tests pin.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16

from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.errors import (
    AprError,
    CorruptError,
    LayoutError,
    LimitError,
    SignatureError,
    TensorNotFoundError,
    UnknownDTypeError,
)
from aprfast.layouts import trueno
from aprfast.layouts.v1 import Flag
from aprfast.v1.reader import V1File

PINNED = {"created_at": "0", "aprender_version": "golden"}
DTYPES = [np.dtype(d) for d in (np.float32, np.float16, bfloat16, np.int8, np.uint8)]
HINTS = list(trueno.BACKENDS.values())


def recrc(data) -> bytes:
    data = bytes(data)
    return data[:-4] + zlib.crc32(data[:-4]).to_bytes(4, "little")


def payload_start(data) -> int:
    return 32 + int.from_bytes(data[8:12], "little")


def entry_at(data, i=0) -> int:
    """Absolute offset of entry i (entries with ndim dims are 28 + 8*ndim bytes)."""
    at = payload_start(data) + 4
    for _ in range(i):
        ndim = data[at + 9]
        at += 28 + 8 * ndim
    return at


# --- round trips ------------------------------------------------------------------------
@st.composite
def tensor_dicts(draw):
    names = draw(st.lists(st.text(min_size=0, max_size=10), min_size=0, max_size=5, unique=True))
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
        n = int(np.prod(shape, dtype=np.int64))
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        out[name] = np.frombuffer(raw, dtype).reshape(shape) if n else np.zeros(shape, dtype)
    return out


@settings(max_examples=60, deadline=None)
@given(tensors=tensor_dicts(), hint=st.sampled_from(HINTS))
def test_round_trip_zero_copy_and_aligned(tmp_path_factory, tensors, hint):
    path = tmp_path_factory.mktemp("t") / "m.apr"
    v1.save_model(tensors, path, metadata=PINNED, trueno_native=True, backend_hint=hint)
    model = v1.load_model(path)
    assert model.flags & Flag.TRUENO_NATIVE
    with V1File(path) as f:
        assert f.kind == "trueno" and sorted(f.keys()) == sorted(tensors) == sorted(model.payload)
        for name, value in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == value.dtype and got.shape == value.shape
            assert got.tobytes() == value.tobytes() == model.payload[name].tobytes()
            assert not got.flags.writeable
            assert got.ctypes.data % 64 == 0 or got.nbytes == 0
            assert f.info(name).offset % 64 == 0 and f.backend_hint(name) == hint
            copy = f.get_tensor(name, copy=True)
            assert copy.tobytes() == value.tobytes() and copy.flags.writeable
        f.verify()
    with V1File(path, mode="pread") as f:  # not mapped: the payload is read once, same answers
        for name, value in tensors.items():
            assert f.get_tensor(name).tobytes() == value.tobytes()


def test_views_are_of_the_map_not_copies(tmp_path):
    path = tmp_path / "m.apr"
    value = np.arange(4096, dtype=np.float32).reshape(64, 64)
    v1.save_model({"w": value}, path, trueno_native=True)
    with V1File(path) as f:
        view = f.get_tensor("w")
        mapped = np.frombuffer(f._source.buffer(), np.uint8)
        assert np.shares_memory(view, mapped)
        assert view.ctypes.data - mapped.ctypes.data == f.info("w").offset
        assert np.array_equal(f.get_slice("w")[3:5, ::7], value[3:5, ::7])
    assert np.array_equal(view, value)  # the view outlives the file


def test_per_tensor_backend_hints():
    tensors = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.int8), "c": np.zeros(1, np.uint8)}
    data = v1.save_model(tensors, trueno_native=True, backend_hint={"a": "avx512", "b": 6})
    with V1File(data) as f:
        assert f.backend_hints == {"a": "avx512", "b": "neon", "c": "auto"}
        assert f.strides("a") == (1,)
    with pytest.raises(ValueError):
        v1.save_model(tensors, trueno_native=True, backend_hint={"zzz": "avx"})
    with pytest.raises(ValueError):
        v1.save_model(tensors, trueno_native=True, backend_hint="mmx")


def test_signed_trueno_files_verify_at_open():
    seed, public = crypto.generate_signing_key()
    data = bytearray(v1.save_model({"w": np.ones(16, np.float32)}, trueno_native=True, signing_key=seed))
    with V1File(bytes(data), trusted_keys=[public]) as f:
        assert f.signature == v1.TRUSTED
    data[-200] ^= 1  # a byte of the tensor data
    with pytest.raises(SignatureError):
        V1File(recrc(data))


# --- what the flag cannot hold is refused ----------------------------------------------
@pytest.mark.parametrize("kw", [{"compression": "zstd"}, {"compression": "lz4"}, {"password": "pw"},
                                {"recipient": bytes(range(1, 33))}, {"streaming": True}])
def test_compression_encryption_and_streaming_are_refused(kw):
    with pytest.raises(LayoutError):
        v1.save_model({"w": np.ones(4, np.float32)}, trueno_native=True, **kw)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint16, np.bool_])
def test_dtypes_outside_the_seed_table_are_refused(dtype):
    with pytest.raises(LayoutError, match="trueno-native files hold only"):
        v1.save_model({"w": np.ones(4, dtype)}, trueno_native=True)


def test_backend_hint_without_trueno_is_refused():
    with pytest.raises(LayoutError):
        v1.save_model({"w": np.ones(4, np.float32)}, backend_hint="avx2")


def test_marker_without_flag_and_flag_with_codec_are_refused():
    data = bytearray(v1.save_model({"w": np.ones(4, np.float32)}, trueno_native=True))
    cleared = bytearray(data)
    cleared[21] &= ~Flag.TRUENO_NATIVE
    with pytest.raises(CorruptError, match="TRUENO_NATIVE flag is clear"):
        v1.load_model(recrc(cleared))
    with pytest.raises(CorruptError):
        V1File(recrc(cleared))
    compressed = bytearray(data)
    compressed[20] = 1
    with pytest.raises(CorruptError, match="uncompressed and unencrypted"):
        V1File(recrc(compressed))


# --- strides ------------------------------------------------------------------------------
def test_stored_strides_are_honoured():
    """A 3x2 tensor over 6 stored elements with strides (1, 3): the transpose."""
    base = np.arange(6, dtype=np.float32)
    data = bytearray(v1.save_model({"w": base.reshape(3, 2)}, trueno_native=True))
    at = entry_at(data)
    assert struct.unpack_from("<II", data, at + 10) == (3, 2)       # shape
    assert struct.unpack_from("<II", data, at + 18) == (2, 1)       # C-order strides, in elements
    struct.pack_into("<II", data, at + 18, 1, 3)
    with V1File(recrc(data)) as f:
        got = f.get_tensor("w")
        expected = np.lib.stride_tricks.as_strided(base, (3, 2), (4, 12))
        assert np.array_equal(got, expected) and np.array_equal(got, base.reshape(2, 3).T)
        assert f.strides("w") == (1, 3)
        assert np.array_equal(f.get_tensor("w", copy=True), expected)


@pytest.mark.parametrize("strides", [(2, 1 << 31), (7, 1), (0xFFFFFFFF, 0xFFFFFFFF)])
def test_strides_reaching_past_the_tensor_are_refused(strides):
    data = bytearray(v1.save_model({"w": np.zeros((3, 2), np.float32), "x": np.ones(64, np.float32)},
                                   trueno_native=True))
    struct.pack_into("<II", data, entry_at(data) + 18, *strides)
    with pytest.raises(CorruptError, match="reaches"):
        V1File(recrc(data))
    with pytest.raises(CorruptError, match="reaches"):
        v1.load_model(recrc(data))


# --- hostile indexes -------------------------------------------------------------------
def mutate(field, value, tensors=None):
    """A valid file with one field of entry 0 changed (CRC fixed)."""
    tensors = tensors or {"w": np.zeros(4, np.float32), "x": np.ones(16, np.uint8)}
    data = bytearray(v1.save_model(tensors, trueno_native=True))
    at = entry_at(data)
    if field == "count":
        struct.pack_into("<I", data, payload_start(data), value)
        return recrc(data)
    offsets = {"hash": (0, "<Q"), "dtype": (8, "<B"), "ndim": (9, "<B"), "shape": (10, "<I"),
               "stride": (14, "<I"), "alignment": (18, "<B"), "offset": (20, "<Q"), "size": (28, "<Q")}
    rel, fmt = offsets[field]
    struct.pack_into(fmt, data, at + rel, value)
    return recrc(data)


HOSTILE = {
    "huge count": (("count", 0xFFFFFFFF), LimitError),
    "count the payload cannot hold": (("count", 1000), CorruptError),
    "hash of another name": (("hash", 12345), CorruptError),
    "unknown dtype": (("dtype", 9), UnknownDTypeError),
    "255 dims": (("ndim", 255), LimitError),
    "misaligned offset": (("offset", 200), CorruptError),
    "offset inside the index": (("offset", 128), CorruptError),
    "offset past the file": (("offset", 1 << 62), CorruptError),
    "huge size": (("size", 1 << 62), CorruptError),
    "size smaller than the shape": (("size", 15), CorruptError),
    "alignment 0": (("alignment", 0), CorruptError),
    "alignment not a power of two": (("alignment", 48), CorruptError),
    "alignment above 64": (("alignment", 128), CorruptError),
    "huge dim": (("shape", 0xFFFFFFFF), CorruptError),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_trueno_indexes_are_refused_without_big_allocations(case):
    (field, value), error = HOSTILE[case]
    data = mutate(field, value)
    tracemalloc.start()
    try:
        with pytest.raises(error):
            V1File(data)
        with pytest.raises(error):
            v1.load_model(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_overlapping_tensors_are_refused():
    data = bytearray(v1.save_model({"a": np.zeros(64, np.uint8), "b": np.zeros(64, np.uint8)},
                                   trueno_native=True))
    first = struct.unpack_from("<Q", data, entry_at(data, 0) + 20)[0]
    struct.pack_into("<Q", data, entry_at(data, 1) + 20, first)
    with pytest.raises(CorruptError, match="overlap"):
        V1File(recrc(data))


def test_duplicate_names_are_refused():
    data = bytearray(v1.save_model({"a": np.zeros(4, np.uint8), "b": np.zeros(4, np.uint8)}, trueno_native=True))
    names = payload_start(data) + 4 + 2 * (28 + 8)
    assert data[names:names + 6] == b"\x01\x00a\x01\x00b"
    data[names + 5:names + 6] = b"a"
    struct.pack_into("<Q", data, entry_at(data, 1), trueno.fnv1a64(b"a"))
    with pytest.raises(CorruptError, match="twice"):
        V1File(recrc(data))


# --- prefetch ---------------------------------------------------------------------------
class RecordingMap:
    def __init__(self):
        self.calls = []

    def madvise(self, option, start, length):
        self.calls.append((option, start, length))


def test_prefetch_advises_the_pages_of_the_named_tensors(tmp_path):
    import mmap

    path = tmp_path / "m.apr"
    v1.save_model({"a": np.zeros(10000, np.float32), "b": np.ones(10, np.float32)}, path, trueno_native=True)
    with V1File(path) as f:
        f.prefetch(["a", "b"])  # the real map: accepted
        real, f._source._map = f._source._map, RecordingMap()
        try:
            f.prefetch("b")
            calls = f._source._map.calls
        finally:
            f._source._map = real
        start = f.info("b").offset
        page = start - start % mmap.PAGESIZE
        assert calls == [(mmap.MADV_WILLNEED, page, start + 40 - page)]
        with pytest.raises(TensorNotFoundError):
            f.prefetch(["nope"])
    with V1File(path.read_bytes()) as f:  # nothing mapped: a no-op
        f.prefetch(["a"])
        assert f.get_tensor("a").shape == (10000,)


# --- golden bytes -----------------------------------------------------------------------
def test_fnv1a_vectors():
    assert trueno.fnv1a64(b"") == 0xCBF29CE484222325
    assert trueno.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert trueno.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_golden_trueno_file():
    """One u8 tensor "w" = [1, 2], unsigned: every byte from FORMAT.md."""
    metadata = (b"\x84"                                   # fixmap, 4 entries
                b"\xaacreated_at" b"\xa10"
                b"\xb0aprender_version" b"\xa6golden"
                b"\xa6custom" b"\x81" b"\xaepayload_format" b"\xadtrueno-native"
                b"\xabpayload_pad" b"\xc4\x07" + bytes(7))  # pads 32 + metadata to 128
    assert len(metadata) == 96
    header = (b"APRN" b"\x01\x00" b"\x21\x00"
              + struct.pack("<III", 96, 128, 128)          # metadata, payload, uncompressed
              + b"\x00" b"\x10" b"\x00" + bytes(9))         # compression none, TRUENO_NATIVE
    index = (struct.pack("<I", 1)                         # tensor_count
             + struct.pack("<Q", 0xAF63EA4C86020456)      # FNV-1a("w")
             + b"\x04" b"\x01"                             # dtype u8, ndims 1
             + struct.pack("<I", 2) + struct.pack("<I", 1)  # shape, stride
             + b"\x40" b"\x00"                             # alignment 64, backend auto
             + struct.pack("<QQ", 192, 2)                  # offset (absolute), size_bytes
             + b"\x01\x00w")                               # name table
    index += bytes(64 - len(index))
    body = header + metadata + index + b"\x01\x02" + bytes(62)
    expected = body + struct.pack("<I", zlib.crc32(body))
    assert trueno.fnv1a64(b"w") == 0xAF63EA4C86020456
    data = v1.save_model({"w": np.array([1, 2], np.uint8)}, metadata=PINNED, trueno_native=True)
    assert data == expected
    with V1File(expected) as f:
        assert f.get_tensor("w").tolist() == [1, 2] and f.info("w").offset == 192


def test_load_model_and_v1file_agree_on_a_bytes_payload_refusal():
    data = v1.save_model(b"bincode", model_type=1)
    with pytest.raises(AprError, match="not tensors"):
        V1File(data)
