"""The v1 container (``APRN``, aprender's ``save``/``load`` format): the public API.

* :func:`save_model` writes a payload (raw bytes, e.g. a bincode-serialised aprender
  model, or a dict of named arrays) with aprender's header, MessagePack metadata,
  optional compression, encryption, signature and license, and the trailing CRC32.
* :func:`load_model` checks everything in the order the Andon protocol asks (magic,
  CRC32, header, model type, signature, decryption, decompression) and returns a
  :class:`V1Model`.
* :func:`inspect_model` reads only the header and metadata, like aprender's ``inspect``.

The bytes live in :mod:`aprfast.layouts.v1`, compression in :mod:`aprfast.codecs`,
encryption and signatures in :mod:`aprfast.crypto`, licenses in :mod:`aprfast.licensing`.
docs/FORMAT.md (v1 section) records every byte and decision.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import codecs
from ._version import __version__
from .codecs import MAX_UNCOMPRESSED_SIZE, Compression
from .errors import (AprError, AprIOError, CorruptError, DecryptError, FormatError, LayoutError, LimitError,
                     ModelTypeMismatchError, SignatureError)
from .layouts import v1 as layout
from .layouts.v1 import Flag, Header, ModelType
from .sources import open_source

__all__ = [
    "save_model", "load_model", "inspect_model", "check_license", "V1Model", "ModelType", "Compression", "Flag",
    "Header", "MAX_UNCOMPRESSED_SIZE", "PAYLOAD_FORMAT_KEY", "TENSOR_PAYLOAD_FORMAT", "UNSIGNED", "TRUSTED",
    "SELF_SIGNED", "generate_signing_key", "generate_x25519_key", "public_key_of",
]

#: ``metadata["custom"][PAYLOAD_FORMAT_KEY] == TENSOR_PAYLOAD_FORMAT`` marks a payload that
#: is a whole v2 tensor container (aprender's ``APR\\0`` layout) instead of bincode.
PAYLOAD_FORMAT_KEY = "payload_format"
TENSOR_PAYLOAD_FORMAT = "apr-v2-tensors"
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
        from . import crypto

        return getattr(crypto, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class V1Model:
    """A loaded v1 file."""

    header: Header
    #: aprender's metadata as stored (aprfast's internal keys removed).
    metadata: dict
    #: The decompressed, decrypted payload: bytes (stored plainly) or bytearray
    #: (decrypted or decompressed by aprfast, owned, wipeable), or name -> array for
    #: tensor payloads (views of the mapped file or of the decompressed buffer: no copy).
    payload: object
    #: UNSIGNED, TRUSTED or SELF_SIGNED.
    signature: str = UNSIGNED
    #: The embedded Ed25519 public key of a signed file.
    signer: bytes | None = None
    #: "none", "password", "recipient" or "multi-recipient".
    encryption: str = "none"
    #: The decoded binary license block (aprfast.licensing.License), if any.
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
               durable: bool = True):
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
    encryption).  ``license`` (an aprfast.licensing.License) adds aprender's
    ``license`` metadata entry, the binary license block and the LICENSED flag.
    A path is written atomically; ``path`` may also be a writable file object.
    """
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

    stored = codecs.compress(plain, compression)
    if encryption is not None:
        stored = _encrypt(stored, encryption, password, recipient, recipients)
    flags = Flag(0)
    if encryption is not None:
        flags |= Flag.ENCRYPTED
    if public_key is not None:
        flags |= Flag.SIGNED
    if metadata.get("license") is not None:
        flags |= Flag.LICENSED  # as aprender's save: set iff a license is present
    header = Header(model_type, len(metadata_block), len(stored), len(plain), compression, flags, score)
    signature_block = None
    if public_key is not None:
        signature_block = _sign(header, metadata_block, stored, signing_key) + public_key
    parts = layout.assemble(header, metadata_block, stored, signature_block)
    return _emit(parts, path, durable)


def _payload_and_metadata(payload, metadata, model_type):
    """The bytes to store, the metadata dict (defaults filled, a copy) and the type."""
    metadata = dict(metadata or {})
    metadata.setdefault("created_at", str(int(time.time())))
    metadata.setdefault("aprender_version", DEFAULT_APRENDER_VERSION)
    custom = metadata.get("custom") or {}
    if not isinstance(custom, Mapping):
        raise LayoutError(f"metadata 'custom' must be a map of str -> JSON value, not {type(custom).__name__}")
    if isinstance(payload, Mapping):
        from .api import save as save_tensors

        if custom.get(PAYLOAD_FORMAT_KEY, TENSOR_PAYLOAD_FORMAT) != TENSOR_PAYLOAD_FORMAT:
            raise LayoutError(f"metadata custom[{PAYLOAD_FORMAT_KEY!r}] = {custom[PAYLOAD_FORMAT_KEY]!r} "
                              "contradicts a tensor payload")
        # aprender's layout whenever it can hold the tensors, so aprender can read the
        # payload too once it has it; the spec's APR2 layout otherwise.
        plain = save_tensors(payload, layout="auto")
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
    from . import crypto

    if mode == "password":
        return crypto.encrypt_with_password(stored, password)
    if mode == "recipient":
        return crypto.encrypt_for_recipient(stored, recipient)
    return crypto.encrypt_for_recipients(stored, recipients)


