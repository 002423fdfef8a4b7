"""The v1 container's shared checks: magic, header fields, model type, the regions of a file
(metadata, payload, signature, chunk index), the payload kind, downgrade refusal, signature
verification and license decoding; used by :mod:`~aprfast.v1.load`, :class:`~aprfast.v1.reader.V1File`
and :func:`aprfast.stream`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._version import __version__
from ..codecs.payload import Compression
from ..errors import CorruptError, DecryptError, FormatError, LimitError, ModelTypeMismatchError, SignatureError
from ..layouts import chunk_index
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header, ModelType

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


@dataclass
class V1Model:
    """A loaded v1 file, as :func:`aprfast.v1.load_model` returns it.

    Examples:
        >>> from aprfast import v1
        >>> model = v1.load_model(v1.save_model(b"abc", model_type="Svm", compression="lz4"))
        >>> model.payload, model.model_type.name, model.header.compression.name
        (bytearray(b'abc'), 'Svm', 'LZ4')
        >>> model.is_tensors, model.signature, model.encryption
        (False, 'unsigned', 'none')
    """

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
        """The header's model type, as a :class:`ModelType`."""
        return ModelType(self.header.model_type)

    @property
    def is_tensors(self) -> bool:
        """Whether the payload is name -> array (a tensor payload) rather than bytes."""
        return isinstance(self.payload, dict)

    @property
    def trusted(self) -> bool:
        """Whether a key of ``trusted_keys`` signed the file (``signature == TRUSTED``)."""
        return self.signature == TRUSTED

    def check_license(self, **kwargs) -> None:
        """Enforce the file's license (see :func:`check_license`).

        Args:
            **kwargs: ``now``, ``seats_in_use``, ``inferences_used``, ``licensee``, as
                for :func:`aprfast.v1.licensing.check_license`.

        Raises:
            LicenseError: The file has no license, or the license refuses this use.

        Examples:
            >>> from aprfast import v1
            >>> v1.load_model(v1.save_model(b"abc", model_type="Svm")).check_license()
            Traceback (most recent call last):
            ...
            aprfast.errors.LicenseError: [E006] the file carries no license block to check
        """
        check_license(self, **kwargs)


def tag_size() -> int:
    from ..crypto import core as crypto

    return crypto.TAG_SIZE


def reader_of(view):
    """read(offset, n, what) over a whole-file buffer (the Source.read signature)."""
    def read(offset, n, what="range"):
        if offset < 0 or n < 0 or offset + n > len(view):
            raise CorruptError(f"{what} of {n} bytes at offset {offset} lies outside the {len(view)} bytes present")
        return view[offset:offset + n]
    return read


def checked_header(view, expected_type, max_uncompressed, path) -> Header:
    """Magic, the whole-file CRC32, the header, the expected type and the size limit."""
    check_magic(view, path)
    layout.check_crc(view, path=path)
    header = Header.from_bytes(view[:layout.HEADER_SIZE], path=path)
    check_fields(header, expected_type, max_uncompressed, path)
    return header


def check_fields(header: Header, expected_type, max_uncompressed, path) -> None:
    """The expected type and the size limit (after the CRC32 and the header)."""
    check_type(header, expected_type, path)
    if header.uncompressed_size > max_uncompressed:
        raise LimitError(f"header declares {header.uncompressed_size} uncompressed payload bytes, above the limit "
                         f"of {max_uncompressed}", path=path)


def locate(header: Header, read, size: int, path, limits=None):
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


def payload_kind(header: Header, metadata: dict, path) -> str:
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


def refuse_downgrade(header: Header, password, private_key, allow_unencrypted, path) -> None:
    """A caller who gave a key asked for an encrypted file: refuse a plaintext one (an
    attacker who clears ENCRYPTED and fixes the CRC would have their bytes returned)."""
    if header.flags & Flag.ENCRYPTED or (password is None and private_key is None) or allow_unencrypted:
        return
    given = "a password" if password is not None else "a private key"
    raise DecryptError(f"{given} was given but the file is not encrypted (its ENCRYPTED flag is clear): "
                       "refusing a possibly downgraded file; pass allow_unencrypted=True to accept "
                       "plaintext files too", path=path)


