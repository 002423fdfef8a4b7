"""The v1 container (``APRN``, aprender's ``save``/``load`` format): the public API.

* :func:`save_model` writes a payload (raw bytes, e.g. a bincode-serialised aprender
  model, or a dict of named arrays) with aprender's header, MessagePack metadata,
  optional compression, encryption, signature and license, and the trailing CRC32.
* :func:`load_model` checks everything in the order the Andon protocol asks (magic,
  CRC32, header, model type, signature, decryption, decompression) and returns a
  :class:`V1Model`.
* :func:`inspect_model` reads only the header and metadata, like aprender's ``inspect``.
* ``save_model(tensors, streaming=True)`` writes the STREAMING chunk index
  (:mod:`aprfast.layouts.chunk_index`) and ``trueno_native=True`` the TRUENO_NATIVE
  tensor index (:mod:`aprfast.layouts.trueno`); :class:`aprfast.v1.reader.V1File` reads
  them lazily, :func:`load_model` eagerly.

The bytes live in :mod:`aprfast.layouts.v1`, compression in :mod:`aprfast.codecs`,
encryption and signatures in :mod:`aprfast.crypto`, licenses in :mod:`aprfast.v1.licensing`.
docs/FORMAT.md (v1 section) records every byte and decision.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..io import platform as _platform
from ..codecs import payload as codecs
from .._crc import crc32
from .._version import __version__
from ..codecs.payload import MAX_UNCOMPRESSED_SIZE, Compression
from ..errors import (AprError, AprIOError, ChecksumError, CorruptError, DecryptError, FormatError, LayoutError,
                     LimitError, ModelTypeMismatchError, SignatureError)
from ..layouts import chunk_index, trueno
from ..layouts import plan as plan_layout
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header, ModelType
from ..io.sources import open_source
from ..tensors import as_inputs
from ..files.writer import save_to

__all__ = [
    "save_model", "load_model", "inspect_model", "check_license", "V1Model", "ModelType", "Compression", "Flag",
    "Header", "MAX_UNCOMPRESSED_SIZE", "PAYLOAD_FORMAT_KEY", "TENSOR_PAYLOAD_FORMAT", "UNSIGNED", "TRUSTED",
    "SELF_SIGNED", "generate_signing_key", "generate_x25519_key", "public_key_of",
]

#: ``metadata["custom"][PAYLOAD_FORMAT_KEY] == TENSOR_PAYLOAD_FORMAT`` marks a payload that
#: is a whole v2 tensor container (aprender's ``APR\\0`` layout) instead of bincode.
PAYLOAD_FORMAT_KEY = "payload_format"
TENSOR_PAYLOAD_FORMAT = "apr-v2-tensors"
#: The marker of a STREAMING file's payload: named chunks behind a chunk index.
CHUNKED_PAYLOAD_FORMAT = "apr-v1-chunks"
#: The marker of a TRUENO_NATIVE payload (seed 000 §9.2 index, then aligned tensors).
#: The flag alone keeps its old meaning (reported only), since no other writer says
#: what payload goes with it.
TRUENO_PAYLOAD_FORMAT = "trueno-native"
#: A STREAMING file's chunks are sealed under one random AES-256 key per file, itself
#: sealed in the chunk index's key block with the v1 password/recipient modes.
FILE_KEY_SIZE = 32
#: What ``aprender_version`` says when the caller does not pin it.
DEFAULT_APRENDER_VERSION = f"aprfast {__version__}"
#: Tensor payloads stored plainly start on this boundary in the file, so their arrays
#: (64-byte aligned inside the payload) are 64-byte aligned in a memory map too.
TENSOR_ALIGNMENT = 64

#: Signature states reported in :attr:`V1Model.signature`.
UNSIGNED = "unsigned"
TRUSTED = "trusted"
SELF_SIGNED = "self-signed (embedded key, not trusted)"

_KEY_HELPERS = ("generate_signing_key", "generate_x25519_key", "public_key_of")


def __getattr__(name):
    # Key helpers come from aprfast.crypto, imported on first use so that plain files
    # never load the crypto libraries.
    if name in _KEY_HELPERS:
        from ..crypto import core as crypto

        return getattr(crypto, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class V1Model:
    """A loaded v1 file."""

    header: Header
    #: aprender's metadata as stored (aprfast's internal keys removed).
    metadata: dict
    #: The decompressed, decrypted payload: bytes (stored plainly) or bytearray
    #: (decrypted or decompressed by aprfast, owned, wipeable), a writable memoryview
    #: (a password-encrypted file decrypted in place in a private map: owned, wipeable),
    #: or name -> array for tensor payloads (views of the mapped file or of the
    #: decrypted/decompressed buffer: no copy).
    payload: object
    #: UNSIGNED, TRUSTED or SELF_SIGNED.
    signature: str = UNSIGNED
    #: The embedded Ed25519 public key of a signed file.
    signer: bytes | None = None
    #: "none", "password", "recipient" or "multi-recipient".
    encryption: str = "none"
    #: The decoded binary license block (aprfast.v1.licensing.License), if any.
    license: object | None = None
    flags: Flag = field(default=Flag(0))

    @property
    def model_type(self) -> ModelType:
        return ModelType(self.header.model_type)

    @property
    def is_tensors(self) -> bool:
        return isinstance(self.payload, dict)

    @property
    def trusted(self) -> bool:
        return self.signature == TRUSTED

    def check_license(self, **kwargs) -> None:
        """Enforce the file's license (see :func:`check_license`)."""
        check_license(self, **kwargs)


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
    docs/FORMAT.md has both layouts.
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
        chunks = _chunk_table(pieces, _tag_size() if key is not None else 0)
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
        import tempfile

        self.file = tempfile.TemporaryFile(prefix="aprfast-spool-")
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
        tag = _tag_size() if key is not None else 0
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
        for i, (owner, ref, n, raw_size) in enumerate(pieces):
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


