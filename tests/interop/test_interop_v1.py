"""aprfast against apr-format 0.72.3 (aprender's own `.apr` code), v1 ``APRN`` container.

a. aprender writes (``apr_format::save`` via the harness: every compression id, varied
   metadata and model types) and aprfast reads: header, metadata and payload agree with
   what apr-format's own reader reports, and the payload is the GoldenModel's bincode.
b. aprfast writes (compression 0-3, metadata variants, license, tensor payloads,
   signatures) and apr-format reads: it loads, and reports the same header, metadata
   and payload.
c. Byte identity: for compression 0 and the same inputs, aprfast's bytes equal
   aprender's (the golden fixture included).  zstd and LZ4 bytes depend on the encoder
   library, so for ids 1-3 only the decompressed payloads are compared.
d. Encrypted files: apr-format's plain loader (the only one it has: encryption lives in
   aprender-core) never hands back the plaintext; the header says ENCRYPTED.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.layouts.v1 import Flag, ModelType
from aprfast.v1 import licensing

GOLDEN_V1_SPEC = Path(__file__).parent / "harness" / "specs" / "golden_v1.json"
PINNED = {"created_at": "1700000000", "aprender_version": "0.0.0-interop"}

# Metadata with at most one key per HashMap: aprender's output is then deterministic.
METADATA_VARIANTS = {
    "minimal": PINNED,
    "named": {**PINNED, "model_name": "interop-model",
              "description": "a description long enough for str16: " + "ü" * 150,
              "training": {"samples": 123456, "duration_ms": 5_000_000_000, "source": "synthetic"},
              "hyperparameters": {"learning_rate": 0.001}, "metrics": {"r2": -0.25},
              "custom": {"nested": {"z": [1, None, True, "x"], "a": -70000}}},
    "licensed": {**PINNED, "license": {"uuid": "6f1c1c1e-0000-4000-8000-000000000001", "hash": "ab" * 32,
                                       "expiry": "2030-01-01T00:00:00Z", "seats": 70000, "licensee": "Acme",
                                       "tier": "Team"}},
    "model-card": {**PINNED, "model_card": {
        "model_id": "mc-1", "name": "card", "version": "1.2.3", "author": "me", "created_at": "2024",
        "framework_version": "aprender 0.72.3", "description": "d", "license": "MIT",
        "training_data": {"name": "data", "samples": 10, "hash": "h"}, "hyperparameters": {"k": 3},
        "metrics": {"acc": 0.5}, "architecture": "Linear", "param_count": 9, "target_hardware": ["cpu", "wasm"],
        "homepage": "https://example.invalid"}},
    "distillation": {**PINNED, "distillation": "teacher-hash", "distillation_info": {
        "method": "Progressive",
        "teacher": {"hash": "t", "signature": "s", "model_type": "NeuralSequential", "param_count": 10**12,
                    "ensemble_teachers": [{"hash": "e", "model_type": "MixtureOfExperts", "param_count": 1}]},
        "params": {"temperature": 0.1, "alpha": 0.7, "beta": 1e-8, "epochs": 40, "final_loss": 3.4e38},
        "layer_mapping": [{"student_layer": 2, "teacher_layer": 7, "weight": 0.3}]}},
}
# Several keys per HashMap: aprender's order is random, so only parsed values compare.
MULTI_KEY = {**PINNED, "hyperparameters": {"a": 1, "b": 2.5, "c": "three"}, "metrics": {"x": 1, "y": -1},
             "custom": {"k1": [1], "k2": {"q": 1, "p": 2}, "k3": None}}
MODELS = {
    "golden": {"name": "golden_v1", "weights": [1.0, 2.0, 0.5, -0.5, 4.0, -2.0, 0.25, 8.0], "bias": 0.125},
    "big": {"name": "big-model", "weights": [float(i % 17) * 0.5 for i in range(3000)], "bias": -1.5},
}
COMPRESSIONS = [0, 1, 2, 3]


def bincode(model: dict) -> bytes:
    """bincode 1.3 of GoldenModel {name: String, weights: Vec<f32>, bias: f32}."""
    name = model["name"].encode()
    weights = model["weights"]
    return (struct.pack("<Q", len(name)) + name + struct.pack("<Q", len(weights))
            + struct.pack(f"<{len(weights)}f", *weights) + struct.pack("<f", model["bias"]))


def sha256(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def rust_write_v1(harness, spec: dict) -> bytes:
    out = harness.path("rust", ".apr")
    result = harness.run("write-v1", harness.write_spec(spec), out)
    assert result["ok"], f"apr-format refused to write: {result}"
    return out.read_bytes()


def as_json(value):
    """A value as serde_json would print it back (tuples -> lists, floats kept)."""
    return json.loads(json.dumps(value))


def assert_header_matches(ours, rust_header: dict):
    h = ours.header
    assert rust_header["model_type"] == int(h.model_type)
    assert rust_header["model_type_name"] == ModelType(h.model_type).name
    assert (rust_header["metadata_size"], rust_header["payload_size"], rust_header["uncompressed_size"]) == \
        (h.metadata_size, h.payload_size, h.uncompressed_size)
    assert rust_header["compression"] == int(h.compression)
    assert rust_header["compression_name"] == ours.header.as_dict()["compression_name"]
    assert (rust_header["flags"], rust_header["flags_raw"]) == (h.flags & 0x7F, h.flags)
    assert rust_header["quality_score"] == h.quality_score
    assert rust_header["version"] == list(h.version)


# =========================================================================================
# c. the golden fixture
# =========================================================================================
def test_golden_v1_spec_gives_the_same_171_bytes_from_both(harness):
    spec = json.loads(GOLDEN_V1_SPEC.read_text())
    rust = rust_write_v1(harness, spec)
    ours = v1.save_model(bincode(spec["model"]), model_type=spec["model_type"], metadata=spec["metadata"],
                         compression=spec["compression"], quality_score=spec["quality_score"])
    assert ours == rust
    assert len(ours) == 171
    assert sha256(ours) == "a5f8d2ae45d9c3f751d8ad89d6804c18f7c0d5b6ae16cb056396e51b31f76d30"


# =========================================================================================
# a + c. aprender writes, aprfast reads (and writes the same bytes for compression 0)
# =========================================================================================
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("variant", sorted(METADATA_VARIANTS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_aprender_files_load_with_equal_metadata_and_payload(harness, compression, variant, model_name):
    model_type = {"golden": 1, "big": 0x40}[model_name]
    spec = {"model": MODELS[model_name], "model_type": model_type, "compression": compression,
            "quality_score": 90, "metadata": METADATA_VARIANTS[variant]}
    rust = rust_write_v1(harness, spec)
    report = harness.read(rust)
    assert report["ok"], report

    ours = v1.load_model(rust, expected_type=model_type)
    assert sha256(ours.payload) == report["payload_sha256"]
    assert ours.payload == bincode(MODELS[model_name])
    assert as_json(ours.metadata) == report["metadata"]
    assert_header_matches(ours, report["header"])
    assert bool(ours.flags & Flag.LICENSED) == (variant == "licensed")

    again = v1.save_model(ours.payload, model_type=model_type, metadata=ours.metadata, compression=compression,
                          quality_score=90)
    if compression == 0:
        assert again == rust  # byte identity
    else:  # encoder-dependent bytes: compare what both decompress to
        assert harness.read(again)["payload_sha256"] == report["payload_sha256"]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_multi_key_maps_agree_as_parsed_values(harness, compression):
    spec = {"model": MODELS["golden"], "model_type": 0xFF, "compression": compression, "metadata": MULTI_KEY}
    rust = rust_write_v1(harness, spec)
    ours = v1.load_model(rust)
    assert as_json(ours.metadata) == harness.read(rust)["metadata"] == as_json(MULTI_KEY)
    mine = v1.save_model(ours.payload, model_type=0xFF, metadata=MULTI_KEY, compression=compression)
    assert harness.read(mine)["metadata"] == as_json(MULTI_KEY)
    assert len(mine) == len(rust) or compression != 0  # same size, keys in another order


def test_aprender_default_metadata_and_compression_load(harness):
    """No metadata (the current time, apr-format's own version) and no compression in
    the spec (Compression::default() = ZstdDefault)."""
    rust = rust_write_v1(harness, {"model": MODELS["big"], "model_type": 5})
    ours = v1.load_model(rust, expected_type=ModelType.GradientBoosting)
    report = harness.read(rust)
    assert ours.header.compression == 1 and as_json(ours.metadata) == report["metadata"]
    assert ours.metadata["aprender_version"] == "0.72.3"
    assert sha256(ours.payload) == report["payload_sha256"]


def test_quality_score_zero_is_refused_by_both(harness):
    result = harness.run("write-v1", harness.write_spec({"model": MODELS["golden"], "model_type": 1,
                                                         "quality_score": 0}), harness.path("q", ".apr"))
    assert not result["ok"] and "Jidoka" in result["error"]
    with pytest.raises(ValueError, match="Jidoka"):
        v1.save_model(bincode(MODELS["golden"]), model_type=1, quality_score=0)


# =========================================================================================
# b. aprfast writes, aprender reads
# =========================================================================================
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("variant", sorted(METADATA_VARIANTS))
def test_aprfast_files_load_in_aprender(harness, compression, variant):
    payload = bincode(MODELS["big"])
    metadata = METADATA_VARIANTS[variant]
    data = v1.save_model(payload, model_type=ModelType.Knn, metadata=metadata, compression=compression,
                         quality_score=61)
    report = harness.run("read", _store(harness, data), "--golden-model")
    assert report["ok"], report
    assert report["payload_sha256"] == sha256(payload)
    ours = v1.load_model(data)
    # f32 fields come back rounded to f32 on both sides; everything else as given.
    assert report["metadata"] == as_json(ours.metadata)
    if variant != "distillation":
        assert ours.metadata == metadata
    assert report["model"]["name"] == "big-model" and report["model"]["bias"] == -1.5
    assert report["bytes_between_payload_and_crc"] == 0
    assert_header_matches(ours, report["header"])


def _store(harness, data: bytes) -> Path:
    path = harness.path("py", ".apr")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_licensed_and_signed_aprfast_files_load_in_aprender(harness, compression):
    """The binary license block sits in the metadata under a key aprender's struct does
    not have (serde skips it) and the signature block before the CRC (aprender's plain
    load ignores it, as it ignores its own signed files' block)."""
    lic = licensing.License.issue("Acme", now=1_700_000_000, expires_at=2_000_000_000, seat_limit=4,
                                  flags=licensing.LicenseFlags.EXPIRATION_ENFORCED
                                  | licensing.LicenseFlags.SEATS_ENFORCED, custom_terms=b"terms" * 80)
    seed, public = crypto.generate_signing_key()
    payload = bincode(MODELS["golden"])
    data = v1.save_model(payload, model_type=1, metadata=METADATA_VARIANTS["named"], compression=compression,
                         license=lic, signing_key=seed)
    report = harness.read(data)
    assert report["ok"], report
    assert report["payload_sha256"] == sha256(payload)
    assert report["metadata"] == as_json({**METADATA_VARIANTS["named"], "license": licensing.to_aprender_entry(lic)})
    assert report["header"]["flags"] == Flag.SIGNED | Flag.LICENSED
    assert report["bytes_between_payload_and_crc"] == 96
    ours = v1.load_model(data, trusted_keys=[public])
    assert ours.license == lic and ours.trusted


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensor_payloads_load_in_aprender_as_opaque_bytes(harness, compression):
    tensors = {"w": np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30), "b": np.arange(7, dtype=np.int64)}
    data = v1.save_model(tensors, metadata=PINNED, compression=compression)
    ours = v1.load_model(data)
    report = harness.read(data)
    assert report["ok"], report
    assert report["header"]["model_type_name"] == "NeuralCustom"
    assert report["metadata"]["custom"] == {"payload_format": "apr-v2-tensors"}
    import aprfast

    inner = aprfast.save(tensors, layout="auto")
    assert report["payload_sha256"] == sha256(inner)
    # The payload itself is an aprender v2 file: apr-format's v2 reader agrees too.
    v2_report = harness.read(inner)
    assert v2_report["ok"] and [t["name"] for t in v2_report["tensors"]] == ["b", "w"]
    np.testing.assert_array_equal(ours.payload["w"], tensors["w"])


# =========================================================================================
# d. encrypted files: aprender's plain loader never yields the plaintext
# =========================================================================================
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("mode", ["password", "recipient", "recipients"])
def test_encrypted_aprfast_files_never_misread_by_aprenders_plain_loader(harness, compression, mode):
    """apr-format has no decryption (that is aprender-core's ``load_encrypted`` /
    ``load_as_recipient``); its plain ``load`` ignores the flags.  It must either refuse
    (zstd/LZ4 cannot decode ciphertext) or return the ciphertext as stored, never the
    plaintext, and its ``inspect`` sees the ENCRYPTED flag and unchanged metadata.
    A multi-recipient payload starts "APRM" where aprender's recipient loader expects an
    ephemeral key and an 8-byte hint, so that loader fails its hint check (or GCM), too."""
    x_secret, x_public = crypto.generate_x25519_key()
    _, y_public = crypto.generate_x25519_key()
    options = {"password": {"password": "pw"}, "recipient": {"recipient": x_public},
               "recipients": {"recipients": [x_public, y_public]}}[mode]
    payload = bincode(MODELS["big"])
    data = v1.save_model(payload, model_type=1, metadata=METADATA_VARIANTS["named"], compression=compression,
                         **options)
    report = harness.read(data)
    if report["ok"]:
        assert report["payload_sha256"] != sha256(payload)
        assert report["payload_sha256"] == report["stored_payload_sha256"]  # ciphertext, as stored
        assert report["header"]["flags"] & Flag.ENCRYPTED
        assert report["metadata"] == as_json(METADATA_VARIANTS["named"])
    else:
        assert report["stage"] == "load" and "ecompression failed" in report["error"]
    if mode != "password":
        assert v1.load_model(data, private_key=x_secret).payload == payload
