"""Writing v1 files: :func:`save_model` (plain, compressed, encrypted, signed, licensed
payloads; the STREAMING chunk index; TRUENO_NATIVE tensors)."""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Mapping

from .._crc import crc32
from ..codecs import payload as codecs
from ..codecs.payload import MAX_UNCOMPRESSED_SIZE, Compression
from ..errors import AprError, AprIOError, LayoutError
from ..files.writer import save_to
from ..io import platform as _platform
from ..layouts import chunk_index, trueno
from ..layouts import plan as plan_layout
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header, ModelType
from ..tensors import as_inputs
from .checks import (
    CHUNKED_PAYLOAD_FORMAT,
    DEFAULT_APRENDER_VERSION,
    FILE_KEY_SIZE,
    PAYLOAD_FORMAT_KEY,
    TENSOR_ALIGNMENT,
    TENSOR_PAYLOAD_FORMAT,
    TRUENO_PAYLOAD_FORMAT,
    tag_size,
)


# --- saving --------------------------------------------------------------------------
def save_model(payload, path=None, *, model_type=None, metadata=None, compression="none", quality_score=None,
               password=None, recipient=None, recipients=None, signing_key=None, license=None,
               durable: bool = True, streaming: bool = False, chunk_size: int | None = None,
               trueno_native: bool = False, backend_hint=None):
    """Write a v1 file; return its bytes when ``path`` is None.

    ``payload`` is bytes-like (stored as given: aprender stores bincode) or a mapping
    of name -> array (stored as a v2 tensor container, see ``TENSOR_PAYLOAD_FORMAT``;
    ``model_type`` then defaults to NeuralCustom).  ``metadata`` is a dict shaped like
    aprender's ``Metadata`` (``created_at`` and ``aprender_version`` default to now
    and to aprfast's version; pin both for reproducible bytes).  ``compression`` is
    "none", "zstd", "zstd-max", "lz4" or an id 0-3.  ``quality_score`` 0 is refused,
    as aprender's Jidoka gate refuses it; None writes 0 ("not validated").

    At most one of ``password``, ``recipient`` (X25519 public key) or ``recipients``
    (a list of them) encrypts the payload after compression.  ``signing_key`` (a
    32-byte Ed25519 seed) signs header || metadata || stored payload (after
    encryption).  ``license`` (an aprfast.v1.licensing.License) adds aprender's
    ``license`` metadata entry, the binary license block and the LICENSED flag.
    A path is written atomically; ``path`` may also be a writable file object.

    ``streaming=True`` (tensors only) sets STREAMING and stores each tensor as chunks
    of at most ``chunk_size`` raw bytes (default 16 MiB), each compressed and (when
    encrypted) sealed on its own behind a chunk index, so a reader decodes only the
    tensors it is asked for.  ``trueno_native=True`` (tensors only; no compression or
    encryption, seed 000 §9.9) sets TRUENO_NATIVE and stores the §9.2 tensor index and
    64-byte-aligned tensors; ``backend_hint`` is a §9.3 name or id ("auto", "scalar",
    "sse2", "avx", "avx2", "avx512", "neon", "wasm-simd", "gpu"), or a dict name -> hint.
    docs/FORMAT.md has both layouts (§12, §13); docs/guide/older-files.md shows them in use.

    Args:
        payload: Bytes-like (stored as given) or a mapping of name -> array.
        path: A file path or a writable file object; ``None`` returns the bytes.
        model_type: A :class:`ModelType`, its id or aprender's variant name (required
            for a bytes payload; NeuralCustom by default for tensors).
        metadata: aprender's ``Metadata`` fields as a dict (``custom`` a dict too).
        compression: "none", "zstd", "zstd-max", "lz4", a :class:`Compression` or 0-3.
        quality_score: 1-255, or ``None`` for 0 ("not validated").
        password: Encrypt under this password (Argon2id, AES-256-GCM).
        recipient: Encrypt for this X25519 public key (32 bytes).
        recipients: Encrypt for each of these X25519 public keys.
        signing_key: Sign with this Ed25519 seed (32 bytes).
        license: An :class:`aprfast.v1.licensing.License` to embed.
        durable: fsync the file and its directory before returning.
        streaming: Store tensors as chunks behind a chunk index (STREAMING).
        chunk_size: Raw bytes per chunk of a streaming file.
        trueno_native: Store tensors with the trueno index (TRUENO_NATIVE).
        backend_hint: The §9.3 backend hint of every tensor, or a dict name -> hint.

    Returns:
        The file's bytes when ``path`` is ``None``, else ``None``.

    Raises:
        LayoutError: Something the v1 container cannot hold or that contradicts itself:
            ``quality_score`` 0 or out of range, a payload over 1 GiB, a ``custom``
            entry that is not a dict or contradicts the payload, compression or
            encryption with ``trueno_native``.
        MissingDependencyError: zstd/lz4 or the crypto packages are not installed.
        AprIOError: The operating system refused the write; the path is left as it was.
        TypeError: A bytes payload without ``model_type``, or a payload of another type.
        ValueError: More than one encryption mode, an unknown compression or model type
            name, or a key that is not 32 bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> blob = v1.save_model(b"bincode bytes", model_type="LinearRegression",
        ...                      metadata={"created_at": "0"})
        >>> blob[:4], len(blob)
        (b'APRN', 94)
        >>> v1.save_model({"w": np.arange(4, dtype=np.float32)}, "model.apr", compression="zstd")
        >>> v1.load_model("model.apr").payload["w"].tolist()
        [0.0, 1.0, 2.0, 3.0]
        >>> v1.save_model(b"x", model_type="Custom", quality_score=0)
        Traceback (most recent call last):
        ...
        aprfast.errors.LayoutError: [E001] Jidoka: refusing to save a model with quality_score=0 ...
    """
    if streaming or trueno_native or chunk_size is not None or backend_hint is not None:
        return _save_indexed(payload, path, model_type=model_type, metadata=metadata, compression=compression,
                             quality_score=quality_score, password=password, recipient=recipient,
                             recipients=recipients, signing_key=signing_key, license=license, durable=durable,
                             streaming=streaming, chunk_size=chunk_size, trueno_native=trueno_native,
                             backend_hint=backend_hint)
    # Everything that can be refused is checked before the expensive steps (compression,
    # Argon2, encryption), so a bad argument fails fast and nothing is half-done.
    plain, metadata, model_type, is_tensors = _payload_and_metadata(payload, metadata, model_type)
    if recipients is not None and not isinstance(recipients, (str, bytes, bytearray, memoryview)):
        recipients = list(recipients)  # an iterator would be spent by the first look
    score = _quality_byte(quality_score)
    compression = Compression.from_value(compression)
    encryption = _encryption_mode(password, recipient, recipients)
    public_key = _public_key(signing_key)
    license_block = _apply_license(metadata, license)
    align = TENSOR_ALIGNMENT if is_tensors and compression is Compression.NONE and encryption is None else 0
    metadata_block = layout.encode_metadata(metadata, license_block=license_block, align_end_to=align)

    # Uncompressed, the caller's buffer is stored as it is: codecs.compress would copy
    # a bytearray, memoryview or array into new bytes (the whole payload, for nothing).
    stored = plain if compression is Compression.NONE else codecs.compress(plain, compression)
    flags = Flag(0)
    if encryption is not None:
        flags |= Flag.ENCRYPTED
    if public_key is not None:
        flags |= Flag.SIGNED
    if metadata.get("license") is not None:
        flags |= Flag.LICENSED  # as aprender's save: set iff a license is present
    if encryption is not None:
        with _sealing(encryption, password, recipient, recipients) as sealing:
            if public_key is None and isinstance(path, (str, os.PathLike)):
                # Sealed straight into the file: no buffer the size of the payload
                # (a signature needs the sealed bytes twice, so it takes the path below).
                header = Header(model_type, len(metadata_block), sealing.size(len(stored)), len(plain),
                                compression, flags, score)
                return _emit_sealed(header, metadata_block, sealing, stored, path, durable)
            stored = sealing.seal(stored)
    header = Header(model_type, len(metadata_block), len(stored), len(plain), compression, flags, score)
    signature_block = None
    if public_key is not None:
        signature_block = _sign(header, metadata_block, stored, signing_key) + public_key
    parts = layout.assemble(header, metadata_block, stored, signature_block)
    return _emit(parts, path, durable)