def _tag_size() -> int:
    from ..crypto import core as crypto

    return crypto.TAG_SIZE


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


# --- loading --------------------------------------------------------------------------
def load_model(source, *, expected_type=None, password=None, private_key=None, trusted_keys=None,
               require_signature=None, max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
               allow_unencrypted: bool = False) -> V1Model:
    """Read a v1 file (a path, a file object or bytes-like).

    Checks, stopping at the first failure: magic (FormatError), the trailing CRC32
    (ChecksumError), the header (VersionError for a newer major version),
    ``expected_type`` (ModelTypeMismatchError), the region sizes (CorruptError), then
    the signature (SignatureError) before the metadata or payload is used, then
    decryption (DecryptError), then decompression bounded by ``max_uncompressed``
    (LimitError) and by the header's size (CorruptError).

    ``trusted_keys``: Ed25519 public keys; a signed file must be signed by one of
    them.  Passing any implies ``require_signature`` unless it is given as False.
    Without trusted keys a signed file is still verified against its embedded key and
    reported as SELF_SIGNED: that proves integrity, not who signed it.
    ``password`` or ``private_key`` (X25519) open an encrypted payload.  A caller who
    gives one asked for an encrypted file: a plaintext file is then refused with
    DecryptError (an attacker who clears ENCRYPTED and fixes the CRC would otherwise
    have their bytes returned as the model), unless ``allow_unencrypted=True`` says
    that either is acceptable.

    STREAMING files (chunk index) and TRUENO_NATIVE files come back as name -> array
    like any tensor payload: every chunk decoded and checked (owned arrays), or
    read-only views of the map with their strides (trueno-native).
    """
    if password is not None and private_key is not None:
        raise ValueError("give password= or private_key=, not both")
    if require_signature is None:
        require_signature = trusted_keys is not None
    src = open_source(source)
    try:
        return _load(src, expected_type, password, private_key, trusted_keys, require_signature, max_uncompressed,
                     allow_unencrypted)
    finally:
        # Arrays handed out keep the map alive; closing only drops our handle.
        src.close()


