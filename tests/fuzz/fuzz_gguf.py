#!/usr/bin/env python3
"""atheris target: the GGUF reader (aprfast.convert.gguf.GGUFSource).

    python tests/fuzz/fuzz_gguf.py --seeds OUT_DIR          # write the seed corpus
    python tests/fuzz/fuzz_gguf.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the file.
GGUF has no checksum, so there is no fix-up.  Control bit 0x01: open through
``aprfast.convert.open_source`` (format detection) instead of GGUFSource; 0x02: also
``aprfast.convert`` the file to .apr, which must hold the bytes the source read.  Every
declared tensor is read (with and without a scratch buffer) and touched, the metadata
mapped.  Oracle: harness.run_one (an AprError is a refusal; anything else a finding).

The seeds are written here from the GGUF v3 byte layout (struct, not aprfast's writer):
every metadata value type, nested arrays, a token vocabulary, general.alignment, and
tensors of every GGML type aprfast maps (F32, F16, BF16, F64, I8-I64, Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q6_K), 0-d-free shapes as GGUF has none.
"""

from __future__ import annotations

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DETECT, CONVERT = 0x01, 0x02

# GGUF metadata value types and GGML tensor types (gguf.h / ggml.h)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}
# name -> (ggml id, elements per block, bytes per block)
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
        "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210),
        "I8": (24, 1, 1), "I16": (25, 1, 2), "I32": (26, 1, 4), "I64": (27, 1, 8), "F64": (28, 1, 8),
        "BF16": (30, 1, 2)}


def target_gguf(data: bytes) -> None:
    import harness

    from aprfast.convert import gguf, open_source

    control, _param, body = harness.split(data)
    path = os.path.join(harness.write_scratch({"m.gguf": body}), "m.gguf")
    src = open_source(path) if control & DETECT else gguf.GGUFSource(path)
    try:
        repr(getattr(src, "gguf_metadata", None))
        got = harness.drain_source(src)
    finally:
        src.close()
    if control & CONVERT:
        harness.convert_agrees(path, got, os.path.join(os.path.dirname(path), "out.apr"))


# --- seeds: GGUF v3 from its byte layout -----------------------------------------------------
def _string(text) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        inner, items = value
        return struct.pack("<IQ", inner, len(items)) + b"".join(_value(inner, v) for v in items)
    return struct.pack(_FMT[vtype], value)


def gguf_file(kv: list, tensors: list, *, alignment: int = 32, version: int = 3) -> bytes:
    """kv: [(key, type, value)] (ARRAY values are (inner type, items)); tensors:
    [(name, GGML name, ne (innermost first), data bytes)], laid out in order."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, value in kv:
        out += _string(key) + struct.pack("<I", vtype) + _value(vtype, value)
    offset, blobs = 0, []
    for name, kind, ne, blob in tensors:
        out += _string(name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne) + struct.pack("<IQ", GGML[kind][0], offset)
        pad = -len(blob) % alignment
        blobs.append(blob + bytes(pad))
        offset += len(blob) + pad
    out += bytes(-len(out) % alignment)
    return out + b"".join(blobs)


def _blob(kind, ne, seed) -> bytes:
    import numpy as np

    _id, per_block, block_bytes = GGML[kind]
    count = 1
    for n in ne:
        count *= n
    nbytes = count // per_block * block_bytes
    raw = np.random.default_rng(seed).integers(0, 256, nbytes, np.uint8)
    if kind in ("F32", "F16", "BF16", "F64"):  # finite values: the convert path sees no NaN by chance
        width = {"F32": np.float32, "F16": np.float16, "F64": np.float64}.get(kind)
        if width is not None:
            return np.linspace(-2, 2, count).astype(width).tobytes()
        return (np.linspace(-2, 2, count).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return raw.tobytes()


def seeds() -> dict:
    """name -> (control, file bytes)."""
    kv = [("general.architecture", STRING, "llama"), ("general.name", STRING, "fuzz"),
          ("llama.context_length", U32, 128), ("llama.embedding_length", U32, 8),
          ("llama.rope.freq_base", F32, 10000.0), ("general.file_type", U32, 7), ("x.i8", I8, -3),
          ("x.u16", U16, 7), ("x.i16", I16, -7), ("x.i32", I32, -70), ("x.u64", U64, 1 << 40),
          ("x.i64", I64, -(1 << 40)), ("x.f64", F64, 0.5), ("x.bool", BOOL, True), ("x.u8", U8, 9),
          ("tokenizer.ggml.model", STRING, "llama"),
          ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "a", "b\u00e9"])),
          ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, -1.0, -2.0, -3.0])),
          ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 1, 1])),
          ("tokenizer.ggml.bos_token_id", U32, 0), ("tokenizer.ggml.eos_token_id", U32, 1),
          ("x.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["s"])])), ("x.empty", ARRAY, (I64, []))]
    plain = [("token_embd.weight", "F32", (8, 4), None), ("blk.0.attn_norm.weight", "F16", (8,), None),
             ("blk.0.ffn.bf16", "BF16", (4, 2), None), ("x.f64", "F64", (3,), None), ("x.i8", "I8", (5,), None),
             ("x.i16", "I16", (2, 2), None), ("x.i32", "I32", (3,), None), ("x.i64", "I64", (2,), None)]
    packed = [(f"q.{kind.lower()}", kind, (GGML[kind][1], 2), None)
              for kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")]

    def tensors(items):
        return [(name, kind, ne, _blob(kind, ne, i)) for i, (name, kind, ne, _) in enumerate(items)]

    return {
        "llama": (0, gguf_file(kv, tensors(plain))),
        "llama-convert": (CONVERT, gguf_file(kv[:6], tensors(plain[:3]))),
        "quantized": (0, gguf_file(kv[:3], tensors(packed))),
        "quantized-convert": (CONVERT | DETECT, gguf_file(kv[:2], tensors(packed[4:]))),
        "aligned-64": (0, gguf_file([("general.alignment", U32, 64)] + kv[:2], tensors(plain[:4]), alignment=64)),
        "v2": (DETECT, gguf_file(kv[:4], tensors(plain[:2]), version=2)),
        "metadata-only": (0, gguf_file(kv, [])),
        "empty": (0, gguf_file([], [])),
    }


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    for name, (control, blob) in seeds().items():
        harness.run_one(target_gguf, bytes([control, 0]) + blob)  # every seed reads as written
        target_gguf(bytes([control | CONVERT, 0]) + blob)  # and converts without a refusal
        with open(os.path.join(out_dir, f"{name}-{control:02x}"), "wb") as f:
            f.write(bytes([control, 0]) + blob)
    return len(seeds())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("gguf", sys.argv)