def _tensor_file_bytes(tensors: Mapping) -> bytes:
    """The v2 file ``aprfast.save(tensors)`` gives (layout "auto"), built from the layers
    below the API: the plan, then the writer into memory."""
    out = io.BytesIO()
    save_to(out, plan_layout(as_inputs(tensors), None, layout="auto"))
    return out.getvalue()


def _payload_and_metadata(payload, metadata, model_type):
    """The bytes to store, the metadata dict (defaults filled, a copy) and the type."""
    metadata = dict(metadata or {})
    metadata.setdefault("created_at", str(int(time.time())))
    metadata.setdefault("aprender_version", DEFAULT_APRENDER_VERSION)
    custom = metadata.get("custom") or {}
    if not isinstance(custom, Mapping):
        raise LayoutError(f"metadata 'custom' must be a map of str -> JSON value, not {type(custom).__name__}")
    if isinstance(payload, Mapping):
        if custom.get(PAYLOAD_FORMAT_KEY, TENSOR_PAYLOAD_FORMAT) != TENSOR_PAYLOAD_FORMAT:
            raise LayoutError(f"metadata custom[{PAYLOAD_FORMAT_KEY!r}] = {custom[PAYLOAD_FORMAT_KEY]!r} "
                              "contradicts a tensor payload")
        # aprender's layout whenever it can hold the tensors, so aprender can read the
        # payload too once it has it; the spec's APR2 layout otherwise.
        plain = _tensor_file_bytes(payload)
        metadata["custom"] = {**custom, PAYLOAD_FORMAT_KEY: TENSOR_PAYLOAD_FORMAT}
        model_type = ModelType.NeuralCustom if model_type is None else model_type
        is_tensors = True
    else:
        try:
            plain = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
        except TypeError:
            raise TypeError(f"payload must be bytes-like or a mapping of name -> array, not "
                            f"{type(payload).__name__}") from None
        if custom.get(PAYLOAD_FORMAT_KEY) == TENSOR_PAYLOAD_FORMAT:
            raise LayoutError(f"custom[{PAYLOAD_FORMAT_KEY!r}] marks tensor payloads; pass the tensors as a dict")
        if model_type is None:
            raise TypeError("save_model() needs model_type= for a bytes payload")
        is_tensors = False
    if len(plain) > MAX_UNCOMPRESSED_SIZE:
        raise LayoutError(f"the payload is {len(plain)} bytes; aprender's v1 reader refuses payloads above "
                          f"{MAX_UNCOMPRESSED_SIZE} bytes (1 GiB), and the v1 header could not say more")
    return plain, metadata, ModelType.from_value(model_type), is_tensors