def _load(src, expected_type, password, private_key, trusted_keys, require_signature, max_uncompressed,
          allow_unencrypted=False, tensor_buffer=False, verified=None):
    """load_model's work; ``tensor_buffer=True`` leaves a v2 tensor payload as its
    decoded buffer (for V1File, which serves it through an AprFile); ``verified`` is
    the (state, signer) of a signature the caller has already checked over these bytes."""
    path = src.path
    if verified is None:
        model = _load_read(src, expected_type, password, private_key, trusted_keys, require_signature,
                           max_uncompressed, allow_unencrypted)
        if model is not None:
            return model
    view = _whole_file(src)
    header = _checked_header(view, expected_type, max_uncompressed, path)
    regions = _locate(header, _reader_of(view), len(view), path)
    if verified is None:
        verified = _verify_signature(view, regions, trusted_keys, require_signature, path)
    signature, signer = verified
    metadata = layout.decode_metadata(view[slice(*regions.metadata)], path=path)
    kind = _payload_kind(header, metadata, path)
    stored = view[slice(*regions.payload)]
    encryption = "none"
    if kind == "chunks":
        if header.flags & Flag.SIGNED:  # so that load_model and V1File accept the same files
            _verify_index_signature(_reader_of(view), header, regions, [signer], False, path)
        chunks = _open_chunks(_reader_of(view), header, regions, path, None, True, password, private_key,
                              allow_unencrypted)
        encryption = chunks.encryption
        try:
            payload = chunks.all_tensors(_reader_of(view))
        finally:
            chunks.close()
    elif kind == "trueno":
        _refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        payload = _trueno_tensors(view, regions, path)
    else:
        if header.flags & Flag.ENCRYPTED:
            private = _private_payload(src, regions) if password is not None else None
            if private is not None:  # the plaintext replaces the ciphertext: no second copy
                stored, encryption = _decrypt_in_place(private, password, path), "password"
            else:
                stored, encryption = _decrypt(stored, password, private_key, path)
        else:
            _refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        plain = codecs.decompress(stored, header.compression, expected_size=header.uncompressed_size,
                                  limit=max_uncompressed, path=path)
    license = _decode_license(metadata, path)
    for key in layout.INTERNAL_KEYS:
        metadata.pop(key, None)
    if kind == "tensors":
        payload = plain if tensor_buffer else _tensors(plain, path)
    elif kind == "bytes":
        # A decrypted or decompressed payload is already an owned bytearray (which the
        # caller may wipe); copying it to bytes would hold the model twice.  A payload
        # stored plainly is copied out of the map so the file can be closed.
        payload = plain if isinstance(plain, bytearray) or _in_private_map(plain) else _owned_copy(plain)
    return V1Model(header, metadata, payload, signature, signer, encryption, license, header.flag_set)


