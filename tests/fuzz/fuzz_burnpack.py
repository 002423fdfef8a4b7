#!/usr/bin/env python3
"""atheris target: the Burnpack reader (aprfast.convert.burnpack): the header, the CBOR
guard's walk (``check_cbor``) and what cbor2 then decodes, tensor descriptors and ranges.

    python tests/fuzz/fuzz_burnpack.py --seeds OUT_DIR      # write the seed corpus
    python tests/fuzz/fuzz_burnpack.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the body.
Burnpack has no checksum.  Control bits: 0x01 open through
``aprfast.convert.open_source``; 0x02 also ``aprfast.convert`` to .apr (same bytes);
0x04 the body is a bare CBOR item for ``check_cbor`` then ``_loads`` (the walk alone,
with a memory budget of ``param`` KiB when param is not 0), no file around it; 0x08
fix: the header's metadata length is set to the CBOR item's length (as far as the
walk finds one), so mutations inside the CBOR are not all refused by the header.
Oracle: harness.run_one.
"""

from __future__ import annotations

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DETECT, CONVERT, BARE, FIX = 0x01, 0x02, 0x04, 0x08


def target_burnpack(data: bytes) -> None:
    import harness

    from aprfast.convert import burnpack as bpk
    from aprfast.convert import open_source

    control, param, body = harness.split(data)
    if control & BARE:
        budget = param << 10 if param else None
        bpk.check_cbor(body, "bare", max_memory=budget)
        repr(bpk._loads(body, "bare"))
        return
    if control & FIX and len(body) >= 10:
        body = body[:6] + struct.pack("<I", min(_cbor_length(body[10:]), len(body) - 10)) + body[10:]
    path = os.path.join(harness.write_scratch({"m.bpk": body}), "m.bpk")
    src = open_source(path) if control & DETECT else bpk.BurnpackSource(path)
    try:
        got = harness.drain_source(src)
    finally:
        src.close()
    if control & CONVERT:
        harness.convert_agrees(path, got, os.path.join(os.path.dirname(path), "out.apr"))


def _cbor_length(data: bytes) -> int:
    """Bytes of the first CBOR item in ``data`` (definite lengths; as far as it goes)."""
    pos, pending = 0, 1
    while pending and pos < len(data):
        pending -= 1
        major, info = data[pos] >> 5, data[pos] & 31
        pos += 1
        if info < 24:
            value = info
        elif info <= 27:
            n = 1 << (info - 24)
            value = int.from_bytes(data[pos:pos + n], "big")
            pos += n
        else:
            return pos
        if major in (2, 3):
            pos += value
        elif major == 4:
            pending += value
        elif major == 5:
            pending += 2 * value
        elif major == 6:
            pending += 1
        if pending > 1 << 20:
            return pos
    return min(pos, len(data))


# --- seeds: written here from seed 004's layout with cbor2 -----------------------------------
def burnpack_file(tensors: dict, metadata=None, scalars=None) -> bytes:
    """tensors: name -> (burn dtype (CBOR value), shape, data bytes, param_id or None)."""
    import cbor2

    descs, blobs, at = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, blob, param_id = tensors[name]
        desc = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(blob)]}
        if param_id is not None:
            desc["param_id"] = param_id
        descs[name] = desc
        pad = -len(blob) % 256
        blobs.append(blob + bytes(pad))
        at += len(blob) + pad
    top = {"tensors": descs}
    if metadata is not None:
        top["metadata"] = metadata
    if scalars is not None:
        top["scalars"] = scalars
    meta = cbor2.dumps(top)
    head = b"NRUB" + struct.pack("<HI", 1, len(meta)) + meta
    return head + bytes(-len(head) % 256) + b"".join(blobs)


def seeds() -> dict:
    import cbor2
    import numpy as np

    r = np.random.default_rng(4)
    tensors = {
        "linear.weight": ("F32", (3, 2), r.standard_normal(6).astype(np.float32).tobytes(), 7),
        "linear.bias": ("F16", (2,), np.float16([1, -1]).tobytes(), 8),
        "norm.gamma": ("BF16", (2,), b"\x80\x3f\x00\x40", None),
        "flag": ({"Bool": "Native"}, (3,), b"\x01\x00\x01", None),
        "ids": ("I64", (2,), np.int64([1, 2]).tobytes(), None), "u": ("U32", (1,), b"\x05\0\0\0", None),
        "f64": ("F64", (1,), np.float64([0.5]).tobytes(), None), "flex": ("Flex32", (1,), b"\0\0\x80\x3f", None),
        "empty": ("F32", (0, 4), b"", None),
    }
    meta = {"format": "burn", "model_type": "mlp", "aprfast.json": "[1, 2]"}
    scalars = {"lr": {"Float": 0.5}, "steps": {"UInt": 3}, "delta": {"Int": -1}, "on": {"Bool": True}}
    small = {k: tensors[k] for k in ("linear.weight", "flag")}
    bare = cbor2.dumps({"tensors": {}, "metadata": {"a": "b"}, "nested": [[1, 2.5, b"x", None, {"k": [True]}]]})
    return {
        "mlp": (0, burnpack_file(tensors, meta, scalars)),
        "mlp-fix": (FIX, burnpack_file(tensors, meta)),
        "small-convert": (CONVERT | DETECT, burnpack_file(small, {"format": "burn"})),
        "scalars-only": (FIX | DETECT, burnpack_file({}, None, scalars)),
        "bare-cbor": (BARE, bare),
        "bare-budget": (BARE, cbor2.dumps([{"k": list(range(40))}, "text" * 8])),
    }


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    written = seeds()
    for name, (control, blob) in written.items():
        target_burnpack(bytes([control, 0]) + blob)  # every seed reads as written (no refusal)
        if not control & BARE:
            target_burnpack(bytes([control | CONVERT, 0]) + blob)
        harness.run_one(target_burnpack, bytes([control, 0]) + blob)
        with open(os.path.join(out_dir, f"{name}-{control:02x}"), "wb") as f:
            f.write(bytes([control, 0]) + blob)
    return len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("burnpack", sys.argv)
