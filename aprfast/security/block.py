"""The bytes of an APR2 security block ("APRS"): key block, manifest, signature.

It lies right after the tensor index, before the data (docs/FORMAT.md §3.2), so a
stream holds it before the first tensor.  All integers little-endian::

    0    4   magic "APRS"
    4    1   version = 1
    5    1   flags: 0x01 SEALED, 0x02 DIGESTS, 0x04 NAMES_SEALED, 0x08 SIGNED
    6    1   digest_id: 0 (no DIGESTS), 1 SHA-256, 2 BLAKE3
    7    1   chunk_shift: chunks are 2**chunk_shift bytes of a tensor's stored extent (16..26)
    8    4   key_block_size K (0 iff not SEALED)
    12   4   reserved = 0
    16   8   block_size B, every byte of the block including the CRC
    24   8   chunk_count C
    32   K   key block: the content key sealed for a password or X25519 recipients (§10)
    ..   16  context tag (SEALED)
    ..   32  metadata tag, index tag (NAMES_SEALED)
    ..   R·C chunk records: tag (16, SEALED) then digest (32, DIGESTS)
    ..   96  Ed25519 signature (64) then the signer's public key (32) (SIGNED)
    B-4  4   CRC32 of APR2 header (32) ‖ metadata ‖ index ‖ block [0, B-4), as stored
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import CorruptError, LimitError, VersionError

__all__ = ["MAGIC", "Block", "block_size", "record_size", "parse_fixed", "parse", "encode_fixed"]

MAGIC = b"APRS"
VERSION = 1
SEALED, DIGESTS, NAMES_SEALED, SIGNED = 0x01, 0x02, 0x04, 0x08
_KNOWN = SEALED | DIGESTS | NAMES_SEALED | SIGNED
FIXED_SIZE = 32
TAG_SIZE = 16
DIGEST_SIZE = 32
SIGNATURE_SIZE = 64
PUBLIC_KEY_SIZE = 32
CRC_SIZE = 4
MIN_CHUNK_SHIFT, MAX_CHUNK_SHIFT, DEFAULT_CHUNK_SHIFT = 16, 26, 20
#: A key block is at most a multi-recipient blob for limits.MAX_RECIPIENTS keys (~100 KiB).
MAX_KEY_BLOCK = 1 << 20

_FIXED = struct.Struct("<4sBBBBIIQQ")


def record_size(flags: int) -> int:
    return (TAG_SIZE if flags & SEALED else 0) + (DIGEST_SIZE if flags & DIGESTS else 0)


def block_size(flags: int, key_block_size: int, chunk_count: int) -> int:
    return (FIXED_SIZE + key_block_size + (TAG_SIZE if flags & SEALED else 0)
            + (2 * TAG_SIZE if flags & NAMES_SEALED else 0) + record_size(flags) * chunk_count
            + (SIGNATURE_SIZE + PUBLIC_KEY_SIZE if flags & SIGNED else 0) + CRC_SIZE)


def encode_fixed(flags, digest_id, chunk_shift, key_block_size, total, chunk_count) -> bytes:
    return _FIXED.pack(MAGIC, VERSION, flags, digest_id, chunk_shift, key_block_size, 0, total, chunk_count)


@dataclass
class Block:
    """A parsed block; every field checked against the block's own size."""

    flags: int
    digest_id: int
    chunk_shift: int
    chunk_count: int
    raw: bytes              # the whole block as stored
    key_block: bytes
    context_tag: bytes
    metadata_tag: bytes
    index_tag: bytes
    records: memoryview     # C records of record_size(flags) bytes
    signed_end: int         # bytes of the block the signature covers
    signature: bytes
    signer: bytes
    crc: int

    @property
    def chunk_size(self) -> int:
        return 1 << self.chunk_shift

    @property
    def head(self) -> bytes:
        """Fixed fields and key block: what every AAD binds."""
        return self.raw[:FIXED_SIZE + len(self.key_block)]

    def tag(self, record: int) -> bytes:
        r = record_size(self.flags)
        return bytes(self.records[record * r:record * r + TAG_SIZE])

    def digest(self, record: int) -> bytes:
        r = record_size(self.flags)
        at = record * r + (TAG_SIZE if self.flags & SEALED else 0)
        return bytes(self.records[at:at + DIGEST_SIZE])