def _load_read(src, expected_type, password, private_key, trusted_keys, require_signature, max_uncompressed,
               allow_unencrypted):
    """load_model by one read of the file, for the payloads that end up in memory of
    their own anyway, from a file descriptor: a plain bytes payload (read with ``pread``
    straight into the ``bytes`` returned) and a password-encrypted one (read into one
    buffer, then decrypted in place there), unsigned and not chunked or trueno.  The
    CRC32 is computed chunk by chunk as the bytes arrive.  The full path maps the file,
    checksums the map in a pass of its own, then copies the payload out of the map (or
    decrypts it in a private map, whose copy-on-write faults copy every page first):
    fresh 4 KiB pages and about twice the memory traffic of a plain ``read()``.

    None when this path does not apply, or when anything in the file is wrong (bad
    magic, header, sizes or metadata, a CRC mismatch, an argument the file refutes):
    the full path then reports it, in the order load_model promises.  Nothing read here
    is believed before the CRC32 over exactly these bytes has matched (the file is read
    once: a file changed meanwhile fails the CRC or is consistent), and nothing
    decrypted is returned before the AES-GCM tag has."""
    if getattr(src, "pread_bytes", None) is None or src.size < layout.HEADER_SIZE + layout.CRC_SIZE:
        return None
    path = src.path
    try:
        head = src.read(0, min(src.size, _HEAD_READ), "v1 header")
        if bytes(head[:len(layout.MAGIC)]) != layout.MAGIC:
            return None
        header = Header.from_bytes(head[:layout.HEADER_SIZE], path=path)
        sealed = bool(header.flags & Flag.ENCRYPTED)
        if (header.flags & Flag.SIGNED or header.flag_set & (Flag.STREAMING | Flag.TRUENO_NATIVE)
                or (sealed and password is None) or (not sealed and header.compression != Compression.NONE)):
            return None
        regions = layout.locate(header, src.size, path=path)
        start, end = regions.payload
        if sealed and end - start < _SEALED_MINIMUM:
            return None
        # a view: slicing the bytearray a long read returns would copy the metadata
        prefix = memoryview(head[:start] if start <= len(head) else src.read(0, start, "v1 header and metadata"))
        metadata = layout.decode_metadata(prefix[layout.HEADER_SIZE:start], path=path)
        kind = _payload_kind(header, metadata, path)
        if kind != "bytes" and not (sealed and kind == "tensors"):
            return None
        # What load_model checks after the CRC and before the payload, tried now on the
        # same bytes so that a file these refuse is not read (the full path reports it).
        _check_fields(header, expected_type, max_uncompressed, path)
        signature, signer = _verify_signature(None, regions, trusted_keys, require_signature, path)
        if not sealed:
            _refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        crc = crc32(prefix)
        if sealed:
            salt_nonce, key, stored, crc = _read_sealed(src, start, end, crc, password)
            if stored is None:
                return None
        elif end <= len(head):
            stored = bytes(head[start:end])
            crc = crc32(stored, crc)
        else:
            stored, crc = src.pread_bytes(start, end - start, threads=_read_threads(), crc=crc)
        matches = crc == int.from_bytes(src.read(regions.crc_offset, layout.CRC_SIZE, "CRC32"), "little")
    except AprError:
        return None
    if not matches:
        return None
    encryption = "none"
    if sealed:
        from .. import _memory
        from ..crypto import core as crypto

        try:
            crypto.open_password_blob_in_place(salt_nonce, stored, password, key=key).release()
        except DecryptError as exc:
            raise DecryptError(exc.message, path=path) from None
        _memory.resize_bytearray(stored, len(stored) - crypto.TAG_SIZE)  # drops the tag, in place
        encryption = "password"
    plain = codecs.decompress(stored, header.compression, expected_size=header.uncompressed_size,
                              limit=max_uncompressed, path=path)
    license = _decode_license(metadata, path)
    for name in layout.INTERNAL_KEYS:
        metadata.pop(name, None)
    payload = _tensors(plain, path) if kind == "tensors" else plain
    return V1Model(header, metadata, payload, signature, signer, encryption, license, header.flag_set)


def _read_sealed(src, start: int, end: int, crc: int, password):
    """(salt || nonce, the AES key, a new bytearray of ciphertext || tag, the running
    CRC32) of a password blob at [start, end): the bulk read in parallel straight into
    the buffer the plaintext will occupy (huge pages when large), checksummed as it
    arrives.  The key is derived first, so Argon2's 19 MiB are freed before the buffer
    is filled (peak memory: the payload once).  A password Argon2 refuses (its type)
    gives (.., None, ..): the full path reports it in its order."""
    from .. import _memory
    from ..crypto import core as crypto

    salt_nonce = bytes(src.read(start, crypto.PASSWORD_PREFIX_SIZE, "salt and nonce"))
    try:
        key = crypto.derive_password_key(password, salt_nonce[:crypto.SALT_SIZE])
    except Exception:  # the full path raises it again, after the checks that come first
        return salt_nonce, None, None, crc
    at = start + crypto.PASSWORD_PREFIX_SIZE
    buffer = _memory.uninitialised_bytearray(end - at)
    return salt_nonce, key, buffer, src.readinto(at, buffer, threads=_read_threads(), crc=crc32(salt_nonce, crc))


def _read_threads() -> int:
    """Threads for the bulk read of _load_read: 0, pread's default, which starts only
    the threads the cores idle at the call can run (csrc/parallel.h).  Why not every
    core: the read is split into one part per thread and waits for the slowest, so on
    a busy machine a descheduled part stretches the whole load (256 MiB plain load at
    load average 6: 103 ms on one thread, 545 ms on two; idle: 48 ms on two, 77 on one)."""
    return 0 if _READ_THREADS is None else _READ_THREADS


