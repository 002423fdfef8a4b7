"""Reading a sealed and/or signed APR2 file: what open checks (block CRC, signature,
key, context tag, sealed names) and :class:`Security`, which turns a tensor's stored
chunks into its bytes, checking each chunk's digest and tag as it goes."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .._crc import crc32
from ..crypto.digests import digest_name, hasher
from ..errors import ChecksumError, CorruptError, DecryptError, SignatureError
from ..io.sources import BufferSource, Source
from . import block as blk
from .sealing import (
    CONTEXT_CHUNK,
    INDEX_CHUNK,
    KEY_SIZE,
    METADATA_CHUNK,
    SIGNATURE_CONTEXT,
    SPECIAL,
    chunk_aad,
    context_digest,
    names_aad,
    nonce,
    run_jobs,
)

__all__ = ["open_security", "refuse_keys", "Security", "SecureSource", "ENCRYPTED", "SIGNED"]

ENCRYPTED, SIGNED = 0x10, 0x20  # the APR2 header's flags
TRUSTED, SELF_SIGNED, UNSIGNED = "trusted", "self-signed", "unsigned"
#: Decrypted chunks kept for reads that cover part of a chunk (compressed tensors' tables
#: and blocks, slices), so neighbouring small reads decrypt a chunk once.
_CACHED_CHUNKS = 8


def _required(keys) -> bool:
    require = keys.get("require_signature")
    return bool(require) or (require is None and keys.get("trusted_keys") is not None)


def _has_key(keys) -> bool:
    return keys.get("password") is not None or keys.get("private_key") is not None


def refuse_keys(keys: dict, path) -> None:
    """A file that is neither encrypted nor signed: a caller who expects either must not
    get plaintext or unverified tensors back silently."""
    if _has_key(keys) and not keys.get("allow_unencrypted"):
        raise DecryptError("a key was given but this v2 file is not encrypted; pass allow_unencrypted=True "
                           "to read it anyway", path=path)
    if _required(keys):
        raise SignatureError("a signature is required but this v2 file is not signed", path=path)


def open_security(source, fields, limits, keys: dict, path):
    """The file's :class:`Security`, or None for a file that is neither encrypted nor
    signed (keys then refused as :func:`refuse_keys` says).  Checks, in order: the
    block's place and size, header flags against block flags, the block CRC (E004),
    the signature (E006), the content key (E005), the context tag (E005), the sealed
    metadata and index (E005)."""
    _, _, _, flags, meta_off, meta_size, index_off, index_size, data_off = fields
    at, room = index_off + index_size, data_off - index_off - index_size
    if not flags & (ENCRYPTED | SIGNED):
        # a block is found by its magic (padding is zeros); an unsigned digest manifest
        # sets no header flag, a sealed or signed block must have its flag
        if room < blk.FIXED_SIZE or bytes(source.read(at, 4, "padding after the index")) != blk.MAGIC:
            refuse_keys(keys, path)
            return None
        if bytes(source.read(at, blk.FIXED_SIZE, "security block"))[5] & (blk.SEALED | blk.SIGNED):
            raise CorruptError("a security block follows the index but the header's ENCRYPTED and SIGNED flags "
                               f"are clear (flags {flags:#x}): cleared by someone?", path=path)
    if room < blk.FIXED_SIZE:
        raise CorruptError(f"the header's flags {flags:#x} say ENCRYPTED or SIGNED but only {room} bytes lie between "
                           "the index and the data, too few for a security block", path=path)
    fixed = source.read(at, blk.FIXED_SIZE, "security block")
    total = blk.parse_fixed(fixed, room, limits.max_index_size, path)[4]
    block = blk.parse(bytes(source.read(at, total, "security block")), path)
    sealed, signed = bool(block.flags & blk.SEALED), bool(block.flags & blk.SIGNED)
    if sealed != bool(flags & ENCRYPTED) or signed != bool(flags & SIGNED):
        raise CorruptError(f"the header's flags {flags:#x} and the security block's {block.flags:#x} disagree on "
                           "ENCRYPTED (SEALED) or SIGNED", path=path)
    header = bytes(source.read(0, 32, "header"))
    metadata = source.read(meta_off, meta_size, "metadata")
    index = source.read(index_off, index_size, "index")
    actual = crc32(block.raw[:-blk.CRC_SIZE], crc32(index, crc32(metadata, crc32(header))))
    if actual != block.crc:
        raise ChecksumError(f"security block CRC32 is {block.crc:#010x} but header, metadata, index and block give "
                            f"{actual:#010x}", path=path)
    signature, signer = _check_signature(block, header, metadata, index, keys, path)
    security = Security(block, path)
    security.signature, security.signer = signature, signer
    security.digest = hasher(block.digest_id, path) if block.flags & blk.DIGESTS else None
    context = context_digest(header, metadata, index, block.head)
    if block.flags & blk.SEALED:
        cipher, security.encryption = _content_cipher(block, keys, path)
        if cipher is not None:
            if not cipher.open(b"", bytearray(0), block.context_tag, nonce(SPECIAL, CONTEXT_CHUNK), context):
                raise DecryptError("the content key opened but the header, metadata, index or security block do not "
                                   "authenticate (altered, or taken from another file)", path=path)
            security.cipher = cipher
            if block.flags & blk.NAMES_SEALED:
                security.names_source = _names_source(cipher, block, header, metadata, index, fields, path)
        elif block.flags & blk.NAMES_SEALED:
            raise DecryptError("the file's metadata and tensor names are encrypted: pass password= or private_key= "
                               "to list them", path=path)
    elif _has_key(keys) and not keys.get("allow_unencrypted"):
        raise DecryptError("a key was given but this v2 file is not encrypted (it is only signed); pass "
                           "allow_unencrypted=True to read it anyway", path=path)
    security.context = context
    return security


def _check_signature(block, header, metadata, index, keys, path):
    if not block.flags & blk.SIGNED:
        if _required(keys):
            raise SignatureError("the file is not signed but a signature is required", path=path)
        return UNSIGNED, None
    from ..crypto import core as crypto

    signer = bytes(block.signer)
    trusted = keys.get("trusted_keys")
    if trusted is not None and signer not in {bytes(k) for k in trusted}:
        raise SignatureError(f"signed by key {signer.hex()}, which is not among the {len(trusted)} trusted key(s)",
                             path=path)
    try:
        crypto.verify([SIGNATURE_CONTEXT, header, metadata, index, block.raw[:block.signed_end]], block.signature,
                      signer)
    except SignatureError as exc:
        raise SignatureError(f"the security block's signature does not verify: {exc.message}", path=path) from None
    return (TRUSTED if trusted is not None else SELF_SIGNED), signer


def _content_cipher(block, keys, path):
    """(ChunkCipher, mode) from the key block; (None, mode) when the caller gave no key
    and may list the file anyway (``keys["listing"]``, aprfast.inspect)."""
    from ..crypto import core as crypto
    from ..crypto.aead import ChunkCipher

    password, private_key = keys.get("password"), keys.get("private_key")
    stored = block.key_block
    try:
        if password is not None:
            key, mode = crypto.decrypt_with_password(stored, password), "password"
        elif private_key is not None:
            if crypto.is_multi_recipient(stored):
                key, mode = crypto.decrypt_multi_recipient(stored, private_key), "multi-recipient"
            else:
                key, mode = crypto.decrypt_as_recipient(stored, private_key), "recipient"
        elif keys.get("listing"):
            return None, "sealed"
        else:
            raise DecryptError("the file is encrypted: pass password= or private_key=")
    except DecryptError as exc:
        raise DecryptError(exc.message, path=path) from None
    if len(key) != KEY_SIZE:
        raise CorruptError(f"the key block holds a {len(key)}-byte key, not {KEY_SIZE}", path=path)
    try:
        return ChunkCipher(bytes(key)), mode
    finally:
        key[:] = bytes(len(key))


def _names_source(cipher, block, header, metadata, index, fields, path) -> BufferSource:
    """The file's first bytes with the sealed metadata and index in plaintext, for the
    index parser and the metadata decoder (nothing else reads it)."""
    _, _, _, _, meta_off, meta_size, index_off, index_size, _ = fields
    aad = names_aad(header, block.head)
    plain = bytearray(index_off + index_size)
    plain[:32] = header
    for off, size, stored, tag, k, what in ((meta_off, meta_size, metadata, block.metadata_tag, METADATA_CHUNK,
                                            "metadata"), (index_off, index_size, index, block.index_tag,
                                                          INDEX_CHUNK, "tensor index")):
        target = memoryview(plain)[off:off + size]
        if not cipher.open(stored, target, tag, nonce(SPECIAL, k), aad):
            raise DecryptError(f"the encrypted {what} does not authenticate (altered, or from another file)",
                               path=path)
    return BufferSource(plain, path)


class Security:
    """One open secured file: chunk records bound to the index, and the checks each
    chunk passes before its bytes are used (digest, then AES-GCM tag)."""

    def __init__(self, block: blk.Block, path):
        self.block = block
        self.path = path
        self.cipher = None
        self.digest = None
        self.names_source = None
        self.encryption = "none"
        self.signature, self.signer = UNSIGNED, None
        self.context = b""
        self._cache = OrderedDict()
        self._lock = threading.Lock()

    @property
    def sealed(self) -> bool:
        return bool(self.block.flags & blk.SEALED)

    @property
    def digest_name(self) -> str:
        return digest_name(self.block.digest_id) if self.block.digest_id else "none"

    def describe(self) -> dict:
        b = self.block
        return {"encrypted": self.sealed, "names_encrypted": bool(b.flags & blk.NAMES_SEALED),
                "signed": bool(b.flags & blk.SIGNED), "digest": self.digest_name, "chunk_size": b.chunk_size,
                "chunk_count": b.chunk_count, "encryption": self.encryption, "signature": self.signature,
                "signer": self.signer.hex() if self.signer else None}

    def bind(self, entries, data_start: int) -> None:
        """Tie the chunk records to the parsed index: every tensor's chunks counted
        (they must add up to the block's count), extents sorted for offset lookups;
        extents shared by two names are refused (each name seals its own copy)."""
        offsets, sizes = entries.extents()
        offsets, sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
        shift = self.block.chunk_shift
        counts = (sizes + (1 << shift) - 1) >> shift
        total = int(counts.sum()) if len(counts) else 0
        if total != self.block.chunk_count:
            raise CorruptError(f"the index's tensors make {total} chunks of {1 << shift} bytes but the security block "
                               f"has {self.block.chunk_count} chunk records", path=self.path)
        self.first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64) if len(counts) else counts
        self.counts, self.sizes = counts, sizes
        filled = np.flatnonzero(sizes > 0)
        order = filled[np.argsort(offsets[filled], kind="stable")]
        self.order = order
        self.starts = offsets[order] + data_start
        self.ends = self.starts + sizes[order]
        if len(order) > 1 and not bool(np.all(self.starts[1:] >= self.ends[:-1])):
            raise CorruptError("two tensors of an encrypted or signed file share bytes; each name must have its own "
                               "extent", path=self.path)
        self.data_start = data_start
        self._names = entries

    def _name(self, i: int) -> str:
        try:
            return self._names.name(i)
        except Exception:  # pragma: no cover - the index was validated
            return f"#{i}"

    # --- checking chunks ------------------------------------------------------------------
    def check_chunk(self, i: int, k: int, view) -> None:
        """Chunk ``k`` of tensor ``i`` (its stored bytes in the writable ``view``):
        digest checked, then decrypted in place.  Raises naming the tensor and chunk."""
        record = int(self.first[i]) + k
        if self.digest is not None and self.digest(view) != self.block.digest(record):
            error = SignatureError if self.block.flags & blk.SIGNED else ChecksumError
            raise error(f"tensor {self._name(i)!r}: chunk {k} of {int(self.counts[i])} does not match its "
                        f"{self.digest_name} digest in the {'signed ' if error is SignatureError else ''}manifest",
                        path=self.path)
        if self.sealed:
            if self.cipher is None:
                raise DecryptError("the file is encrypted: pass password= or private_key= to read tensors",
                                   path=self.path)
            if not self.cipher.open(view, view, self.block.tag(record), nonce(i, k),
                                    chunk_aad(self.context, i, k, len(view))):
                raise DecryptError(f"tensor {self._name(i)!r}: chunk {k} of {int(self.counts[i])} fails AES-256-GCM "
                                   "authentication (altered, swapped, truncated or from another file)", path=self.path)

    def unseal_extent(self, i: int, view, threads: int = 0) -> None:
        """A whole stored extent of tensor ``i`` (writable, exactly its size), checked
        and decrypted in place, chunks in parallel when large."""
        self._check_many([(i, k, view[s:e]) for k, s, e in self._bounds(i, 0, len(view))], len(view), threads)

    def _bounds(self, i, lo, hi):
        step = 1 << self.block.chunk_shift
        size = int(self.sizes[i])
        return [(k, k * step, min((k + 1) * step, size)) for k in range(lo // step, -(-hi // step))]

    def _check_many(self, jobs, nbytes: int, threads: int) -> None:
        run_jobs(lambda job: self.check_chunk(*job), jobs, nbytes, threads)

    def plaintext_over(self, inner, offset: int, out, threads: int = 0) -> None:
        """``out`` holds the stored bytes ``[offset, offset + len(out))``: replace those of
        every tensor chunk with its checked plaintext.  Chunks wholly inside are done in
        place; a chunk cut by the range is read whole from ``inner`` (and kept)."""
        end = offset + len(out)
        full, partial, nbytes = [], [], 0
        j = int(np.searchsorted(self.ends, offset, side="right"))
        while j < len(self.starts) and self.starts[j] < end:
            i, start = int(self.order[j]), int(self.starts[j])
            lo, hi = max(offset, start) - start, min(end, int(self.ends[j])) - start
            for k, s, e in self._bounds(i, lo, hi):
                if s >= lo and e <= hi:
                    full.append((i, k, out[start + s - offset:start + e - offset]))
                    nbytes += e - s
                else:
                    partial.append((i, k, start, s, e, lo, hi))
            j += 1
        self._check_many(full, nbytes, threads)
        for i, k, start, s, e, lo, hi in partial:
            plain = self._cached_chunk(inner, i, k, start + s, e - s)
            a, b = max(s, lo), min(e, hi)
            out[start + a - offset:start + b - offset] = plain[a - s:b - s]

    def fill(self, inner, offset: int, out, threads: int = 0) -> None:
        """``out`` = the checked plaintext of ``[offset, offset + len(out))``, read from
        ``inner`` with no byte twice: whole chunks straight into ``out`` (one read per
        run) and checked there, cut chunks through the cache, other bytes as stored."""
        end, pos = offset + len(out), offset
        full, nbytes = [], 0

        def stored(a, b):  # bytes outside any tensor chunk: as stored
            if b > a:
                inner.readinto(a, out[a - offset:b - offset], threads=threads)

        j = int(np.searchsorted(self.ends, offset, side="right"))
        while j < len(self.starts) and self.starts[j] < end:
            i, start = int(self.order[j]), int(self.starts[j])
            lo, hi = max(offset, start) - start, min(end, int(self.ends[j])) - start
            stored(pos, start + lo)
            run = None  # [a, b) of whole chunks not yet read
            for k, s, e in self._bounds(i, lo, hi):
                if s >= lo and e <= hi:
                    run = (run[0] if run else start + s, start + e)
                    full.append((i, k, out[start + s - offset:start + e - offset]))
                    nbytes += e - s
                    continue
                if run:
                    stored(*run)
                    run = None
                plain = self._cached_chunk(inner, i, k, start + s, e - s)
                a, b = max(s, lo), min(e, hi)
                out[start + a - offset:start + b - offset] = plain[a - s:b - s]
            if run:
                stored(*run)
            pos = start + hi
            j += 1
        stored(pos, end)
        self._check_many(full, nbytes, threads)

    def pieces(self, offset: int, end: int, size: int = 8 << 20):
        """``[offset, end)`` cut into pieces of about ``size`` bytes that never cut a
        chunk the range holds whole (pieces end at chunk or extent boundaries)."""
        step = 1 << self.block.chunk_shift
        size = max(step, size // step * step)
        pos = offset
        j = int(np.searchsorted(self.ends, offset, side="right"))
        while j < len(self.starts) and self.starts[j] < end:
            start, stop = int(self.starts[j]), min(int(self.ends[j]), end)
            at = max(pos, start)
            if at > pos:
                yield pos, at
            cut = start + (at - start) // size * size + size  # the next piece boundary inside the extent
            while cut < stop:
                yield at, cut
                at, cut = cut, cut + size
            yield at, stop
            pos = stop
            j += 1
        if pos < end:
            yield pos, end

    def _cached_chunk(self, inner, i, k, at, n) -> memoryview:
        with self._lock:
            found = self._cache.get((i, k))
            if found is not None:
                self._cache.move_to_end((i, k))
                return found
        buf = memoryview(bytearray(n))
        inner.readinto(at, buf)
        self.check_chunk(i, k, buf)
        buf = buf.toreadonly()
        with self._lock:
            self._cache[(i, k)] = buf
            while len(self._cache) > _CACHED_CHUNKS:
                self._cache.popitem(last=False)
        return buf

    def verify_all(self, inner, *, piece: int = 16 << 20) -> None:
        """Every chunk of every tensor read and checked (digest and tag), in file order,
        through one bounded buffer."""
        step = 1 << self.block.chunk_shift
        piece = max(step, piece // step * step)
        scratch = memoryview(bytearray(min(piece, int(self.sizes.max()) if len(self.sizes) else 0)))
        for j in range(len(self.starts)):
            start, end = int(self.starts[j]), int(self.ends[j])
            for at in range(start, end, piece):
                n = min(piece, end - at)
                inner.readinto(at, scratch[:n])
                self.plaintext_over(inner, at, scratch[:n])


class SecureSource(Source):
    """A source whose tensor bytes come out checked and decrypted: what an AprFile over a
    secured file reads through.  Never zero-copy (a decrypted or hash-checked tensor is
    an owned array: checked in the buffer it is served from, so the file cannot change
    between the check and the use).  Bytes outside tensors (header, index, padding) are
    the stored ones, so CRCs over them stay the file's."""

    zero_copy = False

    def __init__(self, inner: Source, security: Security):
        super().__init__(inner.size)
        self.path = inner.path
        self.inner = inner
        self.security = security

    def _read(self, offset, n):
        out = bytearray(n)
        self._readinto(offset, memoryview(out), 1, None)
        return out

    def _readinto(self, offset, out, threads, crc):
        if offset + len(out) <= self.security.data_start:
            return self.inner.readinto(offset, out, threads=threads, crc=crc)
        if crc is None:  # only what the range needs, each byte read once
            self.security.fill(self.inner, offset, out, threads)
            return None
        # a CRC is over the stored bytes: read them piece by piece (CRC on the way) and
        # decrypt each piece while it is still in cache
        end = offset + len(out)
        for a, b in self.security.pieces(offset, end):
            crc = self.inner.readinto(a, out[a - offset:b - offset], threads=threads, crc=crc)
            self.security.plaintext_over(self.inner, a, out[a - offset:b - offset], threads)
        return crc

    def _free(self):
        self.inner.close()