def _quality_byte(quality_score) -> int:
    if quality_score is None:
        return 0
    if isinstance(quality_score, bool) or not isinstance(quality_score, int) or not 0 <= quality_score <= 255:
        raise LayoutError(f"quality_score is a u8 (1-255, or None); {quality_score!r} is not")
    if quality_score == 0:
        raise LayoutError("Jidoka: refusing to save a model with quality_score=0 (validation failed); fix the "
                          "validation errors or pass None to skip validation")
    return quality_score


def _encryption_mode(password, recipient, recipients):
    """"password", "recipient", "recipients" or None; at most one may be given."""
    chosen = [name for name, value in (("password", password), ("recipient", recipient),
                                       ("recipients", recipients)) if value is not None]
    if len(chosen) > 1:
        raise ValueError(f"choose one encryption mode, not {' and '.join(chosen)}")
    if chosen == ["recipients"] and isinstance(recipients, list) and not recipients:
        raise ValueError("recipients= is empty: nobody could decrypt the file")
    return chosen[0] if chosen else None


def _encrypt(stored, mode, password, recipient, recipients):
    with _sealing(mode, password, recipient, recipients) as sealing:
        return sealing.seal(stored)


def _sealing(mode, password, recipient, recipients):
    """The crypto.Sealing of an encryption mode (Argon2id or the key agreement runs now)."""
    from ..crypto import core as crypto

    if mode == "password":
        return crypto.password_sealing(password)
    if mode == "recipient":
        return crypto.recipient_sealing(recipient)
    return crypto.recipients_sealing(recipients)


def _public_key(signing_key):
    """The Ed25519 public key of ``signing_key`` (checked now, before any heavy work)."""
    if signing_key is None:
        return None
    from ..crypto import core as crypto

    return bytes(crypto.public_key_of(signing_key))


