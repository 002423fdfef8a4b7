"""Reading the STREAMING chunk index of a v1 file: each chunk located, checked (CRC32 or
signed SHA-256, AES-GCM tag, bounded decompression) and decoded as it is read
(:class:`ChunkReader`), for :class:`~aprfast.v1.reader.V1File` and :func:`aprfast.stream`."""

from __future__ import annotations

import hashlib

from .._crc import crc32
from ..codecs import payload as codecs
from ..codecs.payload import Compression
from ..errors import AprError, ChecksumError, CorruptError, DecryptError, SignatureError
from ..layouts import chunk_index
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header
from .checks import FILE_KEY_SIZE, decrypt_payload, refuse_downgrade, tag_size


# --- the chunk index: open, then decode one tensor's chunks ------------------------------
def open_chunks(read, header: Header, regions, path, limits, strict_dtypes, password, private_key,
                 allow_unencrypted, check_digests: bool = False) -> "ChunkReader":
    """Parse and check the chunk index (its CRC covers header, metadata and index), then
    open the file key if the chunks are sealed.  ``check_digests``: compare each chunk
    read with its SHA-256 in the index (a signed file opened through its index
    signature, :func:`verify_index_signature`)."""
    from ..limits import Limits

    start, end = regions.index
    prefix = read(0, start, "v1 header and metadata")
    index = chunk_index.parse(read(start, end - start, "chunk index"), prefix_crc=crc32(prefix),
                              payload_size=header.payload_size, path=path, limits=limits or Limits(),
                              strict_dtypes=strict_dtypes)
    if index.sealed != bool(header.flags & Flag.ENCRYPTED):
        raise CorruptError(f"the chunk index says its chunks are {'' if index.sealed else 'not '}sealed but the "
                           f"header's ENCRYPTED flag is {'set' if header.flags & Flag.ENCRYPTED else 'clear'}",
                           path=path)
    if bool(index.signature) != bool(header.flags & Flag.SIGNED):
        raise CorruptError(f"the chunk index {'has' if index.signature else 'lacks'} chunk digests and a signature "
                           f"but the header's SIGNED flag is {'set' if header.flags & Flag.SIGNED else 'clear'}",
                           path=path)
    if index.raw_total != header.uncompressed_size:
        raise CorruptError(f"the chunks hold {index.raw_total} raw bytes but the header's uncompressed_size says "
                           f"{header.uncompressed_size}", path=path)
    check_chunk_sizes(index, Compression(header.compression), path)
    key, encryption = None, "none"
    if index.sealed:
        key, encryption = decrypt_payload(index.key_block, password, private_key, path)
        if len(key) != FILE_KEY_SIZE:
            raise CorruptError(f"the chunk index's key block holds a {len(key)}-byte key, not {FILE_KEY_SIZE}",
                               path=path)
    else:
        refuse_downgrade(header, password, private_key, allow_unencrypted, path)
    digest = hashlib.sha256(prefix[layout.HEADER_SIZE:]).digest()
    return ChunkReader(index, bytes(prefix[:layout.HEADER_SIZE]), digest, Compression(header.compression), key,
                   regions.payload[0], encryption, path, check_digests)


def check_chunk_sizes(index, compression, path) -> None:
    """Every chunk's raw size must be one its stored bytes could produce, so that the
    buffer for a whole tensor (allocated before its chunks are decoded) stays
    proportional to the bytes present: stored = raw when uncompressed, LZ4 inflates at
    most 255-fold, zstd 32,768-fold (aprfast.codecs)."""
    from .. import _memory

    # (crypto only for a sealed index: importing it loads OpenSSL and libsodium, several
    # MiB that an unencrypted stream must not pay)
    tag = tag_size() if index.sealed else 0
    for i, c in enumerate(index.chunks):
        packed = c.stored_size - tag
        if compression is Compression.NONE:
            most = packed
        elif compression is Compression.LZ4:
            most = max(packed - 4, 0) * _memory.LZ4_MAX_RATIO + _memory.LZ4_SLACK
        else:
            most = packed * codecs.ZSTD_MAX_RATIO + codecs.ZSTD_SLACK
        if packed < 0 or c.raw_size > most or (compression is Compression.NONE and c.raw_size != packed):
            raise CorruptError(f"chunk {i} declares {c.raw_size} raw bytes, which its {c.stored_size} stored bytes "
                               f"cannot hold ({compression.aprender_name}{', sealed' if tag else ''})", path=path)


