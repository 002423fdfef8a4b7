#!/usr/bin/env python3
"""atheris target: the MLE v2 reader (aprfast.convert.mle): header, sections, CRCs, the
JSON metadata and the Ed25519 signature; ``inspect_mle``, ``validate_mle`` and import.

    python tests/fuzz/fuzz_mle.py --seeds OUT_DIR           # write the seed corpus
    python tests/fuzz/fuzz_mle.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the file.
Control bits: 0x01 FIX: carry a mutated file past its checks, from seed 003's layout
with zlib and PyNaCl (the metadata, graph and weights CRC-32s, the signature block's
model hash and Ed25519 signature remade with the fuzz key when the signature section
holds one, then the header CRC taken with its own field zeroed), as far as the header's
offsets lie inside the file; 0x02 also ``aprfast.convert`` to .apr (same bytes); 0x04
``inspect_mle`` and ``validate_mle`` (0x08: with the fuzz key trusted) too; 0x10 through
``aprfast.convert.open_source``.  Oracle: harness.run_one.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FIX, CONVERT, REPORT, TRUSTED, DETECT = 0x01, 0x02, 0x04, 0x08, 0x10
FIELDS = struct.Struct("<4sIII10Q4I2I")  # magic, version, flags, header_size, 5 x (offset, size), 3 CRCs, ...
SECTIONS = ("metadata", "graph", "weights", "signature", "compression")
CRC_AT = 108
SIGNATURE = struct.Struct("<BBHQ32s64s32s")


def _section(data: bytes, values, name: str) -> bytes:
    i = SECTIONS.index(name)
    offset, size = values[4 + 2 * i], values[5 + 2 * i]
    return data[offset:offset + size] if offset + size <= len(data) else b""


def fix_mle(data: bytes) -> bytes:
    """See the module docstring; bytes that are not an MLE v2 header come back unchanged."""
    if len(data) < FIELDS.size or data[:4] != b"MLE\0":
        return data
    import harness

    out = bytearray(data)
    values = FIELDS.unpack_from(out)
    parts = [_section(data, values, n) for n in ("metadata", "graph", "weights")]
    struct.pack_into("<3I", out, 96, *(zlib.crc32(p) for p in parts))
    sig_off, sig_size = values[4 + 6], values[5 + 6]
    if SIGNATURE.size <= sig_size and sig_off + SIGNATURE.size <= len(out) and sig_off >= FIELDS.size:
        digest = hashlib.sha256(b"".join(parts)).digest()
        algorithm, hash_algorithm, reserved, timestamp = SIGNATURE.unpack_from(out, sig_off)[:4]
        signer = harness.KEYS["signer"]
        SIGNATURE.pack_into(out, sig_off, algorithm, hash_algorithm, reserved, timestamp,
                            harness.KEYS["ed25519_public"], signer.sign(digest).signature, digest)
    header_size = min(values[3], len(out))
    if header_size >= CRC_AT + 4:
        header = bytes(out[:header_size])
        struct.pack_into("<I", out, CRC_AT, zlib.crc32(header[:CRC_AT] + bytes(4) + header[CRC_AT + 4:]))
    return bytes(out)


def target_mle(data: bytes) -> None:
    import harness

    from aprfast.convert import mle, open_source

    control, _param, body = harness.split(data)
    if control & FIX:
        body = fix_mle(body)
    path = os.path.join(harness.write_scratch({"m.mle": body}), "m.mle")
    if control & REPORT:
        repr(mle.inspect_mle(path))
        trusted = harness.KEYS["ed25519_public"] if control & TRUSTED else None
        report = mle.validate_mle(path, trusted_key=trusted)
        mle.format_inspect(path, mle.inspect_mle(path))
        mle.format_validate(report)
    src = open_source(path) if control & DETECT else mle.MLESource(path)
    try:
        got = harness.drain_source(src)
    finally:
        src.close()
    if control & CONVERT:
        harness.convert_agrees(path, got, os.path.join(os.path.dirname(path), "out.apr"))


# --- seeds: seed 003's struct, built with struct and zlib --------------------------------------
def mle_file(metadata=b'{"name":"fuzz"}', graph=b"GRPH", weights=bytes(range(16)), *, flags=0, header_size=128,
             signature=b"", compression=b"") -> bytes:
    """Header, then metadata, graph, weights, compression, signature (CRCs and header CRC
    left zero: fix_mle sets them)."""
    body, offsets, at = b"", {}, header_size
    for name, blob in (("metadata", metadata), ("graph", graph), ("weights", weights), ("compression", compression),
                       ("signature", signature)):
        offsets[name] = (at if blob else 0, len(blob))
        body += blob
        at += len(blob)
    sections = [v for n in SECTIONS for v in offsets[n]]
    fixed = FIELDS.pack(b"MLE\0", 2, flags, header_size, *sections, 0, 0, 0, 0, 2, 2)
    return fixed + bytes(header_size - len(fixed)) + body


def seeds() -> dict:
    """name -> (control, file bytes), every CRC and signature made (fix_mle)."""
    signature = SIGNATURE.pack(1, 1, 0, 1_700_000_000, bytes(32), bytes(64), bytes(32))
    meta = b'{"name": "fuzz", "version": "1.0", "inputs": [{"name": "x", "shape": [1, 4]}], "extra": null}'
    files = {
        "plain": (FIX, mle_file(meta)),
        "report": (FIX | REPORT, mle_file(meta)),
        "signed": (FIX | REPORT | TRUSTED, mle_file(meta, flags=0x04, signature=signature)),
        "signed-convert": (FIX | CONVERT | DETECT, mle_file(flags=0x04, signature=signature)),
        "long-header": (FIX | REPORT, mle_file(header_size=160, graph=b"")),
        "compression-header": (FIX | REPORT, mle_file(compression=struct.pack("<BBHQIB3s", 1, 3, 0, 16, 0, 8, b""))),
        "no-metadata": (FIX, mle_file(metadata=b"", weights=b"")),
    }
    return {name: (control, fix_mle(blob)) for name, (control, blob) in files.items()}


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    written = seeds()
    for name, (control, blob) in written.items():
        target_mle(bytes([control, 0]) + blob)  # every seed reads as written (no refusal)
        target_mle(bytes([control | CONVERT | REPORT, 0]) + blob)
        harness.run_one(target_mle, bytes([control & ~FIX, 0]) + blob)
        for c in (control, control & ~FIX):
            with open(os.path.join(out_dir, f"{name}-{c:02x}"), "wb") as f:
                f.write(bytes([c, 0]) + blob)
    return 2 * len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("mle", sys.argv)