def _apply_license(metadata: dict, license):
    """Put aprender's ``license`` entry into ``metadata``; return the binary block.

    The entry defaults to ``licensing.to_aprender_entry(license)`` (tier Enterprise);
    a caller who wants another tier or a licensee name passes that entry as
    ``metadata["license"]``, which must then describe the same license."""
    if license is None:
        return None
    from . import licensing

    given = metadata.get("license")
    if given is None:
        metadata["license"] = licensing.to_aprender_entry(license)
    elif not licensing.from_aprender_entry(given).matches(license):
        raise LayoutError("metadata['license'] describes another license than license= (uuid, block hash, "
                          "expiry or seats differ); build it with aprfast.v1.licensing.to_aprender_entry")
    return licensing.encode_license_block(license)


def _sign(header: Header, metadata_block: bytes, stored, signing_key) -> bytes:
    """Ed25519 over header || metadata || stored payload, the parts hashed in place."""
    from ..crypto import core as crypto

    return bytes(crypto.sign([header.to_bytes(), metadata_block, stored], signing_key))


def _emit(parts, path, durable):
    if path is None:
        return b"".join(parts)
    if isinstance(path, (str, os.PathLike)):
        from ..io.atomic import AtomicFile

        atomic = AtomicFile(path, durable=durable)
        try:
            if not durable and isinstance(parts, list):
                _reserve(atomic.fd, sum(memoryview(part).nbytes for part in parts))
            for part in parts:
                _write_all(atomic.fd, part)
        except BaseException as exc:
            atomic.abort()
            if isinstance(exc, OSError) and not isinstance(exc, AprError):
                raise AprIOError(f"write failed: {exc.strerror or exc}", path=path) from exc
            raise
        atomic.commit()
        return None
    if not hasattr(path, "write"):
        raise TypeError(f"cannot write a v1 file to {type(path).__name__}; give a path or a writable file")
    for part in parts:
        path.write(part)
    return None


def _emit_sealed(header: Header, metadata_block: bytes, sealing, stored, path, durable) -> None:
    """Header, metadata, the payload sealed piece by piece, the CRC32 of it all: the
    bytes ``layout.assemble`` gives, written as they are made."""
    from ..io.atomic import AtomicFile

    crc = 0
    atomic = AtomicFile(path, durable=durable)

    def write(piece) -> None:
        nonlocal crc
        crc = crc32(piece, crc)
        _write_all(atomic.fd, piece)

    try:
        if not durable:
            _reserve(atomic.fd, layout.HEADER_SIZE + len(metadata_block) + header.payload_size + layout.CRC_SIZE)
        write(header.to_bytes())
        write(metadata_block)
        sealing.seal_to(write, stored)
        _write_all(atomic.fd, crc.to_bytes(layout.CRC_SIZE, "little"))
    except BaseException as exc:
        atomic.abort()
        if isinstance(exc, OSError) and not isinstance(exc, AprError):
            raise AprIOError(f"write failed: {exc.strerror or exc}", path=path) from exc
        raise
    atomic.commit()


def _reserve(fd: int, size: int) -> None:
    """The file's blocks in one go before a save that is not fsynced, as the v2 writer
    does (aprfast.io.atomic.reserve_blocks: 2-5x faster writes on ext4; a full disk fails first)."""
    from ..io.atomic import reserve_blocks

    reserve_blocks(fd, size)


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


