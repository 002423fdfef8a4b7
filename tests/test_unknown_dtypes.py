"""A dtype aprfast does not know is not fatal where the file says how big the tensor is
(issue 27 item 4): a safetensors dtype name (``data_offsets`` give the extent) or an APR2
index id (the entry gives the size) converts .safetensors -> .apr -> .apr ->
.safetensors byte for byte, its name or id recorded; only a request for its values
raises UnknownDTypeError.  (A GGUF tensor of an unknown type id, which records no size,
is refused: tests/test_ggml_types.py.)"""

import json
import struct
import zlib

import numpy as np
import pytest

import aprfast
from aprfast import dtypes
from aprfast.tensors import RawTensor


def safetensors_bytes(entries, metadata=None) -> bytes:
    """A safetensors file laid out as aprfast (and safetensors) write one: [(name, dtype, shape, data)]."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(e[3] for e in entries)


ENTRIES = [
    ("f5", "F5_E2M2", [2, 4], bytes(range(6))),         # a name nobody knows (yet), 6 bytes
    ("future", "F3_NEW", [5], bytes(range(100, 102))),  # a name nobody knows
    ("w", "F32", [2], np.array([1.5, -2.0], np.float32).tobytes()),
]


def test_safetensors_to_apr_to_apr_to_safetensors_is_byte_identical(tmp_path):
    original = safetensors_bytes(ENTRIES, {"format": "pt"})
    (tmp_path / "a.safetensors").write_bytes(original)
    aprfast.convert(tmp_path / "a.safetensors", tmp_path / "a.apr")
    info = aprfast.inspect(tmp_path / "a.apr")
    assert info["metadata"][dtypes.OPAQUE_NAMES_KEY] == {"f5": "F5_E2M2", "future": "F3_NEW"}
    assert info["tensors"]["f5"]["nbytes"] == 6 and info["tensors"]["f5"]["shape"] == [2, 4]
    with aprfast.open(tmp_path / "a.apr", unknown_dtypes="raw") as f:
        assert f.info("f5").dtype_id == dtypes.OPAQUE_APR2_ID
        assert f.get_tensor("f5").data.tobytes() == bytes(range(6))
        np.testing.assert_array_equal(f.get_tensor("w"), [1.5, -2.0])
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.apr")
    assert aprfast.inspect(tmp_path / "b.apr")["metadata"][dtypes.OPAQUE_NAMES_KEY] == \
        {"f5": "F5_E2M2", "future": "F3_NEW"}
    aprfast.convert(tmp_path / "b.apr", tmp_path / "c.safetensors")
    assert (tmp_path / "c.safetensors").read_bytes() == original


def test_safetensors_own_parser_reads_the_file_back(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    # F6_E2M3 was the example of a type safetensors has and aprfast lacked; aprfast has it
    # now (tests/test_subbyte_dtypes.py), and safetensors' parser still reads it back
    original = safetensors_bytes([("f6", "F6_E2M3", [2, 4], bytes(range(6)))] + ENTRIES[2:])
    (tmp_path / "a.safetensors").write_bytes(original)
    aprfast.convert(tmp_path / "a.safetensors", tmp_path / "a.apr")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.safetensors")
    with safetensors.safe_open(str(tmp_path / "b.safetensors"), "np") as f:
        assert sorted(f.keys()) == ["f6", "w"]


def test_only_values_are_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(safetensors_bytes(ENTRIES))
    aprfast.convert(tmp_path / "a.safetensors", tmp_path / "a.apr", precision="f16")  # F5/F3 kept as bytes
    with aprfast.open(tmp_path / "a.apr", unknown_dtypes="raw") as f:
        raw = f.get_tensor("f5")
        assert f.get_tensor("w").dtype == np.float16
    with pytest.raises(aprfast.UnknownDTypeError, match=r"unknown\(255\) has no values"):
        aprfast.dequantize(raw)
    opaque = RawTensor(dtypes.opaque_dtype("F5_E2M2"), (2, 4), np.arange(6, dtype=np.uint8))
    with pytest.raises(aprfast.UnknownDTypeError, match="F5_E2M2 has no values"):
        aprfast.dequantize(opaque)
    with pytest.raises(aprfast.UnknownDTypeError, match="F5_E2M2"):
        dtypes.numpy_dtype(opaque.dtype)
    # a default open asks for values: the error names the recorded type and the way to its bytes
    with pytest.raises(aprfast.UnknownDTypeError,
                       match=r"tensor 'f5': dtype F5_E2M2 \(kept as bytes under id 255.*unknown_dtypes=\"raw\""):
        aprfast.load_file(tmp_path / "a.apr")
    with pytest.raises(aprfast.LayoutError, match="GGUF cannot hold F5_E2M2"):
        aprfast.convert(tmp_path / "a.apr", tmp_path / "a.gguf")


def patched_id(tmp_path, type_id):
    """An APR2 file whose tensor "a" has the dtype id ``type_id`` (a newer writer's type)."""
    aprfast.save_file({"a": np.arange(8, dtype=np.uint8), "b": np.ones(3, np.float32)}, tmp_path / "k.apr",
                      layout="apr2")
    data = bytearray((tmp_path / "k.apr").read_bytes())
    at = data.find(b"\x01\x00a\x07")  # name length, name, dtype id (U8 = 7)
    data[at + 3] = type_id
    end = len(data) - 16  # the APR2 footer: CRC32 of everything before it, magic, size
    data[end:end + 4] = zlib.crc32(data[:end]).to_bytes(4, "little")  # a newer writer's file is not damaged
    (tmp_path / "u.apr").write_bytes(bytes(data))
    return tmp_path / "u.apr"


def test_an_unknown_apr2_id_survives_apr_to_apr(tmp_path):
    path = patched_id(tmp_path, 150)
    with pytest.raises(aprfast.UnknownDTypeError, match=r"unknown dtype id 150; .*unknown_dtypes=\"raw\""):
        aprfast.open(path)
    aprfast.convert(path, tmp_path / "v.apr")
    with aprfast.open(tmp_path / "v.apr", unknown_dtypes="raw") as f:
        a = f.get_tensor("a")
        assert f.info("a").dtype_id == 150 and a.dtype is None and a.data.tobytes() == bytes(range(8))
        np.testing.assert_array_equal(f.get_tensor("b"), np.ones(3, np.float32))
        with pytest.raises(aprfast.UnknownDTypeError, match=r"unknown\(150\) has no values"):
            aprfast.dequantize(a)
        aprfast.save_file({"a": a}, tmp_path / "w.apr")  # save_file too keeps the id
    with aprfast.open(tmp_path / "w.apr", unknown_dtypes="raw") as f:
        assert f.info("a").dtype_id == 150 and f.get_tensor("a").data.tobytes() == bytes(range(8))
    with pytest.raises(aprfast.LayoutError, match=r"safetensors cannot hold unknown\(150\)"):
        aprfast.convert(path, tmp_path / "v.safetensors")
    with pytest.raises(aprfast.LayoutError, match=r"aprender layout cannot keep .* unknown\(150\)"):
        aprfast.save_file({"a": a}, tmp_path / "x.apr", layout="aprender")


def test_opaque_dtypes_are_one_object_per_name_and_refuse_bad_names():
    assert dtypes.opaque_dtype("F5_E3M1") is dtypes.opaque_dtype("F5_E3M1")
    assert dtypes.unknown_id_dtype(150) is dtypes.unknown_id_dtype(150)
    assert not dtypes.opaque_dtype("F5_E3M1").packed
    for bad in ("", "x" * 65, "a\nb", 3):
        with pytest.raises(aprfast.UnknownDTypeError):
            dtypes.opaque_dtype(bad)
    for bad in (0, 255, 256, -1, True):  # 0 is F32's, 255 the opaque-by-name id
        with pytest.raises(aprfast.UnknownDTypeError):
            dtypes.unknown_id_dtype(bad)


def test_a_hostile_opaque_name_is_a_corrupt_file(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(safetensors_bytes([("x", "Z" * 100, [1], b"\0")]))
    with pytest.raises(aprfast.CorruptError, match="not a dtype name"):
        aprfast.convert(tmp_path / "a.safetensors", tmp_path / "a.apr")
    assert not (tmp_path / "a.apr").exists()