#: Forces _read_threads (tests, benchmarks); None leaves it to the C default.
_READ_THREADS = None


#: The smallest password-encrypted payload: salt, nonce and tag (crypto's sizes; a
#: shorter one is the full path's to refuse).
_SEALED_MINIMUM = 16 + 12 + 16


#: What _load_read reads first: header and metadata (and all of a small file) in one
#: call, as much as FileSource serves from its first pread.
_HEAD_READ = 16 << 10


def _owned_copy(view) -> bytes:
    """``bytes(view)`` made by both cores: a large copy out of the page cache is bound
    by faulting in fresh pages, which runs in parallel."""
    from .._memory import copy_to_bytes

    return copy_to_bytes(view)


def _reader_of(view):
    """read(offset, n, what) over a whole-file buffer (the Source.read signature)."""
    def read(offset, n, what="range"):
        if offset < 0 or n < 0 or offset + n > len(view):
            raise CorruptError(f"{what} of {n} bytes at offset {offset} lies outside the {len(view)} bytes present")
        return view[offset:offset + n]
    return read


def _checked_header(view, expected_type, max_uncompressed, path) -> Header:
    """Magic, the whole-file CRC32, the header, the expected type and the size limit."""
    _check_magic(view, path)
    layout.check_crc(view, path=path)
    header = Header.from_bytes(view[:layout.HEADER_SIZE], path=path)
    _check_fields(header, expected_type, max_uncompressed, path)
    return header


def _check_fields(header: Header, expected_type, max_uncompressed, path) -> None:
    """The expected type and the size limit (after the CRC32 and the header)."""
    _check_type(header, expected_type, path)
    if header.uncompressed_size > max_uncompressed:
        raise LimitError(f"header declares {header.uncompressed_size} uncompressed payload bytes, above the limit "
                         f"of {max_uncompressed}", path=path)


def _locate(header: Header, read, size: int, path, limits=None):
    """The file's regions; a STREAMING file's chunk index size is read from the index's
    own header first (range-checked: nothing is believed that the bytes present refute)."""
    max_metadata = limits.max_metadata_size if limits is not None else None
    index_size = None
    if header.flag_set & Flag.STREAMING:
        limit = layout.MAX_METADATA_SIZE if max_metadata is None else max_metadata
        if header.metadata_size > limit:
            raise LimitError(f"metadata declares {header.metadata_size} bytes, above the limit of {limit}",
                             path=path)
        start = layout.HEADER_SIZE + header.metadata_size
        n = max(0, min(chunk_index.HEADER_SIZE, size - start))
        index_size = chunk_index.peek_size(bytes(read(start, n, "chunk index header")), path=path, limits=limits)
    return layout.locate(header, size, path=path, max_metadata=max_metadata, index_size=index_size)


def _payload_kind(header: Header, metadata: dict, path) -> str:
    """"chunks" (STREAMING), "trueno", "tensors" (a v2 container) or "bytes"; the flag
    and the metadata's payload marker must agree."""
    custom = metadata.get("custom")
    marker = custom.get(PAYLOAD_FORMAT_KEY) if isinstance(custom, dict) else None
    flags = header.flag_set
    if flags & Flag.STREAMING:
        if marker not in (None, CHUNKED_PAYLOAD_FORMAT):
            raise CorruptError(f"the STREAMING flag is set but the metadata marks the payload {marker!r}", path=path)
        return "chunks"
    if marker == CHUNKED_PAYLOAD_FORMAT:
        raise CorruptError("the metadata marks a chunked payload but the STREAMING flag is clear (a cleared flag "
                           "would misread the chunk index as the payload)", path=path)
    if marker == TRUENO_PAYLOAD_FORMAT:
        if not flags & Flag.TRUENO_NATIVE:
            raise CorruptError("the metadata marks a trueno-native payload but the TRUENO_NATIVE flag is clear",
                               path=path)
        if header.compression != Compression.NONE or flags & Flag.ENCRYPTED:
            raise CorruptError("a trueno-native payload must be stored uncompressed and unencrypted (seed 000 §9.9), "
                               f"but compression is {int(header.compression)} and ENCRYPTED is "
                               f"{'set' if flags & Flag.ENCRYPTED else 'clear'}", path=path)
        return "trueno"
    return "tensors" if marker == TENSOR_PAYLOAD_FORMAT else "bytes"