# --- saving: the chunk index (STREAMING) and the trueno index (TRUENO_NATIVE) ---------
def _save_indexed(payload, path, *, model_type, metadata, compression, quality_score, password, recipient,
                  recipients, signing_key, license, durable, streaming, chunk_size, trueno_native, backend_hint):
    """save_model for the two indexed tensor payloads; every refusal comes first."""
    if not isinstance(payload, Mapping):
        raise TypeError("streaming= and trueno_native= store named tensors: pass a dict of name -> array")
    if recipients is not None and not isinstance(recipients, (str, bytes, bytearray, memoryview)):
        recipients = list(recipients)
    compression = Compression.from_value(compression)
    encryption = _encryption_mode(password, recipient, recipients)
    limit = _indexed_options(streaming, chunk_size, trueno_native, backend_hint, compression, encryption)
    score = _quality_byte(quality_score)
    public_key = _public_key(signing_key)
    inputs = _sorted_inputs(payload)
    marker = CHUNKED_PAYLOAD_FORMAT if streaming else TRUENO_PAYLOAD_FORMAT
    metadata, model_type = _indexed_metadata(metadata, model_type, marker)
    license_block = _apply_license(metadata, license)
    flags = Flag.STREAMING if streaming else Flag.TRUENO_NATIVE
    if encryption is not None:
        flags |= Flag.ENCRYPTED
    if public_key is not None:
        flags |= Flag.SIGNED
    if metadata.get("license") is not None:
        flags |= Flag.LICENSED
    if streaming:
        metadata_block = layout.encode_metadata(metadata, license_block=license_block)
        head = dict(model_type=model_type, compression=compression, flags=flags, quality_score=score)
        sealing = (encryption, password, recipient, recipients)
        if path is not None and (compression is not Compression.NONE or encryption is not None):
            # chunks that are new bytes (compressed or sealed) go through a spool file,
            # so memory holds a few chunks, not the payload
            return _save_chunked_spooled(inputs, head, metadata_block, limit, sealing, signing_key, public_key,
                                         path, durable)
        parts = _chunked_parts(inputs, head, metadata_block, limit, sealing, signing_key)
    else:
        metadata_block = layout.encode_metadata(metadata, license_block=license_block,
                                                align_end_to=trueno.ALIGNMENT)
        hints = _backend_hints(backend_hint, inputs)
        parts = _trueno_parts(inputs, hints, model_type, metadata_block, flags, score)
    if public_key is not None:
        from ..crypto import core as crypto

        parts.append(bytes(crypto.sign(parts, signing_key)) + public_key)
    return _emit(_with_crc(parts), path, durable)


def _indexed_options(streaming, chunk_size, trueno_native, backend_hint, compression, encryption) -> int:
    """Refuse option sets the two layouts cannot hold; the chunk size limit to use."""
    if streaming and trueno_native:
        raise LayoutError("streaming=True and trueno_native=True together are not written: the trueno index "
                          "already gives zero-copy random access, which a chunk index over raw chunks would not add")
    if trueno_native and (compression is not Compression.NONE or encryption is not None):
        what = "compression" if compression is not Compression.NONE else "encryption"
        raise LayoutError(f"trueno_native=True refuses {what}: trueno-native tensors are mapped as stored, 64-byte "
                          "aligned, so they cannot be compressed or encrypted (seed 000 §9.9: compression and "
                          "zero-copy are mutually exclusive)")
    if backend_hint is not None and not trueno_native:
        raise LayoutError("backend_hint= describes trueno-native tensors; pass trueno_native=True")
    if chunk_size is not None and not streaming:
        raise LayoutError("chunk_size= applies to streaming=True files only")
    if chunk_size is None:
        return chunk_index.DEFAULT_CHUNK_LIMIT
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not (
            1 <= chunk_size <= chunk_index.MAX_CHUNK_LIMIT):
        raise ValueError(f"chunk_size must be an int from 1 to {chunk_index.MAX_CHUNK_LIMIT}, not {chunk_size!r}")
    return chunk_size


def _sorted_inputs(payload) -> list:
    """TensorInputs in the order both indexes store them: by UTF-8 name bytes."""
    from ..tensors import as_inputs

    return sorted(as_inputs(payload), key=lambda t: t.name.encode("utf-8"))


def _indexed_metadata(metadata, model_type, marker):
    metadata = dict(metadata or {})
    metadata.setdefault("created_at", str(int(time.time())))
    metadata.setdefault("aprender_version", DEFAULT_APRENDER_VERSION)
    custom = metadata.get("custom") or {}
    if not isinstance(custom, Mapping):
        raise LayoutError(f"metadata 'custom' must be a map of str -> JSON value, not {type(custom).__name__}")
    if custom.get(PAYLOAD_FORMAT_KEY, marker) != marker:
        raise LayoutError(f"metadata custom[{PAYLOAD_FORMAT_KEY!r}] = {custom[PAYLOAD_FORMAT_KEY]!r} contradicts "
                          f"this payload ({marker!r})")
    metadata["custom"] = {**custom, PAYLOAD_FORMAT_KEY: marker}
    return metadata, ModelType.from_value(ModelType.NeuralCustom if model_type is None else model_type)


