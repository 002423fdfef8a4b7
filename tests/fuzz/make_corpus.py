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
v1 STREAMING (chunk index) files of every codec, encrypted, signed, licensed, and
their unsealed / unpacked forms; TRUENO_NATIVE files.  APR2 files with per-tensor LZ4
and zstd block tables (4 KiB blocks: multi-block tensors).  The v1 tensor files also
seed v1_open (aprfast.open of a v1 file), the v2 files stream (aprfast.stream).  The
targets kept in fuzz_<target>.py (pytorch and harness.EXTERNAL: v2_security, gguf,
safetensors, onnx, burnpack, mle, v1_index, remote_index) write their own seeds
(``write_seeds``).  Deterministic except for the random salts/nonces of real encrypted
seeds.
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import CONTROL, KEYS, PASSWORD  # noqa: E402

import aprfast  # noqa: E402
from aprfast import v1
from aprfast.dtypes import DTYPES  # noqa: E402
from aprfast.v1 import licensing  # noqa: E402

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
    seeds.update(compressed_v2_seeds())
    seeds["aprender-sharded"] = aprfast.save(
        {"w": np.ones((2, 2), np.float16)},
        {"sharding": {"shard_count": 2, "shard_index": 0, "total_size": 64, "pattern": "x-*"}}, layout="aprender")
    return seeds


def compressed_v2_seeds():
    """APR2 files with per-tensor LZ4 / zstd block tables (aprfast.codecs.blocks).  The
    writer's block size is set to the smallest a reader accepts (4 KiB, through the
    module's default) so a 16 KiB tensor has four blocks: compressed, compressed,
    compressed and one stored raw (random bytes do not shrink)."""
    from aprfast.codecs import blocks as tensor_codecs

    r = rng(9)
    multi = np.concatenate([np.zeros(2048, np.float32), np.arange(1024, dtype=np.float32),
                            r.standard_normal(1024).astype(np.float32)])
    tensors = {"multi": multi.reshape(64, 64), "small": np.zeros((3, 5), np.float32),
               "q8": packed("Q8_0", (4, 32), 3), "zeros.q": aprfast.quantize(np.zeros((2, 256), np.float32), "Q4_0"),
               "flat": np.full(1500, 7, np.int16), "z": np.zeros((0, 3), np.float32), "s": np.float32(2.0),
               "rand": r.integers(0, 255, 40, np.uint8)}
    saved = tensor_codecs.LZ4_BLOCK_SIZE, tensor_codecs.ZSTD_BLOCK_SIZE
    tensor_codecs.LZ4_BLOCK_SIZE = tensor_codecs.ZSTD_BLOCK_SIZE = tensor_codecs.MIN_BLOCK_SIZE
    try:
        seeds = {}
        for codec in ("lz4", "zstd"):
            seeds[f"apr2-{codec}"] = aprfast.save(tensors, {"name": "fuzz"}, compression=codec)
            # two blocks of one compressible tensor: a small file whose mutations hit the table
            seeds[f"apr2-{codec}-small"] = aprfast.save({"w": np.zeros(1100, np.float32)}, compression=codec)
        seeds["apr2-lz4-hc"] = aprfast.save({"w": np.tile(np.arange(8, dtype=np.float32), 200)},
                                            compression="lz4", compression_level=9)
    finally:
        tensor_codecs.LZ4_BLOCK_SIZE, tensor_codecs.ZSTD_BLOCK_SIZE = saved
    for name in ("apr2-lz4", "apr2-zstd"):
        with aprfast.open(seeds[name]) as f:  # the writer did compress (else the seed tests nothing new)
            assert sum(1 for n in f.keys() if f.info(n).flags) >= 4, name
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
    seeds.update(indexed_v1_seeds())
    # Sanity: every seed loads with its own control byte.
    for _name, (control, data) in seeds.items():
        harness.target_v1_load(bytes([control, 0]) + data)  # raises if a seed does not load
    return seeds


