"""Golden bytes for both v2 layouts.

Each layout is checked three ways: against bytes pinned here (for aprender's layout,
the bytes of aprender's own golden fixture, 516 bytes, whose sha256 the Rust harness
in tests/interop reproduces from apr-format 0.72.3), against an independent
struct-based builder written from docs/FORMAT.md, and by reading what the builder
makes for older aprender versions (null-filled metadata, pre-GH-438 dtype ids).
"""

import hashlib
import json
import struct
import zlib

import numpy as np
import pytest

import aprfast

WEIGHTS = np.array([1.0, 2.0, 0.5, -0.5, 4.0, -2.0, 0.25, 8.0], np.float32)
BIAS = np.array([0.125], np.float32)
GOLDEN_META = {"model_type": "linear_regression", "name": "golden-v2", "version": "0.0.0-golden",
               "created_at": "1700000000", "param_count": 8}
GOLDEN_SHA256 = "047642c8a09f5807466374928c28e370855ddb96f527d4445ee359a591594c2c"

# aprender's golden_v2_skip_none.apr, as apr-format 0.72.3's AprV2Writer writes it.
GOLDEN_APRENDER_HEX = (
    "4150520002000004020000004000000000000000bd00000000010000000000008001000000000000028cc03b00000000"
    "000000000000000000000000000000007b226d6f64656c5f74797065223a226c696e6561725f72656772657373696f6e"
    "222c226e616d65223a22676f6c64656e2d7632222c226c6963656e7365223a6e756c6c2c22646174615f736f75726365"
    "223a6e756c6c2c22646174615f6c6963656e7365223a6e756c6c2c2276657273696f6e223a22302e302e302d676f6c64"
    "656e222c22637265617465645f6174223a2231373030303030303030222c22746f74616c5f73697a65223a302c227061"
    "72616d5f636f756e74223a387d0000000400626961730001010000000000000000000000000000000400000000000000"
    "070077656967687473000108000000000000004000000000000000200000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000003e0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000803f000000400000003f000000bf00008040000000c00000803e00000041"
    "0000000000000000000000000000000000000000000000000000000000000000353f0f55"
)

GOLDEN_APR2_HEX = (
    "415052320200000002000000200000008e000000ae00000063000000400100007b226170725f76657273696f6e223a22"
    "322e302e30222c22637265617465645f6174223a2231373030303030303030222c226d6f64656c5f74797065223a226c"
    "696e6561725f72656772657373696f6e222c226e616d65223a22676f6c64656e2d7632222c22706172616d5f636f756e"
    "74223a382c2276657273696f6e223a22302e302e302d676f6c64656e227d020000000000000004006269617300010100"
    "000000000000000000000000000004000000000000000000000000000000000000000700776569676874730001080000"
    "000000000040000000000000002000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000003e000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000803f000000400000003f000000bf00008040000000c00000803e0000004100000000000000000000000000000000"
    "00000000000000000000000000000000720a669832525041d001000000000000"
)


def golden_tensors():
    return {"weights": WEIGHTS, "bias": BIAS}


# --- an independent builder, written from docs/FORMAT.md ---------------------------
def align64(n):
    return (n + 63) // 64 * 64


def pad64(blob):
    return blob + bytes(align64(len(blob)) - len(blob))


def aprender_file(metadata_json: bytes, tensors, *, flags=0x0400):
    """tensors: list of (name, dtype_id, shape, raw_bytes), written in the given order."""
    index, data = b"", b""
    for name, dtype_id, shape, raw in tensors:
        encoded = name.encode()
        index += struct.pack(f"<H{len(encoded)}sBB{len(shape)}QQQ", len(encoded), encoded, dtype_id,
                             len(shape), *shape, len(data), len(raw))
        data += pad64(raw)
    index_offset = 64 + align64(len(metadata_json))
    data_offset = index_offset + align64(len(index))
    fields = struct.pack("<4sBBHIQIQQ", b"APR\0", 2, 0, flags, len(tensors), 64, len(metadata_json),
                         index_offset, data_offset)
    header = fields + struct.pack("<I", zlib.crc32(fields + bytes(20))) + bytes(20)
    body = header + pad64(metadata_json) + pad64(index) + data
    return body + struct.pack("<I", zlib.crc32(body))