def _raw_bytes(t) -> memoryview:
    """A tensor input's bytes as a flat byte view (no copy)."""
    import numpy as np

    data = t.data
    if isinstance(data, np.ndarray):
        return memoryview(data.reshape(-1).view(np.uint8)) if data.size else memoryview(b"")
    return memoryview(data).cast("B") if t.nbytes else memoryview(b"")


def _chunked_parts(inputs, head: dict, metadata_block: bytes, limit: int, encryption, signing_key=None) -> list:
    """header, metadata, chunk index, then every chunk as stored.  A signed file's
    index carries each chunk's SHA-256 and its own signature (chunk_index.DIGESTS)."""
    records, pieces = _compressed_chunks(inputs, head["compression"], limit)
    key, key_block = _file_key(encryption)
    try:
        chunks = _chunk_table(pieces, tag_size() if key is not None else 0)
        digests = [bytes(chunk_index.DIGEST_SIZE)] * len(chunks) if signing_key is not None else None
        # The index header (sizes, counts, flags) is fixed before any chunk is sealed:
        # it is part of every chunk's AAD, and holds no CRC or digest.
        trial = chunk_index.encode(records, chunks, chunk_limit=limit, key_block=key_block,
                                   sealed=key is not None, digests=digests)
        header = Header(head["model_type"], len(metadata_block), sum(c[1] for c in chunks),
                        sum(c[2] for c in chunks), head["compression"], head["flags"],
                        head["quality_score"]).to_bytes()
        stored = [packed for _, packed, _ in pieces]
        if key is not None:
            aad_parts = (header, hashlib.sha256(metadata_block).digest(), trial[:chunk_index.HEADER_SIZE])
            stored = [_seal_chunk(key, i, packed, chunk_index.chunk_aad(*aad_parts, records[owner], *chunks[i][:3], i))
                      for i, (owner, packed, _) in enumerate(pieces)]
    finally:
        if key is not None:
            key[:] = bytes(len(key))  # a bytearray we own: wipe the file key
    return [header, metadata_block,
            _final_index(records, chunks, stored, limit, key_block, header, metadata_block, signing_key), *stored]


class _Spool:
    """An unnamed temporary file that chunks are appended to and read back from, so a
    streaming save holds a few chunks in memory rather than the whole payload."""

    COPY_PIECE = 8 << 20

    def __init__(self):
        from ..io.atomic import open_anonymous

        # nameless (O_TMPFILE), or a temporary named and locked by the one rule of
        # aprfast.io.atomic until it is unlinked: a killed save leaves nothing unswept
        self.file = os.fdopen(open_anonymous(None), "w+b", buffering=0)
        self.fd = self.file.fileno()
        self.size = 0

    def append(self, data) -> tuple:
        """Write ``data`` at the end; its (offset, length)."""
        at = self.size
        _write_all(self.fd, data)
        self.size += len(data)
        return at, len(data)

    def read(self, at: int, n: int) -> bytearray:
        out = bytearray(n)
        view, done = memoryview(out), 0
        while done < n:
            got = _platform.preadv(self.fd, view[done:], at + done)
            if got <= 0:
                raise AprIOError(f"spool file ended at {at + done} of {at + n}")
            done += got
        return out

    def pieces(self):
        """The whole spool, in order, in pieces of at most COPY_PIECE bytes."""
        for at in range(0, self.size, self.COPY_PIECE):
            yield self.read(at, min(self.COPY_PIECE, self.size - at))

    def close(self) -> None:
        self.file.close()


