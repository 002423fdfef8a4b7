#!/usr/bin/env python3
"""atheris target: the safetensors reader (aprfast.convert.safetensors): one file's JSON
header, and sharded checkpoints (``model.safetensors.index.json`` + shards).

    python tests/fuzz/fuzz_safetensors.py --seeds OUT_DIR   # write the seed corpus
    python tests/fuzz/fuzz_safetensors.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the body.
safetensors has no checksum: no fix-up.  Control bits: 0x01 open through
``aprfast.convert.open_source`` (detection, metadata strings decoded, a sibling
tokenizer.json read) instead of the source class; 0x02 also ``aprfast.convert`` to
.apr, which must hold the bytes read; 0x04 sharded: the body is pieces, each a u32
length then its bytes: the index JSON, then the shards, written as
``model-0000i-of-0000n.safetensors``, then (0x08) a ``tokenizer.json``.  Every tensor is
read (with and without a scratch buffer) and touched.  Oracle: harness.run_one.
"""

from __future__ import annotations

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DETECT, CONVERT, SHARDED, TOKENIZER = 0x01, 0x02, 0x04, 0x08
INDEX = "model.safetensors.index.json"


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def pieces(body: bytes) -> list:
    """The u32-length-prefixed pieces of a sharded body, as far as the bytes go."""
    out, pos = [], 0
    while pos + 4 <= len(body) and len(out) < 16:
        (n,) = struct.unpack_from("<I", body, pos)
        out.append(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def join(parts: list) -> bytes:
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


def target_safetensors(data: bytes) -> None:
    import harness

    from aprfast.convert import open_source
    from aprfast.convert import safetensors as st

    control, _param, body = harness.split(data)
    if control & SHARDED:
        parts = pieces(body)
        if not parts:
            return
        tokenizer = parts.pop() if control & TOKENIZER and len(parts) > 1 else None
        files = {INDEX: parts[0]}
        files.update({shard_name(i, len(parts) - 1): p for i, p in enumerate(parts[1:], 1)})
        if tokenizer is not None:
            files["tokenizer.json"] = tokenizer
        path = os.path.join(harness.write_scratch(files), INDEX)
        src = open_source(path) if control & DETECT else st.ShardedSource(path)
    else:
        files = {"model.safetensors": body}
        if control & TOKENIZER:
            files["tokenizer.json"] = b'{"model": {"vocab": {"a": 0}}}'
        path = os.path.join(harness.write_scratch(files), "model.safetensors")
        src = open_source(path) if control & DETECT else st.SafetensorsSource(path)
    try:
        got = harness.drain_source(src)
    finally:
        src.close()
    if control & CONVERT:
        harness.convert_agrees(path, got, os.path.join(os.path.dirname(path), "out.apr"))


# --- seeds: written by the safetensors package (the format's own writer) ---------------------
def _tensors(seed: int) -> dict:
    import numpy as np

    r = np.random.default_rng(seed)
    return {"model.embed.weight": r.standard_normal((4, 3)).astype(np.float32),
            "model.norm.weight": np.linspace(0, 1, 5).astype(np.float16),
            "model.layers.0.b": np.arange(6, dtype=np.int64).reshape(2, 3), "x.bool": np.array([True, False]),
            "x.u8": np.arange(3, dtype=np.uint8), "x.empty": np.zeros((0, 2), np.float32),
            "x.scalar": np.array(2.5, np.float64), "x.i16": np.int16([-1, 1])}


def _file(tensors: dict, metadata=None) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata=metadata)


def sharded(tensors: dict, n: int, metadata=None) -> bytes:
    names = sorted(tensors)
    groups = [names[i::n] for i in range(n)]
    shards = [_file({k: tensors[k] for k in g}, metadata) for g in groups]
    weight_map = {k: shard_name(i + 1, n) for i, g in enumerate(groups) for k in g}
    index = json.dumps({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                        "weight_map": weight_map}).encode()
    return join([index] + shards)


def seeds() -> dict:
    """name -> (control, body)."""
    t = _tensors(1)
    meta = {"format": "pt", "model_type": "llama", "aprfast.json": json.dumps({"a": [1, 2]})}
    small = {k: t[k] for k in ("model.embed.weight", "x.u8", "x.empty")}
    tokenizer = json.dumps({"model": {"vocab": {"<s>": 0, "a": 1}}, "added_tokens": []}).encode()
    return {
        "single": (0, _file(t, meta)),
        "single-convert": (CONVERT | DETECT, _file(small, {"format": "pt"})),
        "single-tokenizer": (DETECT | TOKENIZER, _file(small)),
        "no-metadata": (0, _file({"w": t["model.embed.weight"]})),
        "empty": (0, _file({})),
        "sharded-2": (SHARDED, sharded(t, 2, {"format": "pt"})),
        "sharded-3-detect": (SHARDED | DETECT, sharded(small, 3)),
        "sharded-convert-tokenizer": (SHARDED | DETECT | CONVERT | TOKENIZER,
                                      sharded(small, 2) + join([tokenizer])),
    }


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    written = seeds()
    for name, (control, blob) in written.items():
        target_safetensors(bytes([control, 0]) + blob)  # every seed reads as written (no refusal)
        target_safetensors(bytes([control | CONVERT, 0]) + blob)
        harness.run_one(target_safetensors, bytes([control, 0]) + blob)
        with open(os.path.join(out_dir, f"{name}-{control:02x}"), "wb") as f:
            f.write(bytes([control, 0]) + blob)
    return len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("safetensors", sys.argv)