def apr2_file(metadata_json: bytes, tensors, *, alignment=64, flags=None):
    index = struct.pack("<II", len(tensors), 0)
    data = b""
    for name, dtype_id, shape, raw in tensors:
        encoded = name.encode()
        index += struct.pack(f"<H{len(encoded)}sBB{len(shape)}QQQQI", len(encoded), encoded, dtype_id,
                             len(shape), *shape, len(data), len(raw), 0, 0)
        data += raw + bytes(-len(raw) % alignment)
    index_offset = 32 + len(metadata_json)
    data_offset = -(-(index_offset + len(index)) // alignment) * alignment
    flags = {64: 0x02, 32: 0x04}[alignment] if flags is None else flags
    header = struct.pack("<4sHHIIIIII", b"APR2", 2, 0, flags, 32, len(metadata_json), index_offset,
                         len(index), data_offset)
    body = header + metadata_json + index + bytes(data_offset - index_offset - len(index)) + data
    return body + struct.pack("<I4sQ", zlib.crc32(body), b"2RPA", len(body) + 16)


GOLDEN_TENSORS_SORTED = [("bias", 0, [1], BIAS.tobytes()), ("weights", 0, [8], WEIGHTS.tobytes())]


# --- aprender layout ----------------------------------------------------------------
def test_aprender_golden_model_is_byte_identical_to_aprenders_fixture():
    data = aprfast.save(golden_tensors(), GOLDEN_META, layout="aprender")
    assert len(data) == 516
    assert hashlib.sha256(data).hexdigest() == GOLDEN_SHA256
    assert data.hex() == GOLDEN_APRENDER_HEX


def test_aprender_golden_matches_the_independent_builder():
    meta = (b'{"model_type":"linear_regression","name":"golden-v2","license":null,"data_source":null,'
            b'"data_license":null,"version":"0.0.0-golden","created_at":"1700000000","total_size":0,'
            b'"param_count":8}')
    assert aprender_file(meta, GOLDEN_TENSORS_SORTED) == bytes.fromhex(GOLDEN_APRENDER_HEX)


def test_auto_layout_writes_aprenders_layout_for_the_golden_model():
    assert aprfast.save(golden_tensors(), GOLDEN_META) == bytes.fromhex(GOLDEN_APRENDER_HEX)


def test_aprender_header_fields_of_the_golden_model():
    with aprfast.open(bytes.fromhex(GOLDEN_APRENDER_HEX)) as f:
        h = f.header
        assert (f.layout, h["version"], h["flags"], h["tensor_count"]) == ("aprender", "2.0", 0x0400, 2)
        assert (h["metadata_offset"], h["metadata_size"], h["tensor_index_offset"], h["data_offset"]) == \
            (64, 189, 256, 384)
        assert f.info("weights").offset == 384 + 64 and f.info("weights").nbytes == 32
        f.verify()


# Every Option of AprV2Metadata as aprender wrote it before #2254: all present, null.
PRE_2254_FIELDS = [
    "model_type", "name", "description", "author", "license", "data_source", "data_license", "version",
    "source", "original_format", "created_at", "total_size", "param_count", "quantization", "sharding",
    "chat_template", "chat_format", "special_tokens", "architecture", "hf_architecture", "hf_model_type",
    "hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size", "intermediate_size",
    "max_position_embeddings", "rope_theta", "rope_type", "rms_norm_eps", "head_dim", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size",
]


def pre_2254_metadata() -> bytes:
    values = dict.fromkeys(PRE_2254_FIELDS)
    values.update(GOLDEN_META, total_size=0)
    return json.dumps(values, separators=(",", ":")).encode()


def test_pre_2254_null_filled_golden_has_aprenders_pinned_size_and_reads():
    old = aprender_file(pre_2254_metadata(), GOLDEN_TENSORS_SORTED)
    assert len(old) == 1092  # the size aprender pins for golden_v2.apr
    with aprfast.open(old) as f:
        assert f.metadata["description"] is None and f.metadata["name"] == "golden-v2"
        np.testing.assert_array_equal(f.get_tensor("weights"), WEIGHTS)
        np.testing.assert_array_equal(f.get_tensor("bias"), BIAS)


def test_resaving_a_pre_2254_file_gives_what_current_aprender_writes():
    old = aprender_file(pre_2254_metadata(), GOLDEN_TENSORS_SORTED)
    with aprfast.open(old) as f:
        resaved = aprfast.save(f.tensors(copy=True), f.metadata, layout="aprender")
    assert resaved == bytes.fromhex(GOLDEN_APRENDER_HEX)


@pytest.mark.parametrize("legacy_id, current", [(2, "BF16"), (8, "APR_Q4"), (9, "APR_Q8")])
def test_pre_gh438_dtype_ids_read_as_their_current_types(legacy_id, current):
    raw = {"BF16": bytes(range(8)), "APR_Q4": bytes(18), "APR_Q8": struct.pack("<f", 1.0) + bytes(4)}[current]
    shape = [4]
    blob = aprender_file(b'{"model_type":""}', [("t", legacy_id, shape, raw)])
    with aprfast.open(blob) as f:
        info = f.info("t")
        assert info.dtype.name == current and info.dtype_id == legacy_id
        tensor = f.get_tensor("t")
        stored = tensor.data if isinstance(tensor, aprfast.RawTensor) else tensor.view(np.uint8)
        assert bytes(stored) == raw


def test_legacy_ids_are_never_written():
    import ml_dtypes

    data = aprfast.save({"t": np.zeros(4, ml_dtypes.bfloat16)}, layout="aprender")
    with aprfast.open(data) as f:
        assert f.info("t").dtype_id == 30


def test_tensor_data_is_sorted_by_name_and_every_tensor_padded_to_64():
    tensors = {"b": np.ones(3, np.float32), "a": np.arange(17, dtype=np.int8), "c": np.zeros(0, np.float64)}
    data = aprfast.save(tensors, {"model_type": "x"}, layout="aprender")
    expected = aprender_file(
        b'{"model_type":"x","license":null,"data_source":null,"data_license":null,"total_size":0,'
        b'"param_count":0}',
        [("a", 6, [17], tensors["a"].tobytes()), ("b", 0, [3], tensors["b"].tobytes()), ("c", 3, [0], b"")])
    assert data == expected


def test_sharding_metadata_sets_the_sharded_flag():
    meta = {"model_type": "x", "sharding": {"shard_count": 2, "shard_index": 1, "total_size": 0}}
    data = aprfast.save({"t": np.zeros(2, np.float32)}, meta, layout="aprender")
    with aprfast.open(data) as f:
        assert f.header["flags"] == 0x0410
        assert f.metadata["sharding"] == {"shard_count": 2, "shard_index": 1, "total_size": 0, "pattern": None}


# --- spec layout (APR2) -------------------------------------------------------------
def test_apr2_golden_model_bytes():
    data = aprfast.save(golden_tensors(), GOLDEN_META, layout="apr2")
    assert data.hex() == GOLDEN_APR2_HEX


def test_apr2_golden_matches_the_independent_builder():
    meta = (b'{"apr_version":"2.0.0","created_at":"1700000000","model_type":"linear_regression",'
            b'"name":"golden-v2","param_count":8,"version":"0.0.0-golden"}')
    assert apr2_file(meta, GOLDEN_TENSORS_SORTED) == bytes.fromhex(GOLDEN_APR2_HEX)


@pytest.mark.parametrize("alignment", [32, 64])
def test_apr2_alignment_options_match_the_builder(alignment):
    tensors = {"x": np.arange(5, dtype=np.int16), "y": np.ones((2, 3), np.uint32), "z": np.array(True)}
    data = aprfast.save(tensors, {"k": [1, 2.5, None]}, layout="apr2", alignment=alignment)
    expected = apr2_file(
        b'{"apr_version":"2.0.0","k":[1,2.5,null]}',
        [("x", 4, [5], tensors["x"].tobytes()), ("y", 35, [2, 3], tensors["y"].tobytes()),
         ("z", 33, [], tensors["z"].tobytes())], alignment=alignment)
    assert data == expected


def test_apr2_sets_quantized_flag_for_packed_tensors():
    q = aprfast.QuantizedTensor("Q8_0", (2, 32), bytes(68))
    data = aprfast.save({"q": q}, layout="apr2")
    expected = apr2_file(b'{"apr_version":"2.0.0"}', [("q", 16, [2, 32], bytes(68))], flags=0x02 | 0x40)
    assert data == expected