def _save_chunked_spooled(inputs, head: dict, metadata_block: bytes, limit: int, encryption, signing_key,
                          public_key, path, durable) -> None:
    """The STREAMING file _chunked_parts gives, byte for byte, in bounded memory.

    The header (stored and raw payload sizes) and the index (every chunk's size, CRC32
    and digest) come before the chunks, and a sealed chunk's AAD holds the header, so:
    pass 1 compresses every chunk into a spool (sizes known); pass 2 seals each chunk
    (read back one at a time) into a second spool, CRC and digest on the way; then
    header, metadata and index are written and the spool is copied after them."""
    compression = head["compression"]
    packed_spool, stored_spool = _Spool(), None
    key = None
    try:
        records, pieces = _compress_to_spool(inputs, compression, limit, packed_spool)
        key, key_block = _file_key(encryption)
        tag = tag_size() if key is not None else 0
        chunks, at = [], 0
        for _, _, n, raw_size in pieces:
            chunks.append((at, n + tag, raw_size, 0))
            at += n + tag
        digests = [bytes(chunk_index.DIGEST_SIZE)] * len(chunks) if signing_key is not None else None
        trial = chunk_index.encode(records, chunks, chunk_limit=limit, key_block=key_block, sealed=key is not None,
                                   digests=digests)
        header = Header(head["model_type"], len(metadata_block), at, sum(c[2] for c in chunks), compression,
                        head["flags"], head["quality_score"]).to_bytes()
        aad_parts = (header, hashlib.sha256(metadata_block).digest(), trial[:chunk_index.HEADER_SIZE])
        crcs, sums = [], [] if signing_key is not None else None
        stored_spool = _Spool() if key is not None else packed_spool
        for i, (owner, ref, n, _raw_size) in enumerate(pieces):
            packed = ref if isinstance(ref, memoryview) else packed_spool.read(ref, n)
            stored = packed
            if key is not None:
                aad = chunk_index.chunk_aad(*aad_parts, records[owner], *chunks[i][:3], i)
                stored = _seal_chunk(key, i, packed, aad)
                stored_spool.append(stored)
            crcs.append(crc32(stored))
            if sums is not None:
                sums.append(hashlib.sha256(stored).digest())
        if key is not None:
            key[:] = bytes(len(key))
            key = None
            packed_spool.close()  # its bytes are all sealed into stored_spool now
        index = _index_of(records, chunks, crcs, sums, limit, key_block, header, metadata_block, signing_key)
        _emit_spooled([header, metadata_block, index], stored_spool, signing_key, public_key, path, durable)
    except OSError as exc:
        if isinstance(exc, AprError):
            raise
        # the spool (in TMPDIR) failed, e.g. ENOSPC: an I/O refusal, not a crash
        raise AprIOError(f"spooling the chunks to a temporary file failed: {exc.strerror or exc}",
                         path=path if isinstance(path, (str, os.PathLike)) else None) from exc
    finally:
        if key is not None:
            key[:] = bytes(len(key))  # a bytearray we own: wipe the file key
        packed_spool.close()
        if stored_spool is not None:
            stored_spool.close()