def verify_index_signature(read, header: Header, regions, trusted_keys, require_signature, path):
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
    state = signer_state(signer, trusted_keys, path)
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


def whole_file(src) -> memoryview:
    """The file as one buffer: the memory map for files, the buffer itself for bytes;
    other sources are read once."""
    if src.zero_copy:
        return src.buffer()
    return memoryview(src.read(0, src.size, "file"))


def check_magic(view, path) -> None:
    # The magic says what the file is, so it is the one field believed before the CRC.
    if len(view) < 4 or bytes(view[:4]) != layout.MAGIC:
        found = bytes(view[:4])
        raise FormatError(f"magic {found!r} is not {layout.MAGIC!r}: not a v1 .apr file", path=path)


def check_type(header: Header, expected_type, path) -> None:
    if expected_type is None:
        return
    expected = ModelType.from_value(expected_type)
    if header.model_type != expected:
        raise ModelTypeMismatchError(f"model type mismatch: the file holds {ModelType(header.model_type).name} "
                                     f"({int(header.model_type):#06x}), expected {expected.name} "
                                     f"({int(expected):#06x})", path=path)


def verify_signature(view, regions, trusted_keys, require_signature, path):
    """Check the signature before anything signed is used; (state, embedded key)."""
    if regions.signature is None:
        if require_signature:
            raise SignatureError("the file is not signed but a signature is required", path=path)
        return UNSIGNED, None
    start, end = regions.signature
    signature = bytes(view[start:end])
    signer = bytes(view[end:end + layout.PUBLIC_KEY_SIZE])
    state = signer_state(signer, trusted_keys, path)
    from ..crypto import core as crypto

    # One memoryview of the mapped bytes: verified where they lie, never copied.
    try:
        crypto.verify([view[:regions.signed_end]], signature, signer)
    except SignatureError as exc:
        raise SignatureError(f"signature does not verify: {exc.message}", path=path) from None
    return state, signer


def signer_state(signer: bytes, trusted_keys, path) -> str:
    """TRUSTED if the signer is among ``trusted_keys``, SELF_SIGNED without them."""
    if trusted_keys is None:
        return SELF_SIGNED
    trusted = {bytes(key) for key in trusted_keys}
    if signer not in trusted:
        raise SignatureError(f"signed by key {signer.hex()}, which is not among the {len(trusted)} trusted "
                             "key(s)", path=path)
    return TRUSTED


def decrypt_payload(stored, password, private_key, path):
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


def decode_license(metadata: dict, path):
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


def check_license(model_or_license, **kwargs) -> None:
    """Enforce a license (a V1Model's, or a License) with
    :func:`aprfast.v1.licensing.check_license` (``now``, ``seats_in_use``,
    ``inferences_used``, ``licensee``).  A model without a license block fails closed:
    LicenseError, since a caller who checks a license expects one.  docs/FORMAT.md §11.

    Args:
        model_or_license: A :class:`V1Model` or an :class:`aprfast.v1.licensing.License`.
        **kwargs: ``now`` (unix seconds; default the clock), ``seats_in_use``,
            ``inferences_used`` and ``licensee`` (a name that must match).

    Returns:
        None: the use is allowed.

    Raises:
        LicenseError: No license block, or a term refuses this use (every violated
            term is named, with its numbers).

    Examples:
        >>> from aprfast import v1
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License.issue("alice", expires_at=100, now=0,
        ...                     flags=LicenseFlags.EXPIRATION_ENFORCED)
        >>> model = v1.load_model(v1.save_model(b"abc", model_type="Svm", license=lic))
        >>> v1.check_license(model, now=50, licensee="alice")
        >>> v1.check_license(model, now=100)
        Traceback (most recent call last):
        ...
        aprfast.errors.LicenseError: [E006] license ... refused: expired at 1970-01-01T00:01:40Z ...
    """
    from . import licensing

    lic = model_or_license.license if isinstance(model_or_license, V1Model) else model_or_license
    if lic is None:
        raise licensing.LicenseError("the file carries no license block to check")
    licensing.check_license(lic, **kwargs)
