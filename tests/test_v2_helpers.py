"""Shared by the test_v2_* security tests: where things lie in an encrypted or signed
APR2 file, and how an attacker re-seals the CRCs after changing bytes (so the tests
reach the cryptographic checks, not only the CRCs)."""

import struct
import zlib
from dataclasses import dataclass

import numpy as np

import aprfast
from aprfast.crypto import core as crypto

PASSWORD = "correct horse battery staple"
SIGNING_SEED, SIGNING_PUBLIC = crypto.generate_signing_key()
RECIPIENT_SECRET, RECIPIENT_PUBLIC = crypto.generate_x25519_key()
OTHER_SECRET, OTHER_PUBLIC = crypto.generate_x25519_key()
MiB = 1 << 20


def model() -> dict:
    """Tensors over several 1 MiB chunks, a one-chunk one, a tiny one and an empty one."""
    rng = np.random.default_rng(7)
    return {
        "big.weight": rng.standard_normal((640, 1024)).astype(np.float32),      # 2.5 MiB: 3 chunks
        "mid.weight": (np.arange(300_000) % 251).astype(np.uint8),              # compresses well
        "small.bias": np.arange(12, dtype=np.int16).reshape(3, 4),
        "zero": np.zeros((0, 4), np.float32),
    }


@dataclass
class Layout:
    flags: int
    meta_off: int
    meta_size: int
    index_off: int
    index_size: int
    data_off: int
    block_at: int
    block_flags: int
    chunk_shift: int
    key_size: int
    block_size: int
    chunk_count: int

    @property
    def record_size(self) -> int:
        return (16 if self.block_flags & 1 else 0) + (32 if self.block_flags & 2 else 0)

    @property
    def records_at(self) -> int:
        return (self.block_at + 32 + self.key_size + (16 if self.block_flags & 1 else 0)
                + (32 if self.block_flags & 4 else 0))

    def record(self, n: int) -> int:
        return self.records_at + n * self.record_size

    @property
    def signature_at(self) -> int:
        return self.records_at + self.chunk_count * self.record_size


def layout_of(data) -> Layout:
    fields = struct.unpack_from("<4sHHIIIIII", data, 0)
    flags, meta_off, meta_size, index_off, index_size, data_off = fields[3:]
    at = index_off + index_size
    _, _, bflags, _, shift, key_size, _, total, count = struct.unpack_from("<4sBBBBIIQQ", data, at)
    return Layout(flags, meta_off, meta_size, index_off, index_size, data_off, at, bflags, shift, key_size, total,
                  count)


def fix_crcs(buf: bytearray) -> bytearray:
    """Recompute the security block's CRC and the footer's, as an attacker would."""
    lay = layout_of(buf)
    end = lay.block_at + lay.block_size - 4
    crc = zlib.crc32(bytes(buf[:32]))
    crc = zlib.crc32(bytes(buf[lay.meta_off:lay.meta_off + lay.meta_size]), crc)
    crc = zlib.crc32(bytes(buf[lay.index_off:lay.index_off + lay.index_size]), crc)
    crc = zlib.crc32(bytes(buf[lay.block_at:end]), crc)
    struct.pack_into("<I", buf, end, crc)
    struct.pack_into("<I", buf, len(buf) - 16, zlib.crc32(bytes(buf[:-16])))
    return buf


def extent(data, name, **keys):
    """(absolute offset, stored size, first chunk record) of a tensor."""
    with aprfast.open(bytes(data), **keys) as f:
        names = f.keys()
        shift = layout_of(data).chunk_shift
        first = sum(-(-f.info(n).nbytes >> shift) for n in names[:names.index(name)])
        info = f.info(name)
        return info.offset, info.nbytes, first


def flip(buf: bytearray, at: int) -> bytearray:
    buf[at] ^= 0x5A
    return buf
