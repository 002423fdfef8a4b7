"""Loading a whole v1 file: :func:`load_model` checks everything in the order the Andon
protocol asks (magic, CRC32, header, model type, signature, decryption, decompression)."""

from __future__ import annotations

from .._crc import crc32
from ..codecs import payload as codecs
from ..codecs.payload import MAX_UNCOMPRESSED_SIZE, Compression
from ..errors import AprError, DecryptError
from ..io import platform as _platform
from ..io.sources import open_source
from ..layouts import trueno
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header
from .checks import (
    V1Model,
    check_fields,
    checked_header,
    decode_license,
    decrypt_payload,
    locate,
    payload_kind,
    reader_of,
    refuse_downgrade,
    verify_index_signature,
    verify_signature,
    whole_file,
)
from .chunks import open_chunks


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
    read-only views of the map with their strides (trueno-native).  To read one tensor
    of a large file without the rest, open it with :func:`aprfast.open` (a
    :class:`aprfast.v1.reader.V1File`).  docs/FORMAT.md §9 ("Reading: order of checks")
    and docs/guide/older-files.md.

    Args:
        source: A path, a readable file object or a bytes-like object.
        expected_type: Refuse a file of another :class:`ModelType` (member, id or name).
        password: Decrypt a password-encrypted payload.
        private_key: Decrypt a payload encrypted for this X25519 private key.
        trusted_keys: Ed25519 public keys (32 bytes each) one of which must have signed.
        require_signature: Refuse an unsigned file (default: when ``trusted_keys`` given).
        max_uncompressed: Most bytes the payload may decompress to.
        allow_unencrypted: With ``password``/``private_key``, accept a plaintext file too.

    Returns:
        A :class:`V1Model`: header, metadata, payload (bytes, or name -> array for a
        tensor payload), signature state, signer, encryption mode and license.

    Raises:
        FormatError: Not a v1 file (magic), or an unknown model type id.
        ChecksumError: The trailing CRC32 does not match.
        VersionError: A newer major version or an unknown compression id.
        ModelTypeMismatchError: The file holds another model type than ``expected_type``.
        CorruptError: Region sizes, metadata or payload that contradict the header.
        SignatureError: A bad signature, an untrusted signer or a missing required one.
        DecryptError: A wrong password or key, no key for an encrypted file, or a
            plaintext file where a key was given.
        LimitError: The payload would decompress beyond ``max_uncompressed``.
        AprFileNotFoundError: ``source`` names no file (an :class:`AprIOError`).
        ValueError: Both ``password`` and ``private_key``.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> seed, public = v1.generate_signing_key()
        >>> v1.save_model({"w": np.float32([1.5, 2.5])}, "m.apr", signing_key=seed)
        >>> model = v1.load_model("m.apr", trusted_keys=[public])
        >>> model.model_type.name, model.signature, model.payload["w"].tolist()
        ('NeuralCustom', 'trusted', [1.5, 2.5])
        >>> v1.load_model("m.apr", expected_type="LinearRegression")
        Traceback (most recent call last):
        ...
        aprfast.errors.ModelTypeMismatchError: [E001] m.apr: model type mismatch: ...
    """
    if password is not None and private_key is not None:
        raise ValueError("give password= or private_key=, not both")
    if require_signature is None:
        require_signature = trusted_keys is not None
    src = open_source(source)
    try:
        return load_payload(src, expected_type, password, private_key, trusted_keys, require_signature,
                            max_uncompressed, allow_unencrypted)
    finally:
        # Arrays handed out keep the map alive; closing only drops our handle.
        src.close()


def load_payload(src, expected_type, password, private_key, trusted_keys, require_signature, max_uncompressed,
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
    view = whole_file(src)
    header = checked_header(view, expected_type, max_uncompressed, path)
    regions = locate(header, reader_of(view), len(view), path)
    if verified is None:
        verified = verify_signature(view, regions, trusted_keys, require_signature, path)
    signature, signer = verified
    metadata = layout.decode_metadata(view[slice(*regions.metadata)], path=path)
    kind = payload_kind(header, metadata, path)
    stored = view[slice(*regions.payload)]
    encryption = "none"
    if kind == "chunks":
        if header.flags & Flag.SIGNED:  # so that load_model and V1File accept the same files
            verify_index_signature(reader_of(view), header, regions, [signer], False, path)
        chunks = open_chunks(reader_of(view), header, regions, path, None, True, password, private_key,
                              allow_unencrypted)
        encryption = chunks.encryption
        try:
            payload = chunks.all_tensors(reader_of(view))
        finally:
            chunks.close()
    elif kind == "trueno":
        refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        payload = _trueno_tensors(view, regions, path)
    else:
        if header.flags & Flag.ENCRYPTED:
            private = _private_payload(src, regions) if password is not None else None
            if private is not None:  # the plaintext replaces the ciphertext: no second copy
                stored, encryption = _decrypt_in_place(private, password, path), "password"
            else:
                stored, encryption = decrypt_payload(stored, password, private_key, path)
        else:
            refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        plain = codecs.decompress(stored, header.compression, expected_size=header.uncompressed_size,
                                  limit=max_uncompressed, path=path)
    license = decode_license(metadata, path)
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
        kind = payload_kind(header, metadata, path)
        if kind != "bytes" and not (sealed and kind == "tensors"):
            return None
        # What load_model checks after the CRC and before the payload, tried now on the
        # same bytes so that a file these refuse is not read (the full path reports it).
        check_fields(header, expected_type, max_uncompressed, path)
        signature, signer = verify_signature(None, regions, trusted_keys, require_signature, path)
        if not sealed:
            refuse_downgrade(header, password, private_key, allow_unencrypted, path)
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
    license = decode_license(metadata, path)
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