def _refuse_downgrade(header: Header, password, private_key, allow_unencrypted, path) -> None:
    """A caller who gave a key asked for an encrypted file: refuse a plaintext one (an
    attacker who clears ENCRYPTED and fixes the CRC would have their bytes returned)."""
    if header.flags & Flag.ENCRYPTED or (password is None and private_key is None) or allow_unencrypted:
        return
    given = "a password" if password is not None else "a private key"
    raise DecryptError(f"{given} was given but the file is not encrypted (its ENCRYPTED flag is clear): "
                       "refusing a possibly downgraded file; pass allow_unencrypted=True to accept "
                       "plaintext files too", path=path)


def _trueno_tensors(view, regions, path, limits=None) -> dict:
    """name -> read-only array viewing ``view`` (the mapped file), strides honoured."""
    import numpy as np

    start, end = regions.payload
    entries = trueno.parse(view[start:end], start, path=path, limits=limits)
    whole = np.frombuffer(view, np.uint8)  # keeps the map's export alive (see _tensors)
    return {name: trueno_view(whole, e) for name, e in entries.items()}


def trueno_view(whole, entry):
    """One trueno tensor as a read-only view of ``whole`` (a uint8 array of the file);
    trueno.parse already checked that the strides stay inside the tensor's bytes."""
    import numpy as np

    from ..dtypes import numpy_dtype

    dtype = numpy_dtype(entry.dtype)
    strides = tuple(s * dtype.itemsize for s in entry.strides)
    array = np.ndarray(entry.shape, dtype, whole, entry.offset, strides)
    array.flags.writeable = False
    return array


# --- the chunk index: open, then decode one tensor's chunks ------------------------------
def _open_chunks(read, header: Header, regions, path, limits, strict_dtypes, password, private_key,
                 allow_unencrypted, check_digests: bool = False) -> "_Chunks":
    """Parse and check the chunk index (its CRC covers header, metadata and index), then
    open the file key if the chunks are sealed.  ``check_digests``: compare each chunk
    read with its SHA-256 in the index (a signed file opened through its index
    signature, :func:`_verify_index_signature`)."""
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
    _check_chunk_sizes(index, Compression(header.compression), path)
    key, encryption = None, "none"
    if index.sealed:
        key, encryption = _decrypt(index.key_block, password, private_key, path)
        if len(key) != FILE_KEY_SIZE:
            raise CorruptError(f"the chunk index's key block holds a {len(key)}-byte key, not {FILE_KEY_SIZE}",
                               path=path)
    else:
        _refuse_downgrade(header, password, private_key, allow_unencrypted, path)
    digest = hashlib.sha256(prefix[layout.HEADER_SIZE:]).digest()
    return _Chunks(index, bytes(prefix[:layout.HEADER_SIZE]), digest, Compression(header.compression), key,
                   regions.payload[0], encryption, path, check_digests)


def _verify_index_signature(read, header: Header, regions, trusted_keys, require_signature, path):
    """A signed STREAMING file's signature check at open: the index signature over
    CONTEXT || header || metadata || index, by the key in the file's signature block
    (which must be trusted, as for the file signature).  It covers every byte a lazy
    reader believes before a chunk; each chunk is then checked against its SHA-256 in
    the index when read.  The whole-file signature is left to verify()/load_model."""
    from ..crypto import core as crypto

    if regions.signature is None:
        if require_signature:
            raise SignatureError("the file is not signed but a signature is required", path=path)
        return UNSIGNED, None
    start, end = regions.signature
    signer = bytes(read(end, layout.PUBLIC_KEY_SIZE, "signer public key"))
    state = _signer_state(signer, trusted_keys, path)
    index_start, index_end = regions.index
    body, signature = chunk_index.split_signature(read(index_start, index_end - index_start, "chunk index"))
    if body is None:
        raise SignatureError("the file is signed but its chunk index has no digests and no index signature",
                             path=path)
    prefix = read(0, index_start, "v1 header and metadata")
    try:
        crypto.verify(chunk_index.signed_message(prefix[:layout.HEADER_SIZE], prefix[layout.HEADER_SIZE:], body),
                      signature, signer)
    except SignatureError as exc:
        raise SignatureError(f"chunk index signature does not verify: {exc.message}", path=path) from None
    return state, signer