class ChunkReader:
    """A parsed chunk index and what decoding a chunk needs (the file key, if sealed).

    Each chunk is checked in this order when it is read: its CRC32 (accidental damage,
    ChecksumError), its SHA-256 against the signed index (``check_digests``,
    SignatureError), its AES-GCM tag under AAD that binds it to the header, the
    metadata, the index header and its own tensor and place (DecryptError: altered,
    moved, swapped or from a truncated index), then decompression to exactly its
    raw size (CorruptError).  Thread-safe: nothing changes after construction."""

    def __init__(self, index, header_bytes, metadata_digest, compression, key, payload_start, encryption, path,
                 check_digests=False):
        self.check_digests = check_digests
        self.index = index
        self.header_bytes = header_bytes
        self.metadata_digest = metadata_digest
        self.compression = compression
        self._key = key
        self.payload_start = payload_start
        self.encryption = encryption
        self.path = path

    def close(self) -> None:
        if self._key is not None:
            self._key[:] = bytes(len(self._key))  # a bytearray we own: wipe the file key
            self._key = None

    def chunk_range(self, name: str, lo: int = 0, hi: int | None = None):
        """(first, stop, byte offset of chunk ``first`` in the tensor) for the chunks of
        ``name`` covering its raw bytes [lo, hi)."""
        t = self.index.tensors[name]
        hi = t.nbytes if hi is None else hi
        at, first, stop, base = 0, None, t.first, 0
        for i in range(t.first, t.first + t.count):
            size = self.index.chunks[i].raw_size
            if at + size > lo and at < hi:
                if first is None:
                    first, base = i, at
                stop = i + 1
            at += size
        return (t.first, t.first, 0) if first is None else (first, stop, base)

    def tensor_bytes(self, read, name: str, lo: int = 0, hi: int | None = None):
        """(owned aligned buffer of the decoded chunks covering bytes [lo, hi) of
        tensor ``name``, the tensor byte offset where that buffer starts)."""
        from .. import _memory

        first, stop, base = self.chunk_range(name, lo, hi)
        chunks = self.index.chunks
        size = sum(chunks[i].raw_size for i in range(first, stop))
        out = _memory.AlignedBuffer(size, 64)
        at = 0
        with memoryview(out) as target:
            for i in range(first, stop):
                raw = self.decode(read, name, i)
                _memory.copy_into(target[at:at + len(raw)], raw)
                at += len(raw)
        return out, base

    def decode(self, read, name: str, i: int):
        """Chunk ``i`` (of tensor ``name``) read, checked, opened and decompressed."""
        c = self.index.chunks[i]
        t = self.index.tensors[name]
        what = f"tensor {name!r} chunk {i - t.first} (chunk {i} of the file)"
        stored = read(self.payload_start + c.offset, c.stored_size, what)
        actual = crc32(stored)
        if actual != c.crc:
            raise ChecksumError(f"{what}: CRC32 of its {c.stored_size} stored bytes is {actual:#010x}, the index "
                                f"says {c.crc:#010x}", path=self.path)
        if self.check_digests and hashlib.sha256(stored).digest() != c.digest:
            raise SignatureError(f"{what}: its SHA-256 is not the one in the signed chunk index (the chunk was "
                                 "altered after signing)", path=self.path)
        if self._key is not None:
            stored = self._open(stored, c, t, i, what)
        try:
            return codecs.decompress(stored, self.compression, expected_size=c.raw_size,
                                     limit=self.index.chunk_limit, path=self.path)
        except AprError as exc:
            raise type(exc)(f"{what}: {exc.message}", path=self.path) from None

    def _open(self, stored, c, t, i, what):
        from ..crypto import core as crypto

        if len(stored) < crypto.TAG_SIZE:
            raise DecryptError(f"{what} is {len(stored)} bytes, shorter than its 16-byte tag", path=self.path)
        aad = chunk_index.chunk_aad(self.header_bytes, self.metadata_digest, self.index.header_bytes, t.record,
                                    c.offset, c.stored_size, c.raw_size, i)
        plain = crypto._aead.open(memoryview(stored), self._key, chunk_index.chunk_nonce(i), memoryview(aad))
        if plain is None:
            raise DecryptError(f"{what} fails AES-256-GCM authentication: it was altered, moved or swapped, or "
                               "the index or header around it changed", path=self.path)
        return plain

    def array(self, read, name: str):
        """The whole tensor as an owned array (or RawTensor/QuantizedTensor)."""
        from ..dtypes import APR2_IDS
        from ..files.reader import array_maker

        t = self.index.tensors[name]
        buffer, _ = self.tensor_bytes(read, name)
        return array_maker(APR2_IDS, t.dtype_id)(t.shape, buffer, 0, t.nbytes)

    def all_tensors(self, read) -> dict:
        return {name: self.array(read, name) for name in self.index.tensors}

    def verify(self, read) -> None:
        """Decode every chunk (CRC, tag, decompression), keeping nothing."""
        for name, t in self.index.tensors.items():
            for i in range(t.first, t.first + t.count):
                self.decode(read, name, i)
