"""Writing a sealed and/or signed APR2 file: the content key and its key block, each
tensor chunk sealed with AES-256-GCM (detached tag), the digest manifest, the
signature and the block CRC.  Also the nonce and AAD rules readers share.

Every tensor's stored extent (its raw bytes, or its block table and blocks when
compressed: compress, then encrypt) is cut into chunks of ``2**chunk_shift`` bytes
from its start; chunk ``k`` of the tensor at index position ``i`` is sealed under the
file's random content key with nonce ``u32 i ‖ u64 k`` and AAD
``context ‖ u32 i ‖ u64 k ‖ u64 length``, where ``context`` is the SHA-256 of the
header, metadata, index and block head as stored (docs/FORMAT.md §3.2).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading

from .._crc import crc32
from ..crypto.digests import hasher
from . import block as blk

__all__ = ["SecurityOptions", "Sealer", "run_jobs", "nonce", "chunk_aad", "context_digest", "names_aad",
           "SPECIAL", "CONTEXT_CHUNK", "METADATA_CHUNK", "INDEX_CHUNK", "SIGNATURE_CONTEXT", "chunk_bounds"]

#: Tensor position of the nonces that seal no tensor chunk (above any tensor count).
SPECIAL = 0xFFFFFFFF
CONTEXT_CHUNK, METADATA_CHUNK, INDEX_CHUNK = 0, 1, 2
SIGNATURE_CONTEXT = b"aprfast apr2 signature\0"
_CONTEXT_PREFIX = b"aprfast apr2 context\0"
_NAMES_PREFIX = b"aprfast apr2 names\0"
KEY_SIZE = 32
#: Work below this many bytes is done on the calling thread.
PARALLEL_BYTES = 4 << 20


def run_jobs(fn, jobs: list, nbytes: int, threads: int = 0) -> list:
    """``[fn(job) for job in jobs]``, on aprfast's shared pool when there is enough work
    (the AEAD and the hashes release the GIL); inline when already on a pool thread,
    where waiting on the same pool could deadlock."""
    if nbytes < PARALLEL_BYTES or len(jobs) < 2 or threading.current_thread().name.startswith("aprfast-codec"):
        return [fn(job) for job in jobs]
    from ..codecs.blocks import worker_pool

    return list(worker_pool(threads).map(fn, jobs))


def nonce(i: int, k: int) -> bytes:
    return struct.pack("<IQ", i, k)


def chunk_aad(context: bytes, i: int, k: int, n: int) -> bytes:
    return context + struct.pack("<IQQ", i, k, n)


def context_digest(header, metadata, index, head) -> bytes:
    """SHA-256 binding every chunk to the file's header, metadata, index (names, dtypes,
    shapes, offsets, sizes) and block head (flags, chunk size, key block), as stored."""
    h = hashlib.sha256(_CONTEXT_PREFIX)
    for part in (header, metadata, index, head):
        h.update(part)
    return h.digest()


def names_aad(header, head) -> bytes:
    return _NAMES_PREFIX + bytes(header) + bytes(head)


def chunk_bounds(size: int, shift: int):
    """(k, start, stop) of every chunk of a ``size``-byte extent."""
    step = 1 << shift
    return [(k, start, min(start + step, size)) for k, start in enumerate(range(0, size, step))]


class SecurityOptions:
    """What a caller asked of a write: ``password`` or ``recipients`` (X25519 public
    keys), ``signing_key`` (Ed25519 seed), ``digest`` ("sha256", "blake3"; chunk digests
    without a signature when given alone), ``encrypt_names`` (metadata and index
    sealed too), ``chunk_shift`` (log2 of the chunk size, 20 = 1 MiB)."""

    def __init__(self, *, password=None, recipients=None, signing_key=None, digest=None, encrypt_names=False,
                 chunk_shift: int = blk.DEFAULT_CHUNK_SHIFT):
        if password is not None and recipients is not None:
            raise ValueError("give password= or recipients=, not both")
        if recipients is not None:
            if isinstance(recipients, (bytes, bytearray, memoryview, str)):
                raise TypeError("recipients must be a list of 32-byte X25519 public keys")
            recipients = [bytes(r) for r in recipients]
            if not recipients:
                raise ValueError("recipients= is empty: nobody could decrypt the file")
        if encrypt_names and password is None and recipients is None:
            raise ValueError("encrypt_names=True needs password= or recipients=")
        if not blk.MIN_CHUNK_SHIFT <= chunk_shift <= blk.MAX_CHUNK_SHIFT:
            raise ValueError(f"chunk_shift must be {blk.MIN_CHUNK_SHIFT}..{blk.MAX_CHUNK_SHIFT}")
        self.password, self.recipients = password, recipients
        from ..crypto import core as crypto  # imported when used: `import aprfast` stays light

        self.signing_key = bytes(signing_key) if signing_key is not None else None
        self.signer = bytes(crypto.public_key_of(self.signing_key)) if self.signing_key is not None else None
        from ..crypto.digests import digest_id

        self.digest_id = digest_id(digest or "sha256") if (digest or signing_key is not None) else 0
        self.chunk_shift = chunk_shift
        self.flags = ((blk.SEALED if self.encrypted else 0) | (blk.DIGESTS if self.digest_id else 0)
                      | (blk.NAMES_SEALED if encrypt_names else 0) | (blk.SIGNED if self.signing_key else 0))

    @classmethod
    def from_keywords(cls, password=None, recipients=None, signing_key=None, digest=None, encrypt_names=False):
        """None when nothing was asked (the file is written as without this package)."""
        if password is None and recipients is None and signing_key is None and digest is None:
            if encrypt_names:
                raise ValueError("encrypt_names=True needs password= or recipients=")
            return None
        return cls(password=password, recipients=recipients, signing_key=signing_key, digest=digest,
                   encrypt_names=encrypt_names)

    @property
    def encrypted(self) -> bool:
        return self.password is not None or self.recipients is not None

    def sealer(self, ordered) -> "Sealer":
        return Sealer(self, ordered)


def _key_block(key: bytearray, options: SecurityOptions) -> bytes:
    """The content key sealed as v1 seals a payload (FORMAT §10): password blob,
    single-recipient blob, or multi-recipient blob."""
    from ..crypto import core as crypto

    if options.password is not None:
        return bytes(crypto.encrypt_with_password(key, options.password))
    if len(options.recipients) == 1:
        return bytes(crypto.encrypt_for_recipient(key, options.recipients[0]))
    return bytes(crypto.encrypt_for_recipients(key, options.recipients))


class Sealer:
    """One write: made from the tensors in index order before the layout is fixed (the
    block's size depends only on their stored sizes), finished once the header,
    metadata and index bytes are known."""

    def __init__(self, options: SecurityOptions, ordered):
        self.options = options
        self.items = list(ordered)
        self.sizes = [int(item.nbytes) for item in self.items]
        shift = options.chunk_shift
        self.counts = [-(-size >> shift) if size else 0 for size in self.sizes]
        self.chunk_count = sum(self.counts)
        self._key = bytearray(os.urandom(KEY_SIZE)) if options.encrypted else None
        self.key_block = _key_block(self._key, options) if options.encrypted else b""
        self.size = blk.block_size(options.flags, len(self.key_block), self.chunk_count)

    @property
    def header_flags(self) -> tuple:
        """(ENCRYPTED, SIGNED) as the APR2 header must say."""
        return bool(self.options.flags & blk.SEALED), bool(self.options.flags & blk.SIGNED)

    def finish(self, header: bytes, metadata: bytes, index: bytes, *, threads: int = 0):
        """(metadata as stored, index as stored, the block, the data items to write)."""
        from ..crypto import core as crypto
        from ..crypto.aead import ChunkCipher

        opts, flags = self.options, self.options.flags
        head = blk.encode_fixed(flags, opts.digest_id, opts.chunk_shift, len(self.key_block), self.size,
                                self.chunk_count) + self.key_block
        cipher = ChunkCipher(bytes(self._key)) if self._key is not None else None
        names_tags = b""
        if flags & blk.NAMES_SEALED:
            metadata, meta_tag = _sealed_copy(cipher, metadata, nonce(SPECIAL, METADATA_CHUNK), names_aad(header, head))
            index, index_tag = _sealed_copy(cipher, index, nonce(SPECIAL, INDEX_CHUNK), names_aad(header, head))
            names_tags = meta_tag + index_tag
        context = context_digest(header, metadata, index, head)
        context_tag = b""
        if cipher is not None:
            context_tag = cipher.seal(b"", bytearray(0), nonce(SPECIAL, CONTEXT_CHUNK), context)
        items, records = self._seal_data(cipher, context, threads)
        body = head + context_tag + names_tags + records
        if flags & blk.SIGNED:
            signature = crypto.sign([SIGNATURE_CONTEXT, header, metadata, index, body], opts.signing_key)
            body += bytes(signature) + opts.signer
        body += struct.pack("<I", crc32(body, crc32(index, crc32(metadata, crc32(header)))))
        if self._key is not None:
            self._key[:] = bytes(len(self._key))  # the cipher's expanded key goes with it
        assert len(body) == self.size
        return bytes(metadata), bytes(index), body, items

    def _seal_data(self, cipher, context: bytes, threads: int):
        """Each tensor's stored bytes sealed chunk by chunk (a new buffer; the caller's
        arrays are never written), and every chunk's record (tag, digest)."""
        opts = self.options
        digest = hasher(opts.digest_id) if opts.digest_id else None
        shift = opts.chunk_shift
        jobs, outputs = [], []
        for i, item in enumerate(self.items):
            data = memoryview(item.data).cast("B") if item.nbytes else memoryview(b"")
            out = bytearray(item.nbytes) if cipher is not None else data
            outputs.append(out)
            for k, start, stop in chunk_bounds(item.nbytes, shift):
                jobs.append((i, k, data[start:stop], memoryview(out)[start:stop] if cipher else data[start:stop]))

        def one(job):
            i, k, src, dst = job
            tag = cipher.seal(src, dst, nonce(i, k), chunk_aad(context, i, k, len(src))) if cipher else b""
            return tag + (digest(dst) if digest else b"")

        records = run_jobs(one, jobs, sum(self.sizes), threads)
        items = [item if cipher is None else _Sealed(item, out) for item, out in zip(self.items, outputs)]
        return items, b"".join(records)


def _sealed_copy(cipher, plain: bytes, nonce_: bytes, aad: bytes):
    out = bytearray(len(plain))
    tag = cipher.seal(plain, out, nonce_, aad)
    return bytes(out), tag


class _Sealed:
    """A writer item whose bytes are ciphertext (index fields unchanged)."""

    __slots__ = ("name", "dtype", "shape", "data", "nbytes", "raw_size", "flags")

    def __init__(self, item, data):
        self.name, self.dtype, self.shape = item.name, item.dtype, item.shape
        self.data, self.nbytes = data, len(data)
        self.raw_size, self.flags = getattr(item, "raw_size", 0), getattr(item, "flags", 0)
