#!/usr/bin/env python3
"""atheris target: the v1 STREAMING chunk index and its chunks, and the TRUENO_NATIVE
index, parsed and read directly (aprfast.layouts.chunk_index, aprfast.v1.chunks,
aprfast.layouts.trueno), without the v1 file around them, so every mutation lands in an
index, a chunk record, a key block or a chunk (sealed, compressed: the C LZ4 block
decoder and zstd, AES-GCM).

    python tests/fuzz/fuzz_v1_index.py --seeds OUT_DIR      # write the seed corpus
    python tests/fuzz/fuzz_v1_index.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the body.

Chunk index (control bit 0x20 clear): the body is the index then the payload (the
chunks).  The harness puts a v1 header in front (metadata empty; the codec of control
bits 2-3: 0 none, 1 zstd, 2 zstd-max, 3 LZ4; ENCRYPTED when the index says SEALED) and
runs harness.fix_v1_streaming on it: 0x01 FIX (each chunk's CRC32 and SHA-256, the index
CRC), 0x02 PACK (each chunk holds raw bytes: compress it), 0x10 SEAL (each chunk holds
plaintext: AES-GCM seal it under the file key the key block opens with the credentials of
``param`` bits 6-7: 0-1 the fuzz password, 2 alice's key, 3 multi-recipient for alice).
Then ``chunk_index.parse``, ``v1.chunks.check_chunk_sizes``, the key block opened
(``v1.checks.decrypt_payload``) and a ``ChunkReader``: every tensor as an array, byte
ranges of it (0x80: bounds from ``param`` bits 0-5) and ``verify()``; 0x40 checks each
chunk's SHA-256 (``check_digests``).

TRUENO_NATIVE (0x20 set): the body is a u16 ``payload_start`` then the payload;
``trueno.parse`` and every tensor viewed (``v1.load.trueno_view``) over a buffer of
``payload_start`` zero bytes followed by the payload, and copied.

Oracle: harness.run_one.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FIX, PACK, CODEC, SEAL, TRUENO, DIGESTS, RANGES = 0x01, 0x02, 0x0C, 0x10, 0x20, 0x40, 0x80
_HEADER = struct.Struct("<4sBBHIIIBBB9s")


def _modes(param: int) -> int:
    """param bits 6-7 -> harness CONTROL.MODE value (1 password, 2 recipient, 3 multi)."""
    return max(1, param >> 6)


def wrap(body: bytes, compression: int) -> bytes:
    """A v1 file around an index + payload body, for harness.fix_v1_streaming."""
    index_size = min(int.from_bytes(body[8:12], "little"), len(body)) if len(body) >= 12 else len(body)
    sealed = len(body) > 5 and body[5] & 0x01
    header = _HEADER.pack(b"APRN", 1, 0, 0x0010, 0, len(body) - index_size, 0, compression, 0x04 | bool(sealed),
                          0, bytes(9))
    return header + body + bytes(4)


def unwrap(data: bytes):
    """(v1 header, index bytes, payload bytes) of a wrapped body."""
    header, rest = data[:32], data[32:-4]
    index_size = min(int.from_bytes(rest[8:12], "little"), len(rest)) if len(rest) >= 12 else len(rest)
    return header, rest[:index_size], rest[index_size:]


def target_v1_index(data: bytes) -> None:
    import harness

    control, param, body = harness.split(data)
    if control & TRUENO:
        return _trueno(body)
    import numpy as np

    from aprfast.codecs.payload import Compression
    from aprfast.layouts import chunk_index
    from aprfast.v1 import checks, chunks

    compression = (control & CODEC) >> 2
    hc = (control & FIX) | (harness.CONTROL.PACK if control & PACK else 0) | (
        harness.CONTROL.SEAL if control & SEAL else 0) | (_modes(param) << 3)
    header, index_bytes, payload = unwrap(harness.fix_v1_streaming(wrap(body, compression), hc))
    payload_size = _HEADER.unpack(header)[5]
    path = "fuzz.apr"
    index = chunk_index.parse(index_bytes, prefix_crc=zlib.crc32(header), payload_size=payload_size, path=path,
                              strict_dtypes=not param & 0x20)
    chunks.check_chunk_sizes(index, Compression(compression), path)
    key = None
    if index.sealed:
        mode = _modes(param)
        key, _ = checks.decrypt_payload(index.key_block, harness.PASSWORD if mode == 1 else None,
                                        None if mode == 1 else harness.KEYS["alice"], path)
        if len(key) != 32:
            return  # open_chunks refuses it (CorruptError) here
        key = bytearray(key)
    start = len(header) + len(index_bytes)

    def read(offset: int, size: int, what: str):
        from aprfast.errors import CorruptError

        at = offset - start
        if at < 0 or at + size > len(payload):
            raise CorruptError(f"file ends inside {what}", path=path)
        return memoryview(payload)[at:at + size]

    reader = chunks.ChunkReader(index, header, hashlib.sha256(b"").digest(), Compression(compression), key, start,
                                "password" if key is not None else "none", path, bool(control & DIGESTS))
    try:
        for name, t in index.tensors.items():
            value = reader.array(read, name)
            harness.touch(value)
            harness.take_stats(value)
            whole = harness.raw_bytes(value)
            if t.dtype is not None and len(whole) != t.nbytes:
                raise AssertionError(f"tensor {name!r}: array() gives {len(whole)} bytes, the index says {t.nbytes}")
            if control & RANGES and t.nbytes:
                lo = (param & 0x1F) % t.nbytes
                hi = min(t.nbytes, lo + 1 + (param & 0x3F) * 7)
                buffer, base = reader.tensor_bytes(read, name, lo, hi)
                got = bytes(np.asarray(buffer, dtype=np.uint8)[lo - base:hi - base])
                harness.same(f"tensor_bytes({lo}, {hi})", name, whole[lo:hi], got)
        reader.verify(read)
    finally:
        reader.close()


def _trueno(body: bytes) -> None:
    import harness
    import numpy as np

    from aprfast.layouts import trueno
    from aprfast.v1.load import trueno_view

    if len(body) < 2:
        return
    start = int.from_bytes(body[:2], "little")
    payload = body[2:]
    entries = trueno.parse(payload, start, path="fuzz.apr")
    whole = np.frombuffer(bytes(start) + payload, np.uint8)
    for entry in entries.values():
        view = trueno_view(whole, entry)
        harness.touch(np.ascontiguousarray(view))
        harness.take_stats(view)  # strided: the engine's chunked path
        trueno.backend_name(entry.backend_hint)


# --- seeds: cut from make_corpus's STREAMING and TRUENO_NATIVE files ------------------------
def cut(data: bytes) -> bytes:
    """index + payload of a STREAMING v1 file."""
    import harness

    parts = harness.StreamingParts(data)
    assert parts.ok
    return data[parts.start:parts.end + parts.fields[5]]


def seeds() -> dict:
    """name -> (control, param, body)."""
    import harness
    import make_corpus

    made = make_corpus.indexed_v1_seeds()
    out = {}
    codec = {"none": 0, "zstd": 1, "lz4": 3}
    for name, c in codec.items():  # compressed chunks as written (no AAD: the v1 header does not matter)
        out[f"{name}"] = (FIX | c << 2 | RANGES, 0x25, cut(made[f"v1s-{name}"][1]))
    out["zstd-max-bigchunks"] = (FIX | 2 << 2, 0, cut(made["v1s-zstd-max-bigchunks"][1]))
    out["signed-digests"] = (FIX | 1 << 2 | DIGESTS | RANGES, 0x11, cut(made["v1s-signed"][1]))
    out["licensed"] = (FIX | 1 << 2, 0, cut(made["v1s-licensed"][1]))
    out["unpacked-zstd"] = (FIX | PACK | 1 << 2, 0, cut(made["v1s-unpacked-zstd"][1]))
    out["unpacked-lz4-digests"] = (FIX | PACK | 3 << 2 | DIGESTS, 0, cut(made["v1s-unpacked-lz4-signed"][1]))
    # Sealed: plaintext chunks that SEAL seals under this target's header, and the same sealed
    # once here (FIX only: a mutated sealed chunk must then fail its tag).
    for name, control, param in (("unsealed-password", FIX | SEAL, 0x40),
                                 ("unsealed-lz4-password-signed", FIX | PACK | SEAL | 3 << 2 | DIGESTS, 0x40),
                                 ("unsealed-zstd-recipient", FIX | PACK | SEAL | 1 << 2 | RANGES, 0x83),
                                 ("unsealed-multi", FIX | SEAL, 0xC0)):
        body = cut(made[f"v1s-{name}"][1])
        out[name] = (control, param, body)
        # compressed first, then sealed under the header a FIX-only replay rebuilds (PACK sets
        # its uncompressed size, which the chunks' AAD covers)
        codec = (control & CODEC) >> 2
        if control & PACK:
            body = b"".join(unwrap(harness.fix_v1_streaming(wrap(body, codec), FIX | harness.CONTROL.PACK))[1:])
        hc = FIX | harness.CONTROL.SEAL | (_modes(param) << 3)
        _header, index, payload = unwrap(harness.fix_v1_streaming(wrap(body, codec), hc))
        out[name.replace("unsealed", "sealed")] = (control & ~(PACK | SEAL), param, index + payload)
    for name in ("v1t", "v1t-hints", "v1t-signed", "v1t-licensed"):
        data = made[name][1]
        meta_size, payload_size = _HEADER.unpack_from(data)[4:6]
        start = 32 + meta_size
        out[f"trueno-{name}"] = (TRUENO, 0, struct.pack("<H", start) + data[start:start + payload_size])
    return out


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    with harness.fuzz_environment():
        written = seeds()
        for name, (control, param, body) in written.items():
            target_v1_index(bytes([control, param]) + body)  # every seed reads as written (no refusal)
            with open(os.path.join(out_dir, f"{name}-{control:02x}{param:02x}"), "wb") as f:
                f.write(bytes([control, param]) + body)
    return len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("v1_index", sys.argv)
