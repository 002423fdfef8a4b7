#!/usr/bin/env python3
"""Write the fuzz seed corpus: small valid files of every variant, each prefixed with
the two control bytes of tests/fuzz/harness.py, one directory per target.

    python tests/fuzz/make_corpus.py OUT_DIR        # OUT_DIR/<target>/<seed>

v2: both layouts, every dtype each layout has an id for (elementwise, GGML blocks,
K-quants, aprender's and the spec's own), 0-d and empty tensors, typed metadata,
32-byte alignment.  v1: bytes and tensor payloads, zstd / zstd-max / lz4, password,
recipient and multi-recipient encryption, Ed25519 signatures, a license, rich
metadata; plus "unpacked" forms whose payload region holds plaintext for the
harness to compress, encrypt and sign after mutation (control bits PACK / SEAL).
Deterministic except for the random salts/nonces of real encrypted seeds.
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aprfast  # noqa: E402
from aprfast import licensing, v1  # noqa: E402
from aprfast.dtypes import DTYPES  # noqa: E402
import harness  # noqa: E402
from harness import CONTROL, KEYS, PASSWORD  # noqa: E402

PINNED = {"created_at": "1700000000", "aprender_version": "0.0.0-fuzz"}


def rng(seed):
    return np.random.default_rng(seed)


def packed(type_name, shape, seed=0):
    """A QuantizedTensor: quantized from floats where aprfast can, else random blocks."""
    try:
        return aprfast.quantize(rng(seed).standard_normal(shape).astype(np.float32), type_name)
    except aprfast.AprError:
        raw = rng(seed).integers(0, 256, DTYPES[type_name].nbytes(shape), np.uint8)
        return aprfast.QuantizedTensor(type_name, shape, raw)


def elementwise(seed=0):
    r = rng(seed)
    return {
        "a.f32": r.standard_normal((2, 3)).astype(np.float32),
        "b.f16": r.standard_normal((4,)).astype(np.float16),
        "c.f64": r.standard_normal((1, 2, 2)),
        "d.i8": r.integers(-128, 127, (5,), np.int8),
        "e.i32": r.integers(-1000, 1000, (2, 2), np.int32),
        "f.i64": r.integers(-1000, 1000, (3,), np.int64),
        "g.u8": r.integers(0, 255, (3, 1), np.uint8),
        "h.scalar": np.float32(1.5),
        "i.empty": np.zeros((0, 4), np.float32),
        "j.bf16": aprfast.RawTensor("BF16", (2, 2), np.arange(8, dtype=np.uint8)),
    }


def apr2_only(seed=1):
    r = rng(seed)
    return {
        "bool": np.array([True, False, True]),
        "i16": r.integers(-300, 300, (2, 2), np.int16),
        "u16": r.integers(0, 600, (3,), np.uint16),
        "u32": r.integers(0, 10**6, (2,), np.uint32),
        "u64": r.integers(0, 10**6, (2,), np.uint64),
    }


GGML = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"]
APR2_PACKED = GGML + ["APR_Q4", "APR_Q8", "Q8_TENSOR", "APR_FQ8_0", "APR_FQ4_0"]
APRENDER_PACKED = ["APR_Q4", "APR_Q8", "Q4_K", "Q6_K"]


def quantized(types, seed=2):
    out = {}
    for i, t in enumerate(types):
        d = DTYPES[t]
        shape = (2, d.block_elems) if d.blocks_per_row else (3, 11)
        out[f"q{i}.{t.lower()}"] = packed(t, shape, seed + i)
        if d.blocks_per_row:  # a 1-D row too, for block-boundary slices
            out[f"r{i}.{t.lower()}"] = packed(t, (d.block_elems * 2,), seed + 50 + i)
        out[f"z{i}.{t.lower()}"] = packed(t, (0, d.block_elems) if d.blocks_per_row else (0, 3), seed)
    return out


def v2_seeds():
    """name -> v2 file bytes."""
    seeds = {}
    aprender_meta = {"model_type": "llama", "name": "fuzz", "param_count": 42, "hidden_size": 8,
                     "rope_theta": 10000.0, "quantization": {"quant_type": "q4_k", "bits": 4, "symmetric": True},
                     "special_tokens": {"bos_token": "<s>"}, "custom_key": [1, {"x": None}]}
    for layout in ("aprender", "apr2"):
        meta = aprender_meta if layout == "aprender" else {"name": "fuzz", "nested": {"a": [1, 2.5, "s"]}}
        seeds[f"{layout}-elementwise"] = aprfast.save(elementwise(), meta, layout=layout)
        seeds[f"{layout}-empty"] = aprfast.save({}, None, layout=layout)
        seeds[f"{layout}-one"] = aprfast.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, layout=layout)
        types = APRENDER_PACKED if layout == "aprender" else APR2_PACKED
        seeds[f"{layout}-quantized"] = aprfast.save(quantized(types), meta, layout=layout)
    seeds["apr2-only-dtypes"] = aprfast.save(apr2_only(), layout="apr2")
    seeds["apr2-align32"] = aprfast.save({"x": np.ones((3, 3), np.float32), "y": np.int8([1, 2])},
                                         layout="apr2", alignment=32)
    seeds["aprender-sharded"] = aprfast.save(
        {"w": np.ones((2, 2), np.float16)},
        {"sharding": {"shard_count": 2, "shard_index": 0, "total_size": 64, "pattern": "x-*"}}, layout="aprender")
    return seeds


# --- v1 --------------------------------------------------------------------------------------
def bincode(name="golden_v1", weights=(1.0, 2.0, 0.5, -0.5), bias=0.125) -> bytes:
    raw = name.encode()
    return (struct.pack("<Q", len(raw)) + raw + struct.pack("<Q", len(weights))
            + struct.pack(f"<{len(weights)}f", *weights) + struct.pack("<f", bias))


def the_license():
    return licensing.License(
        license_id=bytes(range(16)), licensee="Acme Corp", issued_at=1_700_000_000, expires_at=1_900_000_000,
        flags=licensing.LicenseFlags.EXPIRATION_ENFORCED | licensing.LicenseFlags.SEATS_ENFORCED
        | licensing.LicenseFlags.INFERENCE_LIMITED, seat_limit=5, inference_limit=100, custom_terms=b"terms")


RICH_META = {
    **PINNED, "model_name": "fuzz", "description": "seed",
    "training": {"samples": 10, "duration_ms": 5, "source": "synthetic"},
    "hyperparameters": {"lr": 0.01, "layers": [1, 2]}, "metrics": {"acc": 0.5},
    "custom": {"k": "v", "n": None},
    "distillation_info": {
        "method": "Standard",
        "teacher": {"hash": "ab", "model_type": "NeuralCustom", "param_count": 7,
                    "ensemble_teachers": [{"hash": "cd", "model_type": "Knn", "param_count": 1}]},
        "params": {"temperature": 2.0, "alpha": 0.5, "epochs": 3},
        "layer_mapping": [{"student_layer": 0, "teacher_layer": 1, "weight": 1.0}]},
    "model_card": {"model_id": "m", "name": "n", "version": "1", "created_at": "2024", "framework_version": "f",
                   "hyperparameters": {"a": 1}, "target_hardware": ["cpu"], "extra_key": "x"},
}


def small_tensors():
    return {"w": np.arange(8, dtype=np.float32).reshape(2, 4), "b": np.float16([1, -1]),
            "q": aprfast.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "Q8_0")}


def unpacked(data: bytes, *, compression=None, encrypted=False) -> bytes:
    """A v1 file whose payload region holds plaintext: the header names ``compression``
    and sets ENCRYPTED, for the harness's PACK / SEAL fix-ups to finish."""
    out = bytearray(data)
    if compression is not None:
        out[20] = compression
    if encrypted:
        out[21] |= 0x01
    return bytes(out)