def _check_chunk_sizes(index, compression, path) -> None:
    """Every chunk's raw size must be one its stored bytes could produce, so that the
    buffer for a whole tensor (allocated before its chunks are decoded) stays
    proportional to the bytes present: stored = raw when uncompressed, LZ4 inflates at
    most 255-fold, zstd 32,768-fold (aprfast.codecs)."""
    from .. import _memory

    # (crypto only for a sealed index: importing it loads OpenSSL and libsodium, several
    # MiB that an unencrypted stream must not pay)
    tag = _tag_size() if index.sealed else 0
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


class _Chunks:
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
        from ..files.reader import array_maker

        from ..dtypes import APR2_IDS

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


def _whole_file(src) -> memoryview:
    """The file as one buffer: the memory map for files, the buffer itself for bytes;
    other sources are read once."""
    if src.zero_copy:
        return src.buffer()
    return memoryview(src.read(0, src.size, "file"))


def _check_magic(view, path) -> None:
    # The magic says what the file is, so it is the one field believed before the CRC.
    if len(view) < 4 or bytes(view[:4]) != layout.MAGIC:
        found = bytes(view[:4])
        raise FormatError(f"magic {found!r} is not {layout.MAGIC!r}: not a v1 .apr file", path=path)


def _check_type(header: Header, expected_type, path) -> None:
    if expected_type is None:
        return
    expected = ModelType.from_value(expected_type)
    if header.model_type != expected:
        raise ModelTypeMismatchError(f"model type mismatch: the file holds {ModelType(header.model_type).name} "
                                     f"({int(header.model_type):#06x}), expected {expected.name} "
                                     f"({int(expected):#06x})", path=path)


def _verify_signature(view, regions, trusted_keys, require_signature, path):
    """Check the signature before anything signed is used; (state, embedded key)."""
    if regions.signature is None:
        if require_signature:
            raise SignatureError("the file is not signed but a signature is required", path=path)
        return UNSIGNED, None
    start, end = regions.signature
    signature = bytes(view[start:end])
    signer = bytes(view[end:end + layout.PUBLIC_KEY_SIZE])
    state = _signer_state(signer, trusted_keys, path)
    from ..crypto import core as crypto

    # One memoryview of the mapped bytes: verified where they lie, never copied.
    try:
        crypto.verify([view[:regions.signed_end]], signature, signer)
    except SignatureError as exc:
        raise SignatureError(f"signature does not verify: {exc.message}", path=path) from None
    return state, signer


def _signer_state(signer: bytes, trusted_keys, path) -> str:
    """TRUSTED if the signer is among ``trusted_keys``, SELF_SIGNED without them."""
    if trusted_keys is None:
        return SELF_SIGNED
    trusted = {bytes(key) for key in trusted_keys}
    if signer not in trusted:
        raise SignatureError(f"signed by key {signer.hex()}, which is not among the {len(trusted)} trusted "
                             "key(s)", path=path)
    return TRUSTED