def indexed_v1_seeds():
    """name -> (control byte, file bytes): STREAMING (chunk index) files of every codec,
    with chunks of 16 bytes so tensors span several, encrypted (password, recipient,
    multi-recipient), signed (chunk digests and index signature), both, licensed; their
    "unsealed" / "unpacked" forms, whose chunks hold plaintext / raw bytes for the
    harness to seal / compress after mutation; and TRUENO_NATIVE files (strides, backend
    hints, signed, licensed)."""
    F, P, S, T = CONTROL.FIX, CONTROL.PACK, CONTROL.SEAL, CONTROL.TRUSTED
    pw, rcpt, multi = 1 << 3, 2 << 3, 3 << 3
    seed, alice_pub, bob_pub = KEYS["ed25519_seed"], KEYS["alice_public"], KEYS["bob_public"]
    tensors = small_tensors()
    tensors["e"] = np.zeros((0, 3), np.float32)
    tensors["s"] = np.float32(3.0)
    seeds = {}

    def streaming(compression="none", **kw):
        return v1.save_model(tensors, metadata=PINNED, compression=compression, streaming=True, chunk_size=16, **kw)

    for comp in ("none", "zstd", "lz4"):
        seeds[f"v1s-{comp}"] = (F, streaming(comp))
    seeds["v1s-zstd-max-bigchunks"] = (F, v1.save_model(tensors, metadata=PINNED, compression="zstd-max",
                                                         streaming=True))
    seeds["v1s-password"] = (F | pw, streaming("lz4", password=PASSWORD))
    seeds["v1s-recipient"] = (F | rcpt, streaming("zstd", recipient=alice_pub))
    seeds["v1s-multi"] = (F | multi, streaming(recipients=[bob_pub, alice_pub]))
    seeds["v1s-signed"] = (F | T, streaming("zstd", signing_key=seed))
    seeds["v1s-password-signed"] = (F | T | pw, streaming("lz4", password=PASSWORD, signing_key=seed))
    seeds["v1s-licensed"] = (F, v1.save_model(tensors, metadata=RICH_META, streaming=True, chunk_size=64,
                                              license=the_license(), compression="zstd"))
    # Plaintext chunk forms: PACK compresses each chunk, SEAL seals it (fix_v1_streaming).
    seeds["v1s-unpacked-zstd"] = (F | P, unseal_streaming(seeds["v1s-zstd"][1], 0, unpack=True))
    seeds["v1s-unpacked-lz4-signed"] = (F | P | T, unseal_streaming(streaming("lz4", signing_key=seed), 0,
                                                                    unpack=True))
    seeds["v1s-unsealed-password"] = (F | S | pw, unseal_streaming(streaming(password=PASSWORD), 1))
    seeds["v1s-unsealed-lz4-password-signed"] = (F | P | S | T | pw, unseal_streaming(
        seeds["v1s-password-signed"][1], 1, unpack=True))
    seeds["v1s-unsealed-zstd-recipient"] = (F | P | S | rcpt, unseal_streaming(seeds["v1s-recipient"][1], 2,
                                                                               unpack=True))
    seeds["v1s-unsealed-multi"] = (F | S | multi, unseal_streaming(seeds["v1s-multi"][1], 3))
    # TRUENO_NATIVE: 64-byte-aligned tensors with strides and backend hints.
    trueno_tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "h": np.float16([1, 2, 3]),
                      "b": aprfast.RawTensor("BF16", (2,), np.arange(4, dtype=np.uint8)),
                      "i": np.int8([[-1, 2], [3, -4]]), "u": np.uint8([9]), "e": np.zeros((0, 2), np.float32)}
    seeds["v1t"] = (F, v1.save_model(trueno_tensors, metadata=PINNED, trueno_native=True))
    seeds["v1t-hints"] = (F, v1.save_model(trueno_tensors, metadata=PINNED, trueno_native=True,
                                           backend_hint={"w": "avx2", "h": "gpu", "i": "neon"}))
    seeds["v1t-signed"] = (F | T, v1.save_model({"w": np.ones((2, 2), np.float32)}, metadata=PINNED,
                                                trueno_native=True, signing_key=seed, backend_hint="avx512"))
    seeds["v1t-licensed"] = (F, v1.save_model({"x": np.float32([1, 2])}, metadata=PINNED, trueno_native=True,
                                              license=the_license()))
    return seeds


