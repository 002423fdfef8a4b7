"""The v1 container (``APRN``): aprender's bytes, every combination of compression,
encryption, signing and licensing, and every Andon signal.

The golden file is aprender's own fixture (apr-format ``tests/fixtures/golden_v1.apr``,
171 bytes): its payload is the bincode of ``GoldenModel {name, weights, bias}``, built
here by hand.  tests/interop/test_interop_v1.py checks the same things against the
live Rust crate.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aprfast import v1
from aprfast.codecs.payload import Compression
from aprfast.crypto import core as crypto
from aprfast.errors import (
    AprError,
    ChecksumError,
    CorruptError,
    DecryptError,
    FormatError,
    LayoutError,
    LimitError,
    ModelTypeMismatchError,
    SignatureError,
    VersionError,
)
from aprfast.layouts import v1 as layout
from aprfast.layouts.v1 import Flag, Header, ModelType
from aprfast.v1 import licensing

GOLDEN_SHA256 = "a5f8d2ae45d9c3f751d8ad89d6804c18f7c0d5b6ae16cb056396e51b31f76d30"
GOLDEN_WEIGHTS = [1.0, 2.0, 0.5, -0.5, 4.0, -2.0, 0.25, 8.0]
GOLDEN_META = {"created_at": "1700000000", "aprender_version": "0.0.0-golden", "model_name": "golden-v1"}
PINNED = {"created_at": "1700000000", "aprender_version": "0.0.0-test"}


def golden_bincode(name: str = "golden_v1", weights=GOLDEN_WEIGHTS, bias: float = 0.125) -> bytes:
    """bincode 1.3 (fixint, LE) of ``struct GoldenModel {name: String, weights: Vec<f32>,
    bias: f32}``: u64 length + UTF-8, u64 count + f32s, f32."""
    raw = name.encode()
    return (struct.pack("<Q", len(raw)) + raw + struct.pack("<Q", len(weights))
            + struct.pack(f"<{len(weights)}f", *weights) + struct.pack("<f", bias))


def recrc(data) -> bytes:
    """The same bytes with the trailing CRC32 made right again (to reach later checks)."""
    body = bytes(data[:-4])
    return body + zlib.crc32(body).to_bytes(4, "little")


def flip(data, byte: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[byte] ^= 1 << bit
    return bytes(out)


@pytest.fixture(scope="module")
def keys():
    seed, public = crypto.generate_signing_key()
    other_seed, other_public = crypto.generate_signing_key()
    alice_secret, alice_public = crypto.generate_x25519_key()
    bob_secret, bob_public = crypto.generate_x25519_key()
    eve_secret, _ = crypto.generate_x25519_key()
    return dict(seed=seed, public=public, other_seed=other_seed, other_public=other_public,
                alice=alice_secret, alice_pub=alice_public, bob=bob_secret, bob_pub=bob_public, eve=eve_secret)


@pytest.fixture(scope="module")
def lic():
    return licensing.License.issue(
        "Acme Corp", now=1_700_000_000, expires_at=1_900_000_000, seat_limit=5,
        flags=licensing.LicenseFlags.EXPIRATION_ENFORCED | licensing.LicenseFlags.SEATS_ENFORCED)


# =========================================================================================
# Golden bytes
# =========================================================================================
def test_golden_v1_is_byte_identical_to_aprenders_fixture():
    data = v1.save_model(golden_bincode(), model_type=ModelType.LinearRegression, metadata=GOLDEN_META,
                         compression="none", quality_score=85)
    assert len(data) == 171
    assert hashlib.sha256(data).hexdigest() == GOLDEN_SHA256
    assert data[:32].hex() == "4150524e0100" "0100" "4a000000" "3d000000" "3d000000" "00" "00" "55" + "00" * 9
    assert data[-4:] == zlib.crc32(data[:-4]).to_bytes(4, "little")


def test_golden_v1_reads_back():
    data = v1.save_model(golden_bincode(), model_type=1, metadata=GOLDEN_META, quality_score=85)
    model = v1.load_model(data, expected_type="LinearRegression")
    assert model.payload == golden_bincode()
    assert model.metadata == GOLDEN_META
    assert model.header.quality_score == 85
    assert model.model_type is ModelType.LinearRegression
    assert (model.signature, model.encryption, model.license, model.flags) == (v1.UNSIGNED, "none", None, Flag(0))


def test_same_inputs_give_the_same_bytes_whatever_the_dict_order():
    meta_a = {**PINNED, "custom": {"b": 1, "a": {"y": 2, "x": [3]}}, "metrics": {"z": 1.5, "m": -2}}
    meta_b = {"metrics": {"m": -2, "z": 1.5}, "custom": {"a": {"x": [3], "y": 2}, "b": 1}, **PINNED}
    assert v1.save_model(b"p", model_type=1, metadata=meta_a) == v1.save_model(b"p", model_type=1, metadata=meta_b)


# =========================================================================================
# Header
# =========================================================================================
def test_model_type_ids_and_names_are_aprenders():
    assert {t.name: int(t) for t in ModelType} == {
        "LinearRegression": 1, "LogisticRegression": 2, "DecisionTree": 3, "RandomForest": 4,
        "GradientBoosting": 5, "KMeans": 6, "Pca": 7, "NaiveBayes": 8, "Knn": 9, "Svm": 10, "NgramLm": 0x10,
        "Tfidf": 0x11, "CountVectorizer": 0x12, "NeuralSequential": 0x20, "NeuralCustom": 0x21,
        "ContentRecommender": 0x30, "MixtureOfExperts": 0x40, "Custom": 0xFF}
    assert [int(f) for f in Flag] == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("model_type", list(ModelType))
def test_every_model_type_round_trips_through_the_header(model_type):
    data = v1.save_model(b"x", model_type=model_type, metadata=PINNED)
    assert struct.unpack_from("<H", data, 6)[0] == int(model_type)
    assert v1.load_model(data, expected_type=model_type).model_type is model_type


def test_header_fields_sit_at_aprenders_offsets():
    header = Header(ModelType.MixtureOfExperts, 0x01020304, 0x05060708, 0x0A0B0C0D, Compression.LZ4,
                    Flag.SIGNED | Flag.LICENSED, 99)
    raw = header.to_bytes()
    assert raw[:6] == b"APRN\x01\x00" and raw[6:8] == b"\x40\x00"
    assert raw[8:12] == bytes([4, 3, 2, 1]) and raw[12:16] == bytes([8, 7, 6, 5])
    assert raw[16:20] == bytes([13, 12, 11, 10])
    assert (raw[20], raw[21], raw[22]) == (3, 0x0A, 99) and raw[23:] == bytes(9)
    assert Header.from_bytes(raw) == header


def test_header_reading_follows_aprenders_rules():
    raw = bytearray(Header(ModelType.Custom).to_bytes())
    raw[5] = 7            # the minor version is ignored
    raw[23:32] = b"\xff" * 9  # reserved bytes are not checked
    raw[21] = 0x80 | 0x10     # bit 7 is masked off when flags are interpreted
    header = Header.from_bytes(bytes(raw))
    assert header.version == (1, 7) and header.flag_set == Flag.TRUENO_NATIVE and header.flags == 0x90
    raw[4] = 0                # major 0 is accepted, as aprender accepts it
    Header.from_bytes(bytes(raw))
    with pytest.raises(VersionError):
        Header.from_bytes(bytes(raw[:4]) + b"\x02" + bytes(raw[5:]))
    with pytest.raises(FormatError, match="model type"):
        Header.from_bytes(bytes(raw[:6]) + b"\x13\x00" + bytes(raw[8:]))
    with pytest.raises(VersionError, match="compression"):
        Header.from_bytes(bytes(raw[:20]) + b"\x04" + bytes(raw[21:]))
    with pytest.raises(FormatError):
        Header.from_bytes(b"APRN")


@pytest.mark.parametrize("kwargs", [dict(metadata_size=1 << 32), dict(quality_score=256)])
def test_header_refuses_values_that_do_not_fit(kwargs):
    with pytest.raises(LayoutError):
        Header(ModelType.Custom, **kwargs).to_bytes()


# =========================================================================================
# Metadata: rmp_serde::to_vec_named byte for byte
# =========================================================================================
def packed(*pairs) -> bytes:
    """msgpack of an ordered map (Python's msgpack writes every scalar here the way rmp
    does: smallest int and str forms, float64 for Python floats)."""
    return msgpack.packb(dict(pairs), use_bin_type=True)


def test_metadata_keeps_aprenders_field_order_and_skip_rules():
    meta = {"model_card": {"model_id": "i", "name": "n", "version": "v", "created_at": "c",
                           "framework_version": "f"},
            "custom": {"k": None}, "description": "d", "aprender_version": "0", "created_at": "t",
            "hyperparameters": {}, "metrics": {}}
    expected = packed(("created_at", "t"), ("aprender_version", "0"), ("description", "d"), ("custom", {"k": None}),
                      ("model_card", {"model_id": "i", "name": "n", "version": "v", "created_at": "c",
                                      "framework_version": "f"}))
    assert layout.encode_metadata(meta) == expected


def test_json_values_use_the_compact_forms_and_sorted_keys():
    values = {"u": [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1],
              "i": [-1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63],
              "f": [0.5, -1e300, 1.0], "s": ["", "a" * 31, "b" * 32, "c" * 255, "d" * 256, "é" * 40000],
              "o": {"zz": {"b": True, "a": False}, "a": None}, "l": [[], [[1]], {}]}
    block = layout.encode_metadata({**PINNED, "custom": values})
    expected = packed(*PINNED.items(), ("custom", {k: _sorted(values[k]) for k in sorted(values)}))
    assert block == expected
    assert block.count(b"\xcf") >= 1 and b"\xd3" in block and b"\xd9\x20" in block and b"\xda\x01\x00" in block


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def test_maps_with_sixteen_or_more_entries_use_map16():
    custom = {f"k{i:02d}": i for i in range(16)}
    block = layout.encode_metadata({**PINNED, "custom": custom})
    assert b"\xa6custom\xde\x00\x10" in block


def test_f32_fields_are_float32_and_enums_are_variant_names():
    info = {"method": "Ensemble",
            "teacher": {"hash": "h", "model_type": ModelType.KMeans, "param_count": 300,
                        "ensemble_teachers": [{"hash": "g", "model_type": "Custom", "param_count": 1}]},
            "params": {"temperature": 0.1, "alpha": 2, "epochs": 3, "final_loss": 1e-7},
            "layer_mapping": [{"student_layer": 0, "teacher_layer": 9, "weight": 0.25}]}
    block = layout.encode_metadata({**PINNED, "distillation_info": info})
    f32 = lambda x: b"\xca" + struct.pack(">f", x)  # noqa: E731
    expected = (b"\x83" + packed(*PINNED.items())[1:] + b"\xb1distillation_info"
                + b"\x84" + b"\xa6method\xa8Ensemble"
                + b"\xa7teacher\x84\xa4hash\xa1h\xaamodel_type\xa6KMeans\xabparam_count\xcd\x01\x2c"
                + b"\xb1ensemble_teachers\x91\x83\xa4hash\xa1g\xaamodel_type\xa6Custom\xabparam_count\x01"
                + b"\xa6params\x84\xabtemperature" + f32(0.1) + b"\xa5alpha" + f32(2.0) + b"\xa6epochs\x03"
                + b"\xaafinal_loss" + f32(1e-7)
                + b"\xadlayer_mapping\x91\x83\xadstudent_layer\x00\xadteacher_layer\x09\xa6weight" + f32(0.25))
    assert block == expected
    decoded = layout.decode_metadata(block)["distillation_info"]
    assert decoded["params"]["temperature"] == struct.unpack(">f", struct.pack(">f", 0.1))[0]


def test_training_license_and_model_card_follow_the_rust_structs():
    meta = {**PINNED, "training": {"source": "s", "samples": 2**40},
            "license": {"tier": "Academic", "uuid": "u", "hash": "h", "seats": 70000, "licensee": "L"},
            "model_card": {"extra_b": [1], "target_hardware": ["cpu"], "param_count": 5, "metrics": {"acc": 0.5},
                           "training_data": {"hash": "x", "name": "d"}, "extra_a": "y", "framework_version": "f",
                           "created_at": "c", "version": "1", "name": "n", "model_id": "m", "license": "MIT"}}
    expected = packed(*PINNED.items(),
                      ("training", {"samples": 2**40, "source": "s"}),
                      ("license", {"uuid": "u", "hash": "h", "seats": 70000, "licensee": "L", "tier": "Academic"}),
                      ("model_card", {"model_id": "m", "name": "n", "version": "1", "created_at": "c",
                                      "framework_version": "f", "license": "MIT",
                                      "training_data": {"name": "d", "hash": "x"}, "metrics": {"acc": 0.5},
                                      "param_count": 5, "target_hardware": ["cpu"],
                                      "extra_a": "y", "extra_b": [1]}))
    assert layout.encode_metadata(meta) == expected


@pytest.mark.parametrize("bad, match", [
    ({"unknown": 1}, "unknown field"),
    ({"training": {"samples": -1}}, "does not fit"),
    ({"training": {"epochs": 1}}, "unknown field"),
    ({"license": {"uuid": "u", "hash": "h", "tier": "Gold"}}, "not a LicenseTier"),
    ({"license": {"uuid": "u", "hash": "h", "tier": "Team", "seats": 2**32}}, "does not fit u32"),
    ({"custom": {"x": float("nan")}}, "not finite"),
    ({"custom": {"x": 2**64}}, "outside i64/u64"),
    ({"custom": {"x": b"bytes"}}, "not a JSON value"),
    ({"custom": {1: "int key"}}, "keys must be str"),
    ({"model_name": 5}, "expected a string"),
    ({"created_at": None}, "required field"),
    ({"model_card": {"name": "n"}}, "required field"),
    ({"distillation_info": {"method": "Standard", "teacher": {"hash": "h", "model_type": "Nope", "param_count": 1},
                            "params": {"temperature": 1, "alpha": 1, "epochs": 1}}}, "ModelType variant"),
    ({"distillation_info": {"method": "Standard", "teacher": {"hash": "h", "model_type": "Svm", "param_count": 1},
                            "params": {"temperature": 1e39, "alpha": 1, "epochs": 1}}}, "f32 range"),
    ({"license_block": b"x"}, "reserved"),
])
def test_metadata_aprender_could_not_hold_is_refused(bad, match):
    with pytest.raises(LayoutError, match=match):
        v1.save_model(b"x", model_type=1, metadata={**PINNED, **bad})


def test_metadata_defaults_are_now_and_aprfasts_version():
    model = v1.load_model(v1.save_model(b"x", model_type=1))
    assert model.metadata["aprender_version"] == v1.DEFAULT_APRENDER_VERSION
    assert model.metadata["created_at"].isdigit()


# =========================================================================================
# Payloads
# =========================================================================================
def test_bytes_payloads_come_back_as_bytes():
    for payload in (b"", bytearray(b"abc"), memoryview(b"xyz"), np.arange(4, dtype=np.int16)):
        model = v1.load_model(v1.save_model(payload, model_type="Custom", metadata=PINNED))
        assert isinstance(model.payload, bytes) and model.payload == bytes(memoryview(payload).cast("B"))


def test_tensor_payloads_are_a_v2_container_marked_in_custom_metadata():
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1.5, -2.0])}
    data = v1.save_model(tensors, metadata=PINNED)
    header = Header.from_bytes(data[:32])
    assert header.model_type == ModelType.NeuralCustom
    payload = data[32 + header.metadata_size:32 + header.metadata_size + header.payload_size]
    assert payload[:4] == b"APR\x00"
    assert layout.decode_metadata(data[32:32 + header.metadata_size])["custom"] == {"payload_format": "apr-v2-tensors"}
    model = v1.load_model(data)
    assert model.is_tensors and sorted(model.payload) == ["b", "w"]
    np.testing.assert_array_equal(model.payload["w"], tensors["w"])
    assert model.metadata["custom"]["payload_format"] == v1.TENSOR_PAYLOAD_FORMAT


def test_plain_tensor_payloads_are_zero_copy_and_64_byte_aligned_in_the_map(tmp_path):
    path = tmp_path / "t.apr"
    v1.save_model({"w": np.ones((8, 8), np.float32), "v": np.arange(3, dtype=np.int64)}, path, metadata=PINNED)
    header = Header.from_bytes(path.read_bytes()[:32])
    assert (32 + header.metadata_size) % 64 == 0  # the payload_pad entry put it there
    model = v1.load_model(path)
    for array in model.payload.values():
        assert array.ctypes.data % 64 == 0 and not array.flags.writeable and not array.flags.owndata


def test_tensor_arrays_outlive_the_model_and_the_file_handle(run_child, tmp_path):
    """The map stays alive as long as an array views it (a child process: a dangling
    map would crash the interpreter)."""
    path = tmp_path / "t.apr"
    v1.save_model({"w": np.arange(1000, dtype=np.float32)}, path, metadata=PINNED)
    result = run_child("import gc, sys\nfrom aprfast import v1\n"
                       "w = v1.load_model(sys.argv[1]).payload['w']\ngc.collect()\nprint(float(w.sum()))", path)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == float(np.arange(1000).sum())


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_tensor_payloads_view_the_decompressed_buffer(compression):
    tensors = {"w": np.zeros((64, 64), np.float32)}
    data = v1.save_model(tensors, compression=compression, metadata=PINNED)
    assert len(data) < 2000
    model = v1.load_model(data)
    np.testing.assert_array_equal(model.payload["w"], tensors["w"])
    assert not model.payload["w"].flags.owndata


def test_payload_marker_and_payload_kind_must_agree():
    with pytest.raises(LayoutError):
        v1.save_model(b"x", model_type=1, metadata={**PINNED, "custom": {"payload_format": "apr-v2-tensors"}})
    with pytest.raises(LayoutError):
        v1.save_model({"w": np.ones(1)}, metadata={**PINNED, "custom": {"payload_format": "bincode"}})
    with pytest.raises(TypeError, match="model_type"):
        v1.save_model(b"x")
    with pytest.raises(TypeError):
        v1.save_model(12345, model_type=1)


# =========================================================================================
# Quality score, flags, sizes
# =========================================================================================
def test_quality_score_zero_is_refused_like_aprenders_jidoka_gate(tmp_path):
    with pytest.raises(LayoutError, match="Jidoka"):
        v1.save_model(b"x", tmp_path / "q.apr", model_type=1, quality_score=0)
    assert not list(tmp_path.iterdir())
    assert v1.save_model(b"x", model_type=1, metadata=PINNED)[22] == 0
    assert v1.save_model(b"x", model_type=1, metadata=PINNED, quality_score=255)[22] == 255
    for bad in (256, -1, 1.5, True):
        with pytest.raises(LayoutError):
            v1.save_model(b"x", model_type=1, quality_score=bad)


def test_licensed_flag_is_set_iff_a_license_is_present(lic):
    assert v1.save_model(b"x", model_type=1, metadata=PINNED)[21] == 0
    entry = {"uuid": "u", "hash": "h", "tier": "Team"}
    assert v1.save_model(b"x", model_type=1, metadata={**PINNED, "license": entry})[21] == Flag.LICENSED
    assert v1.save_model(b"x", model_type=1, metadata=PINNED, license=lic)[21] == Flag.LICENSED


def test_streaming_flag_is_refused_because_its_chunk_index_has_no_layout():
    data = bytearray(v1.save_model(b"x", model_type=1, metadata=PINNED))
    data[21] |= Flag.STREAMING
    with pytest.raises(VersionError, match="chunk index"):
        v1.load_model(recrc(data))


@pytest.mark.parametrize("bits", [Flag.TRUENO_NATIVE, Flag.QUANTIZED, Flag.HAS_MODEL_CARD, 0x80])
def test_flags_that_only_describe_the_payload_are_read_and_reported(bits):
    data = bytearray(v1.save_model(b"payload", model_type=1, metadata=PINNED))
    data[21] |= bits
    model = v1.load_model(recrc(data))
    assert model.payload == b"payload" and model.header.flags == bits
    assert model.flags == Flag(bits & 0x7F)


def test_every_byte_must_be_accounted_for():
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED)
    with pytest.raises(CorruptError, match="not explained"):
        v1.load_model(recrc(data[:-4] + b"extra" + data[-4:]))
    with pytest.raises(CorruptError, match="truncated"):
        v1.load_model(recrc(data[:-6] + data[-4:]))
    signed_flag_without_block = bytearray(data)
    signed_flag_without_block[21] |= Flag.SIGNED
    with pytest.raises(CorruptError):
        v1.load_model(recrc(signed_flag_without_block))


def test_limits_are_checked_before_anything_is_allocated():
    data = v1.save_model(b"x" * 1000, model_type=1, metadata=PINNED, compression="zstd")
    with pytest.raises(LimitError, match="above the limit of 999"):
        v1.load_model(data, max_uncompressed=999)
    assert v1.load_model(data, max_uncompressed=1000).payload == b"x" * 1000


def test_uncompressed_size_must_match_what_the_payload_inflates_to():
    data = bytearray(v1.save_model(b"x" * 1000, model_type=1, metadata=PINNED, compression="zstd"))
    struct.pack_into("<I", data, 16, 100)
    with pytest.raises(CorruptError, match="beyond the 100 bytes"):
        v1.load_model(recrc(data))
    struct.pack_into("<I", data, 16, 2000)
    with pytest.raises(CorruptError, match="inflates to 1000"):
        v1.load_model(recrc(data))


# =========================================================================================
# Andon signals (seed 002 §5.1), each from a crafted file
# =========================================================================================
def test_andon_invalid_format_bad_magic():
    data = v1.save_model(b"x", model_type=1, metadata=PINNED)
    with pytest.raises(FormatError, match="magic"):
        v1.load_model(b"APRX" + data[4:])
    with pytest.raises(FormatError):
        v1.load_model(b"APR")
    with pytest.raises(FormatError, match="too short"):
        v1.load_model(b"APRN" + bytes(20))


def test_andon_checksum_mismatch_stops_before_parsing():
    data = bytearray(v1.save_model(b"x", model_type=1, metadata=PINNED))
    struct.pack_into("<I", data, 8, 0xFFFFFFFF)  # a lying size would fail later, but the CRC goes first
    with pytest.raises(ChecksumError):
        v1.load_model(bytes(data))


def test_andon_signature_invalid(keys):
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED, signing_key=keys["seed"])
    offset = 32 + Header.from_bytes(data[:32]).metadata_size
    with pytest.raises(SignatureError, match="does not verify"):
        v1.load_model(recrc(flip(data, offset)))
    with pytest.raises(SignatureError, match="not among"):
        v1.load_model(data, trusted_keys=[keys["other_public"]])


def test_andon_decryption_failed(keys):
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED, password="right")
    with pytest.raises(DecryptError):
        v1.load_model(data, password="wrong")
    with pytest.raises(DecryptError, match="pass password"):
        v1.load_model(data)
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED, recipient=keys["alice_pub"])
    with pytest.raises(DecryptError, match="not the recipient"):
        v1.load_model(data, private_key=keys["eve"])


def test_andon_unsupported_version():
    data = bytearray(v1.save_model(b"x", model_type=1, metadata=PINNED))
    data[4] = 2
    with pytest.raises(VersionError, match="2.0"):
        v1.load_model(recrc(data))


def test_andon_model_type_mismatch_names_both_types():
    data = v1.save_model(b"x", model_type=ModelType.KMeans, metadata=PINNED)
    with pytest.raises(ModelTypeMismatchError, match=r"KMeans \(0x0006\), expected Svm \(0x000a\)") as info:
        v1.load_model(data, expected_type=ModelType.Svm)
    assert info.value.code == "E001" and isinstance(info.value, FormatError)
    assert v1.load_model(data, expected_type=6).model_type is ModelType.KMeans


# =========================================================================================
# Encryption, signing, licensing and their combinations
# =========================================================================================
ENCRYPTIONS = ["none", "password", "recipient", "recipients"]


def _encrypt_args(mode, keys):
    return {"none": {}, "password": {"password": "s3cret"}, "recipient": {"recipient": keys["alice_pub"]},
            "recipients": {"recipients": [keys["alice_pub"], keys["bob_pub"]]}}[mode]


def _decrypt_args(mode, keys):
    return {"none": {}, "password": {"password": "s3cret"}, "recipient": {"private_key": keys["alice"]},
            "recipients": {"private_key": keys["bob"]}}[mode]


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("encryption", ENCRYPTIONS)
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("licensed", [False, True], ids=["nolicense", "licensed"])
@pytest.mark.parametrize("kind", ["bytes", "tensors"])
def test_every_combination_round_trips(compression, encryption, signed, licensed, kind, keys, lic):
    payload = golden_bincode(weights=[0.5] * 300) if kind == "bytes" else {"w": np.arange(300, dtype=np.float32)}
    data = v1.save_model(payload, model_type=ModelType.Custom, metadata={**PINNED, "model_name": "combo"},
                         compression=compression, signing_key=keys["seed"] if signed else None,
                         license=lic if licensed else None, quality_score=77, **_encrypt_args(encryption, keys))
    header = Header.from_bytes(data[:32])
    assert header.compression == compression and header.quality_score == 77
    assert bool(header.flags & Flag.ENCRYPTED) == (encryption != "none")
    assert bool(header.flags & Flag.SIGNED) == signed and bool(header.flags & Flag.LICENSED) == licensed
    model = v1.load_model(data, trusted_keys=[keys["public"]] if signed else None, **_decrypt_args(encryption, keys))
    if kind == "bytes":
        assert model.payload == payload
        assert header.uncompressed_size == len(payload)
    else:
        np.testing.assert_array_equal(model.payload["w"], payload["w"])
    assert model.signature == (v1.TRUSTED if signed else v1.UNSIGNED)
    assert model.encryption == {"recipients": "multi-recipient"}.get(encryption, encryption)
    assert model.license == (lic if licensed else None)
    assert model.metadata["model_name"] == "combo"


def test_encrypted_header_keeps_aprenders_meaning(keys):
    plain = golden_bincode()
    data = v1.save_model(plain, model_type=1, metadata=PINNED, compression="zstd", password="pw")
    header = Header.from_bytes(data[:32])
    compressed = Compression.ZSTD_DEFAULT
    assert header.compression == compressed  # what was applied before encrypting
    assert header.uncompressed_size == len(plain)  # the bincode length
    stored = data[32 + header.metadata_size:32 + header.metadata_size + header.payload_size]
    from aprfast.codecs import payload as codecs

    assert header.payload_size == 16 + 12 + len(codecs.compress(plain, "zstd")) + 16  # salt, nonce, ct, tag
    assert crypto.decrypt_with_password(stored, "pw") == codecs.compress(plain, "zstd")


def test_the_signature_covers_header_metadata_and_the_stored_payload(keys):
    """Encrypt-then-sign: the signature is over the ciphertext exactly as stored, and
    the block is signature(64) || public key(32) right before the CRC."""
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED, password="pw", compression="lz4",
                         signing_key=keys["seed"])
    header = Header.from_bytes(data[:32])
    signed_end = 32 + header.metadata_size + header.payload_size
    assert len(data) == signed_end + 96 + 4
    signature, public = data[signed_end:signed_end + 64], data[signed_end + 64:signed_end + 96]
    assert public == keys["public"]
    crypto.verify([data[:signed_end]], signature, public)
    model = v1.load_model(data, password="pw")
    assert model.signature == v1.SELF_SIGNED and model.signer == keys["public"] and not model.trusted


def test_verification_streams_over_the_mapped_file(keys, tmp_path, monkeypatch):
    path = tmp_path / "s.apr"
    v1.save_model(b"payload" * 100, path, model_type=1, metadata=PINNED, signing_key=keys["seed"])
    seen = []
    real_verify = crypto.verify

    def recording_verify(parts, signature, public_key):
        parts = list(parts)
        seen.extend(parts)
        return real_verify(parts, signature, public_key)

    monkeypatch.setattr(crypto, "verify", recording_verify)
    v1.load_model(path, trusted_keys=[keys["public"]])
    assert len(seen) == 1 and isinstance(seen[0], memoryview)
    assert type(seen[0].obj).__name__ == "mmap"  # the file's own pages, not a copy


def test_signature_policy(keys):
    unsigned = v1.save_model(b"x", model_type=1, metadata=PINNED)
    signed = v1.save_model(b"x", model_type=1, metadata=PINNED, signing_key=keys["seed"])
    with pytest.raises(SignatureError, match="not signed"):
        v1.load_model(unsigned, require_signature=True)
    with pytest.raises(SignatureError, match="not signed"):
        v1.load_model(unsigned, trusted_keys=[keys["public"]])  # trusted keys imply a signature
    assert v1.load_model(unsigned, trusted_keys=[keys["public"]], require_signature=False).signature == v1.UNSIGNED
    assert v1.load_model(signed).signature == v1.SELF_SIGNED
    assert v1.load_model(signed, require_signature=True).signature == v1.SELF_SIGNED
    assert v1.load_model(signed, trusted_keys=[keys["other_public"], keys["public"]]).trusted
    with pytest.raises(SignatureError, match="not among"):
        v1.load_model(signed, trusted_keys=[])


def test_signature_is_checked_before_decryption(keys, monkeypatch):
    data = v1.save_model(b"payload", model_type=1, metadata=PINNED, password="pw", signing_key=keys["seed"])
    offset = 32 + Header.from_bytes(data[:32]).metadata_size + 40
    monkeypatch.setattr(crypto, "decrypt_with_password", lambda *a: pytest.fail("decrypted before verifying"))
    with pytest.raises(SignatureError):
        v1.load_model(recrc(flip(data, offset)), password="pw")


def test_license_block_and_aprender_entry(lic):
    data = v1.save_model(b"x", model_type=1, metadata=PINNED, license=lic)
    raw_meta = layout.decode_metadata(data[32:32 + Header.from_bytes(data[:32]).metadata_size])
    assert raw_meta["license"] == licensing.to_aprender_entry(lic)
    assert raw_meta["license_block"] == licensing.encode_license_block(lic)
    assert list(raw_meta)[-1] == "license_block"  # after aprender's fields
    model = v1.load_model(data)
    assert model.license == lic and "license_block" not in model.metadata
    model.check_license(now=1_800_000_000, seats_in_use=5)
    with pytest.raises(licensing.LicenseError, match="expired"):
        model.check_license(now=1_900_000_000)
    with pytest.raises(licensing.LicenseError, match="seat"):
        v1.check_license(model, now=1_800_000_000, seats_in_use=6)
    v1.check_license(lic, now=1_800_000_000)


def test_license_entry_may_be_customised_but_must_match(lic):
    team = licensing.to_aprender_entry(lic, tier="Team", licensee_name="Acme Corp")
    data = v1.save_model(b"x", model_type=1, metadata={**PINNED, "license": team}, license=lic)
    assert v1.load_model(data).metadata["license"]["tier"] == "Team"
    other = licensing.License.issue("Someone else")
    with pytest.raises(LayoutError, match="another license"):
        v1.save_model(b"x", model_type=1, metadata={**PINNED, "license": licensing.to_aprender_entry(other)},
                      license=lic)


def test_a_block_that_disagrees_with_the_entry_is_corrupt(lic):
    other = licensing.License.issue("Mallory")
    meta = layout.encode_metadata({**PINNED, "license": licensing.to_aprender_entry(lic)},
                                  license_block=licensing.encode_license_block(other))
    data = b"".join(layout.assemble(Header(1, len(meta), 1, 1, 0, Flag.LICENSED), meta, b"x"))
    with pytest.raises(CorruptError, match="different licenses"):
        v1.load_model(data)


def test_a_model_without_a_license_fails_a_license_check():
    model = v1.load_model(v1.save_model(b"x", model_type=1, metadata=PINNED))
    with pytest.raises(licensing.LicenseError, match="no license"):
        model.check_license()


def test_encryption_modes_are_exclusive(keys):
    with pytest.raises(ValueError, match="one encryption mode"):
        v1.save_model(b"x", model_type=1, password="p", recipient=keys["alice_pub"])
    with pytest.raises(ValueError):
        v1.save_model(b"x", model_type=1, recipients=[])
    with pytest.raises(ValueError, match="not both"):
        v1.load_model(b"", password="p", private_key=keys["alice"])


def test_a_multi_recipient_payload_is_opened_by_each_recipient_only(keys):
    data = v1.save_model(b"secret", model_type=1, metadata=PINNED,
                         recipients=iter([keys["alice_pub"], keys["bob_pub"]]))  # any iterable
    for secret in (keys["alice"], keys["bob"]):
        assert v1.load_model(data, private_key=secret).payload == b"secret"
    with pytest.raises(DecryptError, match="not a recipient"):
        v1.load_model(data, private_key=keys["eve"])
    with pytest.raises(DecryptError):
        v1.load_model(data, password="guess")


# =========================================================================================
# Tampering: every single flipped bit is caught, in the order CRC, signature, AEAD
# =========================================================================================
def _outcome(data, **kwargs):
    try:
        v1.load_model(data, **kwargs)
    except AprError as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("encryption", ENCRYPTIONS)
def test_every_flipped_bit_is_caught_by_the_crc(encryption, keys, lic):
    data = v1.save_model(golden_bincode(), model_type=1, metadata={**PINNED, "model_name": "flip"},
                         compression="zstd", signing_key=keys["seed"], license=lic, **_encrypt_args(encryption, keys))
    kwargs = dict(trusted_keys=[keys["public"]], **_decrypt_args(encryption, keys))
    assert _outcome(data, **kwargs) is None
    if encryption == "password":  # Argon2 makes full decryption slow: nothing gets that far anyway
        kwargs = dict(trusted_keys=[keys["public"]], password="s3cret")
    for byte in range(len(data)):
        for bit in range(8):
            expected = FormatError if byte < 4 else ChecksumError
            assert _outcome(flip(data, byte, bit), **kwargs) is expected, (byte, bit)


def test_bits_flipped_under_a_recomputed_crc_are_caught_by_the_signature(keys, lic):
    data = v1.save_model(golden_bincode(), model_type=1, metadata={**PINNED, "model_name": "flip"},
                         compression="lz4", signing_key=keys["seed"], license=lic, recipient=keys["alice_pub"])
    header = Header.from_bytes(data[:32])
    signed_end = 32 + header.metadata_size + header.payload_size
    outcomes = {}
    for byte in range(len(data) - 4):
        for bit in range(8):
            result = _outcome(recrc(flip(data, byte, bit)), trusted_keys=[keys["public"]], private_key=keys["alice"])
            assert result is not None, (byte, bit)
            outcomes.setdefault(result, set()).add(byte)
    # From the quality score on, every flip is a signature failure; flips in the fields
    # before it may be caught by the header checks first (magic, version, type, sizes,
    # compression id, flags), which run before the signature, never after it.
    assert set(range(22, len(data) - 4)) <= outcomes[SignatureError]
    assert set(outcomes) <= {SignatureError, FormatError, VersionError, CorruptError, LimitError}
    assert signed_end + 96 == len(data) - 4


def test_payload_bits_flipped_in_unsigned_encrypted_files_are_caught_by_gcm(keys):
    for encryption in ("recipient", "recipients"):
        data = v1.save_model(b"0123456789" * 5, model_type=1, metadata=PINNED, **_encrypt_args(encryption, keys))
        header = Header.from_bytes(data[:32])
        start = 32 + header.metadata_size
        for byte in range(start, start + header.payload_size):
            result = _outcome(recrc(flip(data, byte, byte % 8)), **_decrypt_args(encryption, keys))
            assert result is DecryptError, (encryption, byte)


# =========================================================================================
# Sources, atomic writes, inspection
# =========================================================================================
def test_paths_file_objects_and_buffers(tmp_path):
    data = v1.save_model(b"abc", model_type=1, metadata=PINNED)
    path = tmp_path / "m.apr"
    assert v1.save_model(b"abc", path, model_type=1, metadata=PINNED) is None
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["m.apr"]  # no temporary file left
    sink = io.BytesIO()
    v1.save_model(b"abc", sink, model_type=1, metadata=PINNED)
    assert sink.getvalue() == data
    for source in (path, str(path), data, bytearray(data), memoryview(data), io.BytesIO(data)):
        assert v1.load_model(source).payload == b"abc"
    with open(path, "rb") as handle:
        assert v1.load_model(handle).payload == b"abc"


def test_a_failed_save_leaves_the_target_untouched(tmp_path, monkeypatch):
    path = tmp_path / "m.apr"
    path.write_bytes(b"old")
    import aprfast.v1.writer as module

    def broken(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "_write_all", broken)
    with pytest.raises(AprError, match="No space"):
        v1.save_model(b"new", path, model_type=1, metadata=PINNED)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.apr"]


def test_inspect_reads_header_and_metadata_only(lic, keys):
    data = v1.save_model(b"abc", model_type="Svm", metadata={**PINNED, "model_name": "i"}, license=lic,
                         password="pw", signing_key=keys["seed"], compression="lz4")
    info = v1.inspect_model(data[:-1] + b"\x00")  # a broken CRC does not matter to inspect
    assert info["layout"] == "v1" and info["header"]["model_type_name"] == "Svm"
    assert info["header"]["flag_names"] == ["ENCRYPTED", "SIGNED", "LICENSED"]
    assert info["header"]["compression_name"] == "Lz4"
    assert info["metadata"]["model_name"] == "i" and "license_block" not in info["metadata"]
    assert info["license_block_size"] == len(licensing.encode_license_block(lic))
    with pytest.raises(CorruptError):
        v1.inspect_model(data[:40])


# =========================================================================================
# Properties
# =========================================================================================
json_scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
json_maps = st.dictionaries(st.text(max_size=12), json_values, max_size=5)


@settings(max_examples=60)
@given(payload=st.binary(max_size=3000), compression=st.sampled_from(list(Compression)),
       model_type=st.sampled_from(list(ModelType)), quality=st.none() | st.integers(1, 255),
       custom=json_maps, metrics=json_maps, name=st.none() | st.text(max_size=300))
def test_the_writer_never_writes_what_the_reader_rejects(payload, compression, model_type, quality, custom,
                                                         metrics, name):
    metadata = {**PINNED, "custom": custom, "metrics": metrics}
    if name is not None:
        metadata["model_name"] = name
    data = v1.save_model(payload, model_type=model_type, metadata=metadata, compression=compression,
                         quality_score=quality)
    model = v1.load_model(data, expected_type=model_type)
    assert model.payload == payload
    expected = {k: v for k, v in metadata.items() if v not in ({},)}
    assert model.metadata == expected
    assert model.header.quality_score == (quality or 0)
    # Re-saving what was read gives the same bytes (deterministic, loss-free metadata).
    again = v1.save_model(model.payload, model_type=model_type, metadata=model.metadata, compression=compression,
                          quality_score=quality)
    assert again == data


@settings(max_examples=200)
@given(data=st.binary(min_size=0, max_size=400))
def test_arbitrary_bytes_never_crash_the_reader(data):
    for candidate in (data, b"APRN" + data, recrc(b"APRN\x01\x00\x01\x00" + data + b"\0\0\0\0")):
        try:
            v1.load_model(candidate)
        except AprError:
            pass
        try:
            v1.inspect_model(candidate)
        except AprError:
            pass