def _private_payload(src, regions):
    """The payload of a mapped file in a private copy-on-write map (writable, never
    written back), or None for other sources.  The read-only map's pages, touched by
    the CRC and signature checks, are released first, so the process holds the payload
    once: as file pages while decrypting, then as its own pages holding the plaintext
    (peak ~1x the payload instead of 2x)."""
    import mmap

    fileno = getattr(src, "fileno", None)
    if not src.zero_copy or fileno is None or not regions.payload[1] > regions.payload[0]:
        return None
    try:
        private = mmap.mmap(fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    shared = getattr(src, "_map", None)
    if shared is not None and hasattr(mmap, "MADV_DONTNEED") and _platform.uses("madvise"):
        try:
            shared.madvise(mmap.MADV_DONTNEED)  # drops page-table entries only; the data stays in the file
        except OSError:
            pass
    return memoryview(private)[slice(*regions.payload)]


def _in_private_map(plain) -> bool:
    """A payload decrypted in place in a private map: every byte of it was written by
    the decryption, so it is this process's own memory, no longer tied to the file."""
    return isinstance(plain, memoryview) and isinstance(plain.obj, __import__("mmap").mmap) and not plain.readonly


def _decrypt_in_place(private, password, path):
    from ..crypto import core as crypto

    try:
        return crypto.decrypt_with_password_in_place(private, password)
    except DecryptError as exc:
        raise DecryptError(exc.message, path=path) from None


def _decrypt(stored, password, private_key, path):
    """The compressed plaintext and the mode.  aprender's header has no mode byte: a
    password means password mode; with a private key, a multi-recipient payload says
    so itself (magic "APRM"), anything else is single-recipient, whose 8-byte key hint
    is compared before anything is decrypted."""
    from ..crypto import core as crypto

    try:
        if password is not None:
            return crypto.decrypt_with_password(stored, password), "password"
        if private_key is None:
            raise DecryptError("the payload is encrypted: pass password= or private_key=")
        if crypto.is_multi_recipient(stored):
            return crypto.decrypt_multi_recipient(stored, private_key), "multi-recipient"
        return crypto.decrypt_as_recipient(stored, private_key), "recipient"
    except DecryptError as exc:
        if exc.path is None and path is not None:
            raise DecryptError(exc.message, path=path) from None
        raise


def _decode_license(metadata: dict, path):
    """The binary license block, checked against aprender's entry when both exist (the
    entry's ``hash`` is the block's SHA-256, so they cannot disagree unless edited)."""
    block = metadata.get(layout.LICENSE_BLOCK_KEY)
    if block is None:
        return None
    if not isinstance(block, (bytes, bytearray)):
        raise CorruptError(f"metadata {layout.LICENSE_BLOCK_KEY!r} is a {type(block).__name__}, not bytes",
                           path=path)
    from . import licensing

    lic = licensing.decode_license_block(block, path=path)
    entry = metadata.get("license")
    if entry is not None and not licensing.from_aprender_entry(entry, path=path).matches(lic):
        raise CorruptError("the license block and aprender's license entry describe different licenses",
                           path=path)
    return lic


def _tensors(plain, path) -> dict:
    """Arrays viewing ``plain`` (the mapped file or the decompressed buffer)."""
    import numpy as np

    from ..files.reader import AprFile

    # np.ndarray(buffer=memoryview) keeps only the memoryview's base (the mmap) and
    # drops the export, after which the map could be closed under the arrays.  A
    # frombuffer array keeps the memoryview itself as its base, and with it the export:
    # the map then lives exactly as long as the last array viewing it.
    holder = np.frombuffer(plain, np.uint8)
    try:
        with AprFile(holder) as f:
            return f.tensors()
    except AprError as exc:
        raise type(exc)(f"tensor payload: {exc.message}", path=path) from None


# --- inspection and licenses -------------------------------------------------------
def inspect_model(source) -> dict:
    """Header and metadata without checking the CRC or decrypting (aprender's inspect)."""
    src = open_source(source)
    try:
        return layout.inspect(src)
    finally:
        src.close()


def check_license(model_or_license, **kwargs) -> None:
    """Enforce a license (a V1Model's, or a License) with
    :func:`aprfast.v1.licensing.check_license` (``now``, ``seats_in_use``,
    ``inferences_used``, ``licensee``).  A model without a license block fails closed:
    LicenseError, since a caller who checks a license expects one."""
    from . import licensing

    lic = model_or_license.license if isinstance(model_or_license, V1Model) else model_or_license
    if lic is None:
        raise licensing.LicenseError("the file carries no license block to check")
    licensing.check_license(lic, **kwargs)
