"""The historical APR1 layout: read through aprfast.open/load/load_file/inspect, every
size and field checked, hostile files refused with typed errors."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

import aprfast
from aprfast.errors import ChecksumError, CorruptError, FormatError, LimitError, UnknownDTypeError, VersionError
from aprfast.limits import Limits

_NAMES = {"float32": "F32", "float16": "F16", "float64": "F64", "int8": "I8", "uint8": "U8",
          "int32": "I32", "int64": "I64"}


def sealed(body: bytes) -> bytes:
    """``body`` followed by its CRC32 (IEEE, as aprender's table computes it)."""
    return body + struct.pack("<I", zlib.crc32(body))


def build(metadata: bytes, index: bytes, data: bytes, *, count: int | None = None) -> bytes:
    """An APR1 file from raw sections: magic, u32 meta_len, metadata, u32 n_tensors,
    u32 index_len, index, data, CRC32."""
    if count is None:
        count = len(json.loads(index)) if index else 0
    return sealed(b"APR1" + struct.pack("<I", len(metadata)) + metadata
                  + struct.pack("<II", count, len(index)) + index + data)


def build_tensors(metadata: dict, tensors: list, *, lead: bytes = b"") -> bytes:
    """An APR1 file holding ``tensors`` ((name, array) pairs) in order, packed with no
    alignment after ``lead`` filler bytes, as aprender's AprWriter lays them out."""
    data, index = bytearray(lead), []
    for name, array in tensors:
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        index.append({"name": name, "dtype": _NAMES[array.dtype.name], "shape": list(array.shape),
                      "offset": len(data), "size": len(raw)})
        data += raw
    meta = json.dumps(metadata, separators=(",", ":"), sort_keys=True).encode()
    return build(meta, json.dumps(index, separators=(",", ":")).encode(), bytes(data))


def entry(name="w", dtype="F32", shape=(2,), offset=0, size=8) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape), "offset": offset, "size": size}


def one_index(**fields) -> bytes:
    return json.dumps([entry(**fields)]).encode()


# --- golden bytes ----------------------------------------------------------------------
# What aprender's AprWriter writes for set_metadata("model", "test") and
# add_tensor_f32("weights", [2, 2], [1, 2, 3, 4]): serde's compact JSON, struct fields in
# declaration order, f32 little-endian, CRC32 of everything before it.
GOLDEN_BODY = (
    b"APR1"
    + b"\x10\x00\x00\x00" + b'{"model":"test"}'
    + b"\x01\x00\x00\x00"
    + b"\x45\x00\x00\x00" + b'[{"name":"weights","dtype":"F32","shape":[2,2],"offset":0,"size":16}]'
    + b"\x00\x00\x80\x3f" + b"\x00\x00\x00\x40" + b"\x00\x00\x40\x40" + b"\x00\x00\x80\x40"
)
GOLDEN = GOLDEN_BODY + struct.pack("<I", zlib.crc32(GOLDEN_BODY))


def test_golden_bytes_are_read_exactly():
    assert len(GOLDEN_BODY) == 4 + 4 + 16 + 4 + 4 + 69 + 16
    with aprfast.open(GOLDEN) as f:
        assert f.layout == "apr1"
        assert f.keys() == ["weights"]
        assert f.metadata == {"model": "test"}
        tensor = f.get_tensor("weights")
        assert tensor.dtype == np.float32 and tensor.shape == (2, 2)
        assert tensor.tolist() == [[1.0, 2.0], [3.0, 4.0]]
        assert f.header["data_offset"] == len(GOLDEN_BODY) - 16
        assert f.header["tensor_count"] == 1
        f.verify()


def test_crc_is_ieee_crc32_as_aprender_tests_it():
    # aprender's own test vector for its table-driven CRC32: "hello" -> 0x3610A686
    assert zlib.crc32(b"hello") == 0x3610A686
    stored = struct.unpack("<I", GOLDEN[-4:])[0]
    assert stored == zlib.crc32(GOLDEN[:-4])


def test_empty_writer_output_reads_as_no_tensors():
    # AprWriter::new().to_bytes(): metadata "{}", count 0, index "[]"
    data = build(b"{}", b"[]", b"")
    with aprfast.open(data) as f:
        assert f.keys() == [] and f.metadata == {}
        f.verify()


def test_empty_metadata_block_is_no_metadata():
    data = build(b"", b"[]", b"")
    with aprfast.open(data) as f:
        assert f.metadata == {}


# --- round trips through every entry point --------------------------------------------------
DTYPE_CASES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64]