def unseal_streaming(data: bytes, mode: int, unpack: bool = False) -> bytes:
    """A STREAMING file with every chunk opened (``mode``: the fuzz credentials of
    harness CONTROL.MODE) and, with ``unpack``, decompressed: the header and index still
    say ENCRYPTED / SEALED and the codec, for fix_v1_streaming's SEAL / PACK to redo."""
    from aprfast.codecs import payload as codecs

    parts = harness.StreamingParts(data)
    assert parts.ok and parts.nchunks == parts.ccount
    key = harness._file_key(parts.key_block, mode) if mode else None
    assert key is not None or not mode
    header, metadata = data[:32], data[32:parts.start]
    index_header = data[parts.start:parts.start + 32]
    pieces, raws = [], []
    for i in range(parts.nchunks):
        offset, stored, raw = parts.chunk(data, i)
        piece = data[parts.end + offset:parts.end + offset + stored]
        if key is not None:
            aad = harness.chunk_aad(header, metadata, index_header, parts.owner_record(i), offset, stored, raw, i)
            piece = harness._aesgcm(key).decrypt(i.to_bytes(12, "little"), piece, aad)
        if unpack:
            piece = bytes(codecs.decompress(piece, parts.fields[7], expected_size=raw, limit=1 << 20))
        pieces.append(piece)
        raws.append(raw)
    out = bytearray(data)
    at = 0
    for i, piece in enumerate(pieces):
        struct.pack_into("<QII", out, parts.table + i * parts.rec, at, len(piece), raws[i])
        at += len(piece)
    struct.pack_into("<I", out, 12, at)  # payload size
    payload_end = parts.end + parts.fields[5]
    return bytes(out[:parts.end]) + b"".join(pieces) + bytes(out[payload_end:])


STREAM_V1 = ("v1-tensors", "v1-zstd", "v1-lz4", "v1-password", "v1-recipient", "v1s-none", "v1s-zstd", "v1s-lz4",
             "v1s-password", "v1s-recipient", "v1s-signed", "v1s-licensed", "v1t", "v1t-hints", "v1t-signed")


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
    for name, data in v2.items():  # stream(): pipe, short reads, read()-only, finish(), bytes
        # (APR2 files with LZ4 / zstd block tables included: stream() decodes their blocks)
        for control, param in ((0x01, 0), (0x01, 1), (0x0d, 3), (0x13, 0), (0x21, 0)):
            harness.target_stream(bytes([control, param]) + data)  # raises if a seed does not stream
            put("stream", name, control, data, param)
    for name, (control, data) in v1s.items():
        if name.startswith(("v1-tensors", "v1-signed", "v1s-", "v1t", "v1-password", "v1-recipient",
                            "v1-everything", "v1-unsealed", "v1-unpacked")) or name in (
                            "v1-zstd", "v1-zstd-max", "v1-lz4"):
            variants = [(control, 0)]
            if name.startswith(("v1s-", "v1t")):  # open(verify=True); through a mapped / pread path
                variants += [(control | 0x40, 1), (control | 0x80, 2), (control | 0xc0, 3)]
            for c, param in variants:
                harness.target_v1_open(bytes([c, param]) + data)  # raises if a seed does not open
                put("v1_open", name, c, data, param)
        if name in STREAM_V1:  # stream() reads v1 tensor files too (credentials: control bits 6-7)
            creds = {0: 0, 1 << 3: 0x40, 2 << 3: 0x80}[control & CONTROL.MODE]
            for c, param in ((0x01 | creds, 0), (0x01 | creds, 1), (0x11 | creds, 0)):
                harness.target_stream(bytes([c, param]) + data)  # raises if a seed does not stream
                put("stream", name, c, data, param)
        put("v1_load", name, control, data)
        put("v1_inspect", name, control & CONTROL.FIX, data)
        put("inspect", name, control, data)
        put("load", name, 0x01, data)  # v2 readers must refuse a v1 file cleanly
    counts["pytorch"] = harness._fuzz_pytorch().write_seeds(os.path.join(out_dir, "pytorch"))
    for target in harness.EXTERNAL:  # fuzz_<target>.py writes its own seeds
        counts[target] = harness.external(target).write_seeds(os.path.join(out_dir, target))
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