def v1_seeds():
    """name -> (control byte, file bytes), for the v1_load target."""
    F, P, S, T = CONTROL.FIX, CONTROL.PACK, CONTROL.SEAL, CONTROL.TRUSTED
    pw, rcpt, multi = 1 << 3, 2 << 3, 3 << 3
    seed, alice_pub, bob_pub = KEYS["ed25519_seed"], KEYS["alice_public"], KEYS["bob_public"]
    lic = the_license()
    seeds = {
        "v1-bytes": (F, v1.save_model(bincode(), model_type="LinearRegression", metadata=PINNED,
                                      quality_score=85)),
        "v1-rich-meta": (F, v1.save_model(bincode(), model_type=5, metadata=RICH_META, quality_score=1)),
        "v1-tensors": (F, v1.save_model(small_tensors(), metadata=PINNED)),
        "v1-tensors-apr2": (F, v1.save_model({"b": np.array([True]), "u": np.uint16([7])}, metadata=PINNED)),
        "v1-licensed": (F, v1.save_model(bincode(), model_type="Knn", metadata=PINNED, license=lic)),
        "v1-signed": (F | T, v1.save_model(small_tensors(), metadata=PINNED, signing_key=seed)),
    }
    for comp in ("zstd", "zstd-max", "lz4"):
        seeds[f"v1-{comp}"] = (F, v1.save_model(small_tensors(), metadata=PINNED, compression=comp))
        seeds[f"v1-{comp}-bytes"] = (F, v1.save_model(bincode() * 4, model_type="Svm", metadata=PINNED,
                                                      compression=comp))
        seeds[f"v1-{comp}-empty"] = (F, v1.save_model(b"", model_type="Pca", metadata=PINNED, compression=comp))
    seeds["v1-empty"] = (F, v1.save_model(b"", model_type="Pca", metadata=PINNED))
    seeds["v1-password"] = (F | pw, v1.save_model(small_tensors(), metadata=PINNED, password=PASSWORD))
    seeds["v1-recipient"] = (F | rcpt, v1.save_model(small_tensors(), metadata=PINNED, recipient=alice_pub))
    seeds["v1-multi"] = (F | multi, v1.save_model(bincode(), model_type=1, metadata=PINNED,
                                                   recipients=[bob_pub, alice_pub]))
    seeds["v1-everything"] = (F | T | rcpt, v1.save_model(
        small_tensors(), metadata=RICH_META, compression="zstd", recipient=alice_pub, signing_key=seed,
        license=lic, quality_score=200))
    seeds["v1-lz4-password-signed"] = (F | T | pw, v1.save_model(
        bincode(), model_type="Custom", metadata=PINNED, compression="lz4", password=PASSWORD, signing_key=seed))
    # Plaintext forms: mutations of the inner bytes get compressed / encrypted / signed by the harness.
    plain_tensors = v1.save_model(small_tensors(), metadata=PINNED)
    signed_tensors = v1.save_model(small_tensors(), metadata=PINNED, signing_key=seed)
    for cid, comp in ((1, "zstd"), (2, "zstd-max"), (3, "lz4")):
        seeds[f"v1-unpacked-{comp}"] = (F | P, unpacked(plain_tensors, compression=cid))
    for mode, name in ((pw, "password"), (rcpt, "recipient"), (multi, "multi")):
        seeds[f"v1-unsealed-{name}"] = (F | S | mode, unpacked(plain_tensors, encrypted=True))
        seeds[f"v1-unsealed-zstd-{name}-signed"] = (F | P | S | T | mode,
                                                    unpacked(signed_tensors, compression=1, encrypted=True))
    seeds["v1-unsealed-lz4-licensed"] = (F | P | S | rcpt, unpacked(
        v1.save_model(small_tensors(), metadata=RICH_META, license=lic), compression=3, encrypted=True))
    # Sanity: every seed loads with its own control byte.
    for name, (control, data) in seeds.items():
        harness.target_v1_load(bytes([control, 0]) + data)  # raises if a seed does not load
    return seeds