def parse_fixed(raw, room: int, max_size: int, path=None) -> tuple:
    """(flags, digest_id, chunk_shift, K, B, C) from the first 32 bytes, each checked:
    the block must fit in ``room`` bytes (up to the data) and ``max_size``."""
    magic, version, flags, digest_id, shift, key_size, reserved, total, count = _FIXED.unpack(bytes(raw))
    if magic != MAGIC:
        raise CorruptError(f"the header's ENCRYPTED/SIGNED flags are set but no security block follows the index "
                           f"(found {magic!r}, expected {MAGIC!r})", path=path)
    if version != VERSION or flags & ~_KNOWN or reserved:
        raise VersionError(f"security block version {version}, flags {flags:#x}, reserved {reserved}: this build "
                           f"reads version {VERSION}, flags within {_KNOWN:#x}, reserved 0", path=path)
    if not MIN_CHUNK_SHIFT <= shift <= MAX_CHUNK_SHIFT:
        raise CorruptError(f"security block chunk_shift {shift} is outside {MIN_CHUNK_SHIFT}..{MAX_CHUNK_SHIFT}",
                           path=path)
    if (flags & (NAMES_SEALED | SEALED)) == NAMES_SEALED or (flags & (SIGNED | DIGESTS)) == SIGNED:
        raise CorruptError(f"security block flags {flags:#x}: NAMES_SEALED needs SEALED and SIGNED needs DIGESTS",
                           path=path)
    if not flags & (SEALED | DIGESTS):
        raise CorruptError(f"security block flags {flags:#x} neither seal nor digest the chunks", path=path)
    if bool(digest_id) != bool(flags & DIGESTS):
        raise CorruptError(f"security block digest_id {digest_id} disagrees with its DIGESTS flag", path=path)
    if bool(key_size) != bool(flags & SEALED) or key_size > MAX_KEY_BLOCK:
        raise CorruptError(f"security block key_block_size {key_size} (SEALED {bool(flags & SEALED)}; at most "
                           f"{MAX_KEY_BLOCK})", path=path)
    if total > max_size:
        raise LimitError(f"security block of {total} bytes exceeds the limit of {max_size} "
                         "(aprfast.limits.MAX_INDEX_SIZE)", path=path)
    if total > room:
        raise CorruptError(f"security block of {total} bytes does not fit in the {room} bytes between the index "
                           "and the data", path=path)
    if count > total or total != block_size(flags, key_size, count):
        raise CorruptError(f"security block size {total} does not match its {count} chunk records "
                           f"(expected {block_size(flags, key_size, min(count, total))})", path=path)
    return flags, digest_id, shift, key_size, total, count


def parse(raw: bytes, path=None) -> Block:
    """A block whose fixed fields :func:`parse_fixed` accepted."""
    flags, digest_id, shift, key_size, total, count = parse_fixed(raw[:FIXED_SIZE], len(raw), len(raw), path)
    at = FIXED_SIZE
    key_block = raw[at:at + key_size]
    at += key_size
    context_tag = metadata_tag = index_tag = b""
    if flags & SEALED:
        context_tag, at = raw[at:at + TAG_SIZE], at + TAG_SIZE
    if flags & NAMES_SEALED:
        metadata_tag, index_tag, at = raw[at:at + TAG_SIZE], raw[at + TAG_SIZE:at + 2 * TAG_SIZE], at + 2 * TAG_SIZE
    n = record_size(flags) * count
    records, at = memoryview(raw)[at:at + n], at + n
    signed_end, signature, signer = at, b"", b""
    if flags & SIGNED:
        signature, signer = raw[at:at + SIGNATURE_SIZE], raw[at + SIGNATURE_SIZE:at + SIGNATURE_SIZE + PUBLIC_KEY_SIZE]
        at += SIGNATURE_SIZE + PUBLIC_KEY_SIZE
    crc = int.from_bytes(raw[at:at + CRC_SIZE], "little")
    return Block(flags, digest_id, shift, count, raw, key_block, context_tag, metadata_tag, index_tag, records,
                 signed_end, signature, signer, crc)