def _public_key(signing_key):
    """The Ed25519 public key of ``signing_key`` (checked now, before any heavy work)."""
    if signing_key is None:
        return None
    from . import crypto

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
                          "expiry or seats differ); build it with aprfast.licensing.to_aprender_entry")
    return licensing.encode_license_block(license)


def _sign(header: Header, metadata_block: bytes, stored, signing_key) -> bytes:
    """Ed25519 over header || metadata || stored payload, the parts hashed in place."""
    from . import crypto

    return bytes(crypto.sign([header.to_bytes(), metadata_block, stored], signing_key))


def _emit(parts, path, durable):
    if path is None:
        return b"".join(parts)
    if isinstance(path, (str, os.PathLike)):
        from .writer import AtomicFile

        atomic = AtomicFile(path, durable=durable)
        try:
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


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


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
          allow_unencrypted=False):
    path = src.path
    view = _whole_file(src)
    _check_magic(view, path)
    layout.check_crc(view, path=path)
    header = Header.from_bytes(view[:layout.HEADER_SIZE], path=path)
    _check_type(header, expected_type, path)
    if header.uncompressed_size > max_uncompressed:
        raise LimitError(f"header declares {header.uncompressed_size} uncompressed payload bytes, above the limit "
                         f"of {max_uncompressed}", path=path)
    regions = layout.locate(header, len(view), path=path)
    signature, signer = _verify_signature(view, regions, trusted_keys, require_signature, path)
    metadata = layout.decode_metadata(view[slice(*regions.metadata)], path=path)
    stored = view[slice(*regions.payload)]
    encryption = "none"
    if header.flags & Flag.ENCRYPTED:
        stored, encryption = _decrypt(stored, password, private_key, path)
    elif (password is not None or private_key is not None) and not allow_unencrypted:
        given = "a password" if password is not None else "a private key"
        raise DecryptError(f"{given} was given but the file is not encrypted (its ENCRYPTED flag is clear): "
                           "refusing a possibly downgraded file; pass allow_unencrypted=True to accept "
                           "plaintext files too", path=path)
    plain = codecs.decompress(stored, header.compression, expected_size=header.uncompressed_size,
                              limit=max_uncompressed, path=path)
    license = _decode_license(metadata, path)
    for key in layout.INTERNAL_KEYS:
        metadata.pop(key, None)
    custom = metadata.get("custom")
    if isinstance(custom, dict) and custom.get(PAYLOAD_FORMAT_KEY) == TENSOR_PAYLOAD_FORMAT:
        payload = _tensors(plain, path)
    else:
        # A decrypted or decompressed payload is already an owned bytearray (which the
        # caller may wipe); copying it to bytes would hold the model twice.  A payload
        # stored plainly is copied out of the map so the file can be closed.
        payload = plain if isinstance(plain, bytearray) else bytes(plain)
    return V1Model(header, metadata, payload, signature, signer, encryption, license, header.flag_set)


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
    state = SELF_SIGNED
    if trusted_keys is not None:
        trusted = {bytes(key) for key in trusted_keys}
        if signer not in trusted:
            raise SignatureError(f"signed by key {signer.hex()}, which is not among the {len(trusted)} trusted "
                                 "key(s)", path=path)
        state = TRUSTED
    from . import crypto

    # One memoryview of the mapped bytes: verified where they lie, never copied.
    try:
        crypto.verify([view[:regions.signed_end]], signature, signer)
    except SignatureError as exc:
        raise SignatureError(f"signature does not verify: {exc.message}", path=path) from None
    return state, signer


def _decrypt(stored, password, private_key, path):
    """The compressed plaintext and the mode.  aprender's header has no mode byte: a
    password means password mode; with a private key, a multi-recipient payload says
    so itself (magic "APRM"), anything else is single-recipient, whose 8-byte key hint
    is compared before anything is decrypted."""
    from . import crypto

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

    from .reader import AprFile

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
    :func:`aprfast.licensing.check_license` (``now``, ``seats_in_use``,
    ``inferences_used``, ``licensee``).  A model without a license block fails closed:
    LicenseError, since a caller who checks a license expects one."""
    from . import licensing

    lic = model_or_license.license if isinstance(model_or_license, V1Model) else model_or_license
    if lic is None:
        raise licensing.LicenseError("the file carries no license block to check")
    licensing.check_license(lic, **kwargs)