def write(out_dir: str) -> dict:
    counts = {}
    v2 = v2_seeds()
    v1s = v1_seeds()

    def put(target, name, control, data, param=0):
        d = os.path.join(out_dir, target)
        os.makedirs(d, exist_ok=True)
        blob = bytes([control, param]) + data
        with open(os.path.join(d, f"{name}-{control:02x}{param:02x}"), "wb") as f:
            f.write(blob)
        counts[target] = counts.get(target, 0) + 1

    for name, data in v2.items():
        harness.target_open(bytes([0x39, 7]) + data)  # raises if a seed does not load
        put("load", name, CONTROL.FIX, data)
        put("load", name, 0x00, data)
        put("inspect", name, 0x00, data)
        put("v1_inspect", name, 0x00, data)
        for control, param in ((0x01, 1), (0x03, 2), (0x05, 3), (0x07, 5), (0x39, 7)):
            put("open", name, control, data, param)
    for name, (control, data) in v1s.items():
        put("v1_load", name, control, data)
        put("v1_inspect", name, control & CONTROL.FIX, data)
        put("inspect", name, control, data)
        put("load", name, 0x01, data)  # v2 readers must refuse a v1 file cleanly
    return counts


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with harness.fuzz_environment():
        counts = write(argv[1])
    total = sum(counts.values())
    print(f"wrote {total} seeds to {argv[1]}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