def _compress_to_spool(inputs, compression, limit, spool: _Spool):
    """(tensor records, [(record number, where, stored size, raw size)]) as
    _compressed_chunks gives them; ``where`` is the spool offset of a compressed chunk,
    or the caller's bytes (a view, not copied) when nothing is compressed."""
    from ..dtypes import APR2_IDS

    records, pieces = [], []
    for t in inputs:
        data = _raw_bytes(t)
        count = -(-t.nbytes // limit)
        records.append(chunk_index.tensor_record(t.name, APR2_IDS.id_of(t.dtype), t.shape, count))
        owner = len(records) - 1
        for at in range(0, t.nbytes, limit):
            piece = data[at:at + limit]
            if compression is Compression.NONE:
                pieces.append((owner, piece, len(piece), len(piece)))
            else:
                where, n = spool.append(codecs.compress(piece, compression))
                pieces.append((owner, where, n, len(piece)))
    return records, pieces


def _emit_spooled(prefix: list, spool: _Spool, signing_key, public_key, path, durable) -> None:
    """``prefix`` then the spool's bytes, then (signed) the file signature over them all
    and the CRC32 of everything: the bytes _emit(_with_crc(parts)) writes."""
    import mmap

    signature = b""
    if signing_key is not None:
        from ..crypto import core as crypto

        # Ed25519 reads the message twice: the spool is mapped (page cache, not heap)
        mapped = mmap.mmap(spool.fd, spool.size, access=mmap.ACCESS_READ) if spool.size else None
        try:
            with memoryview(mapped if mapped is not None else b"") as body:
                signature = bytes(crypto.sign([*prefix, body], signing_key)) + public_key
        finally:
            if mapped is not None:
                mapped.close()

    def parts():
        yield from prefix
        yield from spool.pieces()
        if signature:
            yield signature

    def with_crc():
        crc = 0
        for part in parts():
            crc = crc32(part, crc)
            yield part
        yield crc.to_bytes(layout.CRC_SIZE, "little")

    _emit(with_crc(), path, durable)


def _compressed_chunks(inputs, compression, limit):
    """(tensor records, [(record number, compressed chunk, raw size)]): each tensor's
    bytes split every ``limit`` bytes, each piece compressed on its own."""
    from ..dtypes import APR2_IDS

    records, pieces = [], []
    for t in inputs:
        data = _raw_bytes(t)
        raw = [data[at:at + limit] for at in range(0, t.nbytes, limit)]
        records.append(chunk_index.tensor_record(t.name, APR2_IDS.id_of(t.dtype), t.shape, len(raw)))
        owner = len(records) - 1
        # Uncompressed chunks stay views of the caller's arrays: nothing is copied.
        pieces += [(owner, piece if compression is Compression.NONE else codecs.compress(piece, compression),
                    len(piece)) for piece in raw]
    return records, pieces


def _file_key(encryption):
    """(a fresh 32-byte file key, its key block) for an encrypted file; (None, b"") otherwise."""
    mode, password, recipient, recipients = encryption
    if mode is None:
        return None, b""
    key = bytearray(os.urandom(FILE_KEY_SIZE))
    try:
        return key, bytes(_encrypt(key, mode, password, recipient, recipients))
    except BaseException:
        key[:] = bytes(len(key))
        raise


def _chunk_table(pieces, tag: int) -> list:
    """(offset, stored size, raw size, crc placeholder) per chunk, back to back."""
    chunks, at = [], 0
    for _, packed, raw_size in pieces:
        chunks.append((at, len(packed) + tag, raw_size, 0))
        at += len(packed) + tag
    return chunks


def _final_index(records, chunks, stored, limit, key_block, header, metadata_block, signing_key) -> bytes:
    """The index with each stored chunk's CRC32 (and, signed, SHA-256 and the index signature)."""
    crcs = [crc32(part) for part in stored]
    digests = [hashlib.sha256(part).digest() for part in stored] if signing_key is not None else None
    return _index_of(records, chunks, crcs, digests, limit, key_block, header, metadata_block, signing_key)


def _index_of(records, chunks, crcs, digests, limit, key_block, header, metadata_block, signing_key) -> bytes:
    """The final index from each stored chunk's CRC32 and (signed) SHA-256."""
    final = [(o, s, r, crc) for (o, s, r, _), crc in zip(chunks, crcs)]
    body = chunk_index.encode(records, final, chunk_limit=limit, key_block=key_block, sealed=bool(key_block),
                              digests=digests)
    signature = b""
    if signing_key is not None:
        from ..crypto import core as crypto

        signature = bytes(crypto.sign(chunk_index.signed_message(header, metadata_block, body), signing_key))
    return chunk_index.finish(header, metadata_block, body, signature)


def _seal_chunk(key, ordinal: int, packed, aad: bytes) -> bytearray:
    """One chunk sealed with AES-256-GCM under the file key: ciphertext || tag."""
    from ..crypto import core as crypto

    return crypto._seal_blob(b"", memoryview(packed), key, chunk_index.chunk_nonce(ordinal), aad=memoryview(aad))


def _backend_hints(backend_hint, inputs) -> dict:
    """name -> §9.3 backend id, from one hint for all tensors or a dict of them."""
    if backend_hint is None:
        return {}
    if isinstance(backend_hint, Mapping):
        names = {t.name for t in inputs}
        unknown = [name for name in backend_hint if name not in names]
        if unknown:
            raise ValueError(f"backend_hint names tensors the payload lacks: {unknown[:5]}")
        return {name: trueno.backend_id(value) for name, value in backend_hint.items()}
    hint = trueno.backend_id(backend_hint)
    return {t.name: hint for t in inputs}


def _trueno_parts(inputs, hints, model_type, metadata_block, flags, score) -> list:
    """header, metadata (ending on 64), the §9.2 index with names, then each tensor and its padding."""
    start = layout.HEADER_SIZE + len(metadata_block)
    head, placed, size = trueno.plan(inputs, hints, start)
    header = Header(model_type, len(metadata_block), size, size, Compression.NONE, flags, score).to_bytes()
    parts = [header, metadata_block, head]
    for t, _, pad in placed:
        if t.nbytes:
            parts.append(_raw_bytes(t))
        if pad:
            parts.append(bytes(pad))
    return parts


def _with_crc(parts: list) -> list:
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    parts.append(crc.to_bytes(layout.CRC_SIZE, "little"))
    return parts