@pytest.mark.parametrize("lead", [b"", b"\x07"])  # b"\x07": every tensor at an odd offset
def test_every_dtype_round_trips_bit_for_bit(lead):
    rng = np.random.default_rng(5)
    tensors = [(f"t.{np.dtype(d).name}", (rng.standard_normal((3, 5)) * 50).astype(d)) for d in DTYPE_CASES]
    tensors.append(("scalar", np.array(2.5, np.float32)))
    tensors.append(("empty", np.zeros((0, 4), np.float32)))
    data = build_tensors({"model_type": "mlp", "n": 3}, tensors, lead=lead)
    loaded = aprfast.load(data)
    assert sorted(loaded) == sorted(name for name, _ in tensors)
    for name, expected in tensors:
        got = loaded[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()
    with aprfast.open(data) as f:
        for name, expected in tensors:
            assert f.get_tensor(name).tobytes() == expected.tobytes()
        assert f.get_slice("t.float32")[1:3, 2].tolist() == tensors[0][1][1:3, 2].tolist()


def test_load_file_inspect_and_keys_by_name(tmp_path):
    tensors = [("z.weight", np.arange(6, dtype=np.float32).reshape(2, 3)), ("a.bias", np.arange(3, dtype=np.int8))]
    path = tmp_path / "old.apr"
    path.write_bytes(build_tensors({"model_type": "whisper-tiny"}, tensors))
    for mmap in (True, False):
        loaded = aprfast.load_file(path, mmap=mmap)
        assert loaded["z.weight"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert loaded["a.bias"].tolist() == [0, 1, 2]
    info = aprfast.inspect(path)
    assert info["layout"] == "apr1"
    assert info["metadata"] == {"model_type": "whisper-tiny"}
    assert list(info["tensors"]) == ["a.bias", "z.weight"]  # listed by name, not file order
    assert info["tensors"]["z.weight"]["dtype"] == "F32" and info["tensors"]["z.weight"]["shape"] == [2, 3]
    with aprfast.open(path) as f:
        assert f.keys() == ["a.bias", "z.weight"]


def test_apr1_is_not_a_write_layout():
    with pytest.raises(aprfast.errors.LayoutError, match="unknown layout"):
        aprfast.save({"a": np.zeros(2, np.float32)}, layout="apr1")


def test_streaming_apr1_is_refused_clearly():
    with pytest.raises(VersionError, match="streaming an APR1"):
        list(aprfast.stream(GOLDEN))


# --- integrity ----------------------------------------------------------------------------
def test_altered_data_fails_the_crc():
    bad = bytearray(GOLDEN)
    bad[-5] ^= 0x01  # the last tensor byte
    with pytest.raises(ChecksumError, match="CRC32"):
        aprfast.load(bytes(bad))
    with aprfast.open(bytes(bad)) as f:  # lazy open reads no data
        with pytest.raises(ChecksumError):
            f.verify()


def test_unknown_dtype_is_refused_or_raw():
    data = build(b"{}", one_index(dtype="Q4_K", size=8), bytes(8))
    with pytest.raises(UnknownDTypeError, match="Q4_K"):
        aprfast.open(data)
    with aprfast.open(data, unknown_dtypes="raw") as f:
        assert f.keys() == ["w"]
        assert bytes(f.get_tensor("w").data) == bytes(8)


# --- hostile files --------------------------------------------------------------------------
def _lie(data, error, words, limits=None):
    with pytest.raises(error) as caught:
        aprfast.open(data, limits=limits)
    for word in words:
        assert str(word) in str(caught.value)
    assert caught.value.code == error.code


HOSTILE = {
    "too_short": (b"APR1\x00\x00", FormatError, ["needs at least"]),
    "metadata_length_past_end": (sealed(b"APR1" + struct.pack("<I", 0xFFFFFFFF) + bytes(12)),
                                 CorruptError, ["4294967295", "APR1"]),
    "index_length_past_end": (sealed(b"APR1" + struct.pack("<I", 2) + b"{}" + struct.pack("<II", 1, 10**9)),
                              CorruptError, ["1000000000"]),
    "index_not_json": (build(b"{}", b"[{name", b"", count=1), CorruptError, ["tensor index"]),
    "index_not_array": (build(b"{}", b'{"a":1}', b"", count=1), CorruptError, ["array"]),
    "index_deeply_nested": (build(b"{}", b"[" * 5000 + b"]" * 5000, b"", count=1), CorruptError,
                            ["tensor index"]),
    "count_disagrees_with_index": (build(b"{}", one_index(), bytes(8), count=2), CorruptError, ["2", "1"]),
    "metadata_not_object": (build(b"[1,2]", b"[]", b""), CorruptError, ["object"]),
    "metadata_not_utf8": (build(b'{"a":"\xff"}', b"[]", b""), CorruptError, []),
    "entry_not_object": (build(b"{}", b"[3]", b"", count=1), CorruptError, ["entry 0"]),
    "entry_lacks_size": (build(b"{}", b'[{"name":"w","dtype":"F32","shape":[2],"offset":0}]', bytes(8)),
                         CorruptError, ["size"]),
    "negative_offset": (build(b"{}", one_index(offset=-1), bytes(8)), CorruptError, ["offset", "-1"]),
    "float_size": (build(b"{}", one_index(size=8.0), bytes(8)), CorruptError, ["size", "8.0"]),
    "bool_dimension": (build(b"{}", one_index(shape=(True, 2), size=8), bytes(8)), CorruptError, ["True"]),
    "offset_of_2_64": (build(b"{}", one_index(offset=2**64), bytes(8)), CorruptError, [str(2**64)]),
    "name_not_string": (build(b"{}", json.dumps([dict(entry(), name=5)]).encode(), bytes(8)), CorruptError,
                        ["name"]),
    "lone_surrogate_name": (build(b"{}", b'[{"name":"\\ud800","dtype":"F32","shape":[2],"offset":0,"size":8}]',
                                  bytes(8)), CorruptError, ["UTF-8"]),
    "extent_past_data": (build(b"{}", one_index(offset=4), bytes(8)), CorruptError, ["outside"]),
    "size_disagrees_with_shape": (build(b"{}", one_index(shape=(3,), size=8), bytes(12)), CorruptError,
                                  ["needs 12"]),
    "huge_shape": (build(b"{}", one_index(shape=(2**40, 2**40), size=8), bytes(8)), CorruptError, ["2**62"]),
    "too_many_dims": (build(b"{}", one_index(shape=(1,) * 300, size=4), bytes(4)), LimitError, ["300"]),
    "duplicate_names": (build(b"{}", json.dumps([entry(), entry(offset=8)]).encode(), bytes(16)), CorruptError,
                        ["twice"]),
    "overlapping_extents": (build(b"{}", json.dumps([entry(name="a", offset=0), entry(name="b", offset=4)]).encode(),
                                  bytes(12)), CorruptError, ["overlap"]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_refused_at_open(name):
    data, error, words = HOSTILE[name]
    _lie(data, error, words)


def test_tensor_count_above_the_limit_is_refused_before_parsing():
    index = json.dumps([entry(name=f"t{i}", offset=8 * i) for i in range(3)]).encode()
    _lie(build(b"{}", index, bytes(24)), LimitError, ["3", "MAX_TENSOR_COUNT"], Limits(max_tensor_count=2))


def test_metadata_above_the_limit_is_refused():
    meta = json.dumps({"pad": "x" * 100}).encode()
    _lie(build(meta, b"[]", b""), LimitError, ["MAX_METADATA_SIZE"], Limits(max_metadata_size=50))


def test_index_above_the_limit_is_refused():
    _lie(build(b"{}", one_index(), bytes(8)), LimitError, ["MAX_INDEX_SIZE"], Limits(max_index_size=10))


def test_every_truncation_of_a_file_is_refused_typed():
    for cut in range(len(GOLDEN)):
        with pytest.raises(aprfast.errors.AprError):
            with aprfast.open(GOLDEN[:cut]) as f:
                f.verify()


# --- mutation property: any bytes behind the magic give data or a typed error ----------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SAMPLE = build_tensors({"model_type": "mlp"}, [("w", np.arange(12, dtype=np.float32).reshape(3, 4)),
                                                ("b", np.arange(3, dtype=np.int8))])


@given(st.lists(st.tuples(st.integers(0, len(_SAMPLE) - 1), st.integers(0, 255)), max_size=8),
       st.integers(0, len(_SAMPLE)))
def test_mutated_files_load_or_fail_typed(edits, cut):
    data = bytearray(_SAMPLE)
    for at, value in edits:
        data[at] = value
    data = bytes(data[:cut])
    try:
        loaded = aprfast.load(data)
    except aprfast.errors.AprError:
        return
    # load checks the CRC: what loads is what was written
    assert data == _SAMPLE
    assert loaded["w"].tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    assert loaded["b"].tolist() == [0, 1, 2]


def test_the_converters_apr_source_reads_apr1(tmp_path):
    # aprfast.convert reads every "apr" source through AprSource (aprfast.open); its
    # magic sniffing must also list b"APR1" for convert() itself to take the file.
    from aprfast.convert.apr import AprSource

    tensors = [("z.weight", np.arange(6, dtype=np.float32).reshape(2, 3)), ("a.bias", np.arange(3, dtype=np.int8))]
    path = tmp_path / "old.apr"
    path.write_bytes(build_tensors({"model_type": "whisper-tiny"}, tensors))
    source = AprSource(path)
    try:
        assert [s.name for s in source.specs] == ["z.weight", "a.bias"]  # file order
        assert source.metadata == {"model_type": "whisper-tiny"}
        got = dict(source.tensors())
    finally:
        source.close()
    aprfast.save_file(got, tmp_path / "new.apr", source.metadata)
    assert aprfast.inspect(tmp_path / "new.apr")["layout"] == "aprender"
    for name, expected in tensors:
        assert aprfast.load_file(tmp_path / "new.apr")[name].tobytes() == expected.tobytes()
