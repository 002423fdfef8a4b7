"""The v1 container (``APRN``) as aprender writes it: the bytes, parsed and built.

```
[0, 32)             header
[32, 32+M)          metadata: MessagePack (rmp_serde::to_vec_named of aprender's Metadata)
[32+M, 32+M+P)      payload as stored: compressed, then (ENCRYPTED) crypto prefix + AEAD
[.., +96)           SIGNED only: Ed25519 signature (64) || public key (32)
[end-4, end)        CRC32 (u32 LE) of every byte before it
```

No padding or alignment anywhere.  This module knows the header, the metadata schema
and where each region lies; what the payload means (codecs, crypto, tensors) is the
business of :mod:`aprfast.v1`.  docs/FORMAT.md (v1 section) has the byte tables and the
decisions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag

from .._crc import crc32
from ..codecs.payload import Compression
from ..errors import ChecksumError, CorruptError, FormatError, LayoutError, LimitError, VersionError
from ..limits import MAX_METADATA_SIZE
from . import rmp as _rmp

__all__ = [
    "NAME", "MAGIC", "HEADER_SIZE", "CRC_SIZE", "SIGNATURE_SIZE", "PUBLIC_KEY_SIZE", "SIGNATURE_BLOCK_SIZE",
    "FORMAT_VERSION", "ModelType", "Flag", "Header", "Regions", "METADATA", "LICENSE_BLOCK_KEY", "PAD_KEY",
    "encode_metadata", "decode_metadata", "check_crc", "locate", "assemble", "inspect",
]

NAME = "v1"
MAGIC = b"APRN"
HEADER_SIZE = 32
CRC_SIZE = 4
SIGNATURE_SIZE = 64
PUBLIC_KEY_SIZE = 32
SIGNATURE_BLOCK_SIZE = SIGNATURE_SIZE + PUBLIC_KEY_SIZE
FORMAT_VERSION = (1, 0)
_U32_MAX = 0xFFFFFFFF
_HEADER = struct.Struct("<4sBBHIIIBBB9s")


class ModelType(IntEnum):
    """aprender's ``ModelType`` (``#[repr(u16)]``); member names are its variant names,
    which is also how the metadata spells a model type (``teacher.model_type``).

    docs/FORMAT.md §9 ("Header") lists the ids.

    Examples:
        >>> from aprfast.v1 import ModelType
        >>> int(ModelType.KMeans), ModelType(0x21).name
        (6, 'NeuralCustom')
    """

    LinearRegression = 0x0001
    LogisticRegression = 0x0002
    DecisionTree = 0x0003
    RandomForest = 0x0004
    GradientBoosting = 0x0005
    KMeans = 0x0006
    Pca = 0x0007
    NaiveBayes = 0x0008
    Knn = 0x0009
    Svm = 0x000A
    NgramLm = 0x0010
    Tfidf = 0x0011
    CountVectorizer = 0x0012
    NeuralSequential = 0x0020
    NeuralCustom = 0x0021
    ContentRecommender = 0x0030
    MixtureOfExperts = 0x0040
    Custom = 0x00FF

    @property
    def aprender_name(self) -> str:
        """aprender's name of the variant (the member's name)."""
        return self.name

    @classmethod
    def from_value(cls, value) -> "ModelType":
        """A ModelType from a member, an id or aprender's variant name.

        Args:
            value: A :class:`ModelType`, its id (int) or its name ("KMeans").

        Returns:
            The member.

        Raises:
            ValueError: An unknown name.
            FormatError: An id aprender does not define.
            TypeError: Neither a member, an int nor a str.

        Examples:
            >>> from aprfast.v1 import ModelType
            >>> ModelType.from_value("Pca") is ModelType.from_value(7) is ModelType.Pca
            True
            >>> ModelType.from_value(0x77)
            Traceback (most recent call last):
            ...
            aprfast.errors.FormatError: [E001] model type id 0x0077 is not one aprender defines
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value]
            except KeyError:
                raise ValueError(f"unknown model type {value!r}; aprender's are {', '.join(cls.__members__)}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"model_type must be a ModelType, an id or a name, not {type(value).__name__}")
        try:
            return cls(value)
        except ValueError:
            raise FormatError(f"model type id {value:#06x} is not one aprender defines") from None


class Flag(IntFlag):
    """Header byte 21.  aprender masks bit 7 off when it reads.

    docs/FORMAT.md §9 ("Flags (byte 21)") says what each flag means to aprender and aprfast.

    Examples:
        >>> from aprfast.v1 import Flag
        >>> int(Flag.ENCRYPTED | Flag.SIGNED), Flag.LICENSED in Flag(0x0A)
        (3, True)
    """

    ENCRYPTED = 0x01
    SIGNED = 0x02
    STREAMING = 0x04
    LICENSED = 0x08
    TRUENO_NATIVE = 0x10
    QUANTIZED = 0x20
    HAS_MODEL_CARD = 0x40


_FLAG_MASK = 0x7F
#: STREAMING moves a chunk index in front of the payload (seed 000 §6): the payload can
#: be located only with the index's size (aprfast's layout: layouts/chunk_index.py), so
#: :func:`locate` refuses the flag unless it is given ``index_size``.
UNREADABLE_FLAGS = Flag.STREAMING


# --- header ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Header:
    """The 32-byte header.  ``flags`` holds byte 21 as stored (bit 7 included).

    docs/FORMAT.md §9 ("Header (32 bytes)") has the byte table.

    Examples:
        >>> from aprfast.v1 import Header, ModelType
        >>> raw = Header(ModelType.Svm, metadata_size=3, flags=0x82).to_bytes()
        >>> raw[:4], len(raw)
        (b'APRN', 32)
        >>> header = Header.from_bytes(raw)
        >>> header.model_type.name, header.flags, int(header.flag_set)
        ('Svm', 130, 2)
    """

    model_type: int
    metadata_size: int = 0
    payload_size: int = 0
    uncompressed_size: int = 0
    compression: int = 0
    flags: int = 0
    quality_score: int = 0
    version: tuple = FORMAT_VERSION
    reserved: bytes = bytes(9)

    def to_bytes(self) -> bytes:
        """The 32 bytes of this header (magic, version, fields, reserved bytes).

        Returns:
            32 bytes.

        Raises:
            LayoutError: A size that does not fit a u32, or a quality score above 255.

        Examples:
            >>> from aprfast.v1 import Header
            >>> Header(1, payload_size=2**32).to_bytes()
            Traceback (most recent call last):
            ...
            aprfast.errors.LayoutError: [E001] v1 payload_size is a u32; 4294967296 does not fit
        """
        for name in ("metadata_size", "payload_size", "uncompressed_size"):
            value = getattr(self, name)
            if not 0 <= value <= _U32_MAX:
                raise LayoutError(f"v1 {name} is a u32; {value} does not fit")
        if not 0 <= self.quality_score <= 255:
            raise LayoutError(f"quality_score is a u8; {self.quality_score} does not fit")
        return _HEADER.pack(MAGIC, self.version[0], self.version[1], int(self.model_type), self.metadata_size,
                            self.payload_size, self.uncompressed_size, int(self.compression), int(self.flags),
                            self.quality_score, self.reserved)

    @classmethod
    def from_bytes(cls, data, *, path=None) -> "Header":
        """Parse and check a header as aprender's ``Header::from_bytes`` does: magic,
        major version <= 1 (the minor is ignored), a known model type and compression
        id.  Reserved bytes are not checked; flags are kept as stored.

        Args:
            data: At least 32 bytes (only the first 32 are read).
            path: The file's path, named in errors.

        Returns:
            The header, ``model_type`` and ``compression`` as members.

        Raises:
            FormatError: Fewer than 32 bytes, another magic, or an unknown model type id.
            VersionError: A newer major version, or an unknown compression id.

        Examples:
            >>> from aprfast.v1 import Header
            >>> Header.from_bytes(b"APR2" + bytes(28))
            Traceback (most recent call last):
            ...
            aprfast.errors.FormatError: [E001] magic b'APR2' is not b'APRN': not a v1 .apr file
        """
        if len(data) < HEADER_SIZE:
            raise FormatError(f"{len(data)} bytes cannot hold the {HEADER_SIZE}-byte v1 header", path=path)
        (magic, major, minor, model_type, metadata_size, payload_size, uncompressed_size, compression, flags,
         quality_score, reserved) = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise FormatError(f"magic {magic!r} is not {MAGIC!r}: not a v1 .apr file", path=path)
        if major > FORMAT_VERSION[0]:
            raise VersionError(f"v1 container version {major}.{minor} is newer than 1.x, the version this "
                               "build reads", path=path)
        if model_type not in ModelType._value2member_map_:
            raise FormatError(f"model type id {model_type:#06x} is not one aprender defines", path=path)
        if compression not in Compression._value2member_map_:
            raise VersionError(f"compression id {compression} is not one aprender defines (0-3)", path=path)
        return cls(ModelType(model_type), metadata_size, payload_size, uncompressed_size, Compression(compression),
                   flags, quality_score, (major, minor), bytes(reserved))

    @property
    def flag_set(self) -> Flag:
        """The flags aprender sees (bit 7 masked off)."""
        return Flag(self.flags & _FLAG_MASK)

    def as_dict(self) -> dict:
        """The fields as JSON-ready values, with names (what ``apr inspect`` prints).

        Examples:
            >>> from aprfast.v1 import Header
            >>> Header(6, flags=0x03).as_dict()["flag_names"]
            ['ENCRYPTED', 'SIGNED']
        """
        return {
            "magic": MAGIC.decode(),
            "version": list(self.version),
            "model_type": int(self.model_type),
            "model_type_name": ModelType(self.model_type).name,
            "metadata_size": self.metadata_size,
            "payload_size": self.payload_size,
            "uncompressed_size": self.uncompressed_size,
            "compression": int(self.compression),
            "compression_name": Compression(self.compression).aprender_name,
            "flags": self.flags & _FLAG_MASK,
            "flags_raw": self.flags,
            "flag_names": [f.name for f in Flag if self.flags & f],
            "quality_score": self.quality_score,
            "reserved_hex": self.reserved.hex(),
        }


# --- metadata schema (aprender's Metadata, apr-format 0.72 types.rs / model_card.rs) ------
S, J = _rmp.Str(), _rmp.JsonMap()
U32, U64, F32 = _rmp.UInt(32), _rmp.UInt(64), _rmp.F32()
F = _rmp.Field

_TRAINING = _rmp.Struct("TrainingInfo", [F("samples", U64, "none"), F("duration_ms", U64, "none"),
                                         F("source", S, "none")])
_TEACHER = _rmp.Struct("TeacherProvenance", [
    F("hash", S), F("signature", S, "none"), F("model_type", _rmp.Enum("ModelType", ModelType.__members__)),
    F("param_count", U64)])
# The struct is recursive: ensemble_teachers is a list of TeacherProvenance.
_TEACHER.fields += (F("ensemble_teachers", _rmp.Seq(_TEACHER), "none"),)
_TEACHER.names = frozenset(f.name for f in _TEACHER.fields)
_DISTILLATION = _rmp.Struct("DistillationInfo", [
    F("method", _rmp.Enum("DistillMethod", ("Standard", "Progressive", "Ensemble"))),
    F("teacher", _TEACHER),
    F("params", _rmp.Struct("DistillationParams", [
        F("temperature", F32), F("alpha", F32), F("beta", F32, "none"), F("epochs", U32),
        F("final_loss", F32, "none")])),
    F("layer_mapping", _rmp.Seq(_rmp.Struct("LayerMapping", [
        F("student_layer", U64), F("teacher_layer", U64), F("weight", F32)])), "none"),
])
_LICENSE = _rmp.Struct("LicenseInfo", [
    F("uuid", S), F("hash", S), F("expiry", S, "none"), F("seats", U32, "none"), F("licensee", S, "none"),
    F("tier", _rmp.Enum("LicenseTier", ("Personal", "Team", "Enterprise", "Academic")))])
_MODEL_CARD = _rmp.Struct("ModelCard", [
    F("model_id", S), F("name", S), F("version", S), F("author", S, "none"), F("created_at", S),
    F("framework_version", S), F("rust_version", S, "none"), F("description", S, "none"),
    F("license", S, "none"),
    F("training_data", _rmp.Struct("TrainingDataInfo", [F("name", S), F("samples", U64, "none"),
                                                        F("hash", S, "none")]), "none"),
    F("hyperparameters", J, "empty"), F("metrics", J, "empty"), F("architecture", S, "none"),
    F("param_count", U64, "none"), F("target_hardware", _rmp.Seq(S), "empty"),
], flatten=True)  # `extra`: every other key, written after the fields

#: aprfast's own top-level keys, written after aprender's fields.  rmp_serde skips
#: unknown struct fields, so aprender reads such files and never sees these.
LICENSE_BLOCK_KEY = "license_block"
PAD_KEY = "payload_pad"
INTERNAL_KEYS = (LICENSE_BLOCK_KEY, PAD_KEY)

METADATA = _rmp.Struct("Metadata", [
    F("created_at", S), F("aprender_version", S), F("model_name", S, "none"), F("description", S, "none"),
    F("training", _TRAINING, "none"), F("hyperparameters", J, "empty"), F("metrics", J, "empty"),
    F("custom", J, "empty"), F("distillation", S, "none"), F("distillation_info", _DISTILLATION, "none"),
    F("license", _LICENSE, "none"), F("model_card", _MODEL_CARD, "none"),
], extra=(F(LICENSE_BLOCK_KEY, _rmp.Bin(), "none"), F(PAD_KEY, _rmp.Bin(), "none")))
del S, J, U32, U64, F32, F


def encode_metadata(metadata: dict, *, license_block: bytes | None = None, align_end_to: int = 0) -> bytes:
    """The metadata block: ``metadata`` as rmp_serde writes aprender's ``Metadata``.

    ``license_block`` adds aprfast's binary license block under its own key.
    ``align_end_to`` (a power of two, or 0) adds a zero-filled ``payload_pad`` entry so
    that the payload after this block starts at a multiple of it in the file.
    Raises LayoutError for anything aprender's struct could not hold.
    """
    metadata = dict(metadata)
    internal = [k for k in INTERNAL_KEYS if k in metadata]
    if internal:
        raise LayoutError(f"metadata key(s) {internal} are reserved for aprfast's own use")
    if license_block is not None:
        metadata[LICENSE_BLOCK_KEY] = bytes(license_block)
    try:
        block = _rmp.encode(METADATA, metadata, "metadata")
        if align_end_to > 1:
            block = _padded(metadata, block, align_end_to)
    except _rmp.SchemaError as exc:
        raise LayoutError(f"metadata cannot be written as aprender's v1 Metadata: {exc}") from None
    if len(block) > _U32_MAX:
        raise LayoutError(f"metadata is {len(block)} bytes; the header's u32 cannot hold that")
    return block


def _padded(metadata: dict, unpadded: bytes, alignment: int) -> bytes:
    """Re-encode with a ``payload_pad`` of k zero bytes, k chosen so the block ends on
    ``alignment`` in the file.  The pad entry costs a fixstr key, a 2-byte bin8 head and
    k bytes (k < 256 keeps bin8); the map header may grow by the extra entry too."""
    trial = _rmp.encode(METADATA, {**metadata, PAD_KEY: b""}, "metadata")
    k = -(HEADER_SIZE + len(trial)) % alignment
    block = _rmp.encode(METADATA, {**metadata, PAD_KEY: bytes(k)}, "metadata") if k else trial
    assert (HEADER_SIZE + len(block)) % alignment == 0 and len(unpadded) <= len(block)
    return block


def decode_metadata(data, *, path=None) -> dict:
    """The metadata block as a dict (MessagePack decoded as is; f32 values widened to
    Python floats exactly).  Invalid MessagePack or a non-map is CorruptError.

    :mod:`aprfast._metascan` looks at the block first, building nothing: a top level
    that is not a map, malformed MessagePack or nesting deeper than 1024 is refused
    (E002), and so is a block whose decode would take more memory than its budget
    (E008), before ``msgpack.unpackb`` sees it."""
    from .. import _metascan
    from .._optional import require

    msgpack = require("msgpack")

    _metascan.check_msgpack(data, path)
    try:
        # unpackb bounds every length by the input's size, so a lying length cannot
        # make it allocate; strict_map_key keeps keys to str/bytes.
        value = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError,
            UnicodeDecodeError, RecursionError) as exc:
        raise CorruptError(f"metadata is not valid MessagePack: {exc}", path=path) from None
    if not isinstance(value, dict):
        raise CorruptError(f"metadata is a MessagePack {type(value).__name__}, not a map", path=path)
    return value


# --- regions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Regions:
    """Absolute [start, end) offsets of each region of one file."""

    metadata: tuple
    payload: tuple
    signature: tuple | None  # the 64-byte signature; the 32-byte key follows it
    crc_offset: int
    index: tuple | None = None  # STREAMING only: the chunk index, between metadata and payload

    @property
    def signed_end(self) -> int:
        """End of what the signature covers: header || metadata || [index ||] payload."""
        return self.payload[1]


def check_crc(view, *, path=None) -> None:
    """The trailing CRC32 against every byte before it (checked before anything else is
    believed).  ``view`` is the whole file."""
    size = len(view)
    if size < HEADER_SIZE + CRC_SIZE:
        raise FormatError(f"{size} bytes is too short for a v1 file (at least {HEADER_SIZE + CRC_SIZE})",
                          path=path)
    stored = int.from_bytes(view[size - CRC_SIZE:], "little")
    actual = crc32(view[:size - CRC_SIZE])
    if stored != actual:
        raise ChecksumError(f"CRC32 stored in the last 4 bytes is {stored:#010x} but bytes 0..{size - CRC_SIZE} "
                            f"give {actual:#010x}", path=path)


def locate(header: Header, size: int, *, path=None, max_metadata: int | None = None,
           index_size: int | None = None) -> Regions:
    """Where each region of a ``size``-byte file lies, checking that the header's sizes
    and flags account for every byte: nothing may stick out, and nothing may be left
    unexplained between the payload and the CRC (aprender's writers never leave any).
    ``index_size`` is the chunk index's size (STREAMING files only, read from the
    index's own header by the caller: :func:`aprfast.layouts.chunk_index.peek_size`)."""
    limit = MAX_METADATA_SIZE if max_metadata is None else max_metadata
    if header.metadata_size > limit:
        raise LimitError(f"metadata declares {header.metadata_size} bytes, above the limit of {limit}", path=path)
    streaming = bool(header.flag_set & UNREADABLE_FLAGS)
    if streaming and index_size is None:
        raise VersionError(f"flag(s) {header.flag_set & UNREADABLE_FLAGS!r} are set: the payload lies after a "
                           "chunk index whose size was not read, so it cannot be located", path=path)
    if index_size is not None and not streaming:
        raise CorruptError("a chunk index was given but the STREAMING flag is clear", path=path)
    meta_end = HEADER_SIZE + header.metadata_size
    payload_start = meta_end + (index_size or 0)
    payload_end = payload_start + header.payload_size
    signed = bool(header.flags & Flag.SIGNED)
    blocks_end = payload_end + (SIGNATURE_BLOCK_SIZE if signed else 0)
    crc_offset = size - CRC_SIZE
    if blocks_end > crc_offset:
        raise CorruptError(f"header declares {header.metadata_size} metadata + "
                           f"{f'{index_size} chunk index + ' if index_size else ''}{header.payload_size} payload bytes"
                           f"{' + a 96-byte signature block' if signed else ''}, ending at {blocks_end}, but the "
                           f"CRC starts at {crc_offset} (truncated file or lying sizes)", path=path)
    if blocks_end < crc_offset:
        raise CorruptError(f"{crc_offset - blocks_end} bytes between the end of the "
                           f"{'signature block' if signed else 'payload'} ({blocks_end}) and the CRC "
                           f"({crc_offset}) are not explained by the header", path=path)
    return Regions((HEADER_SIZE, meta_end), (payload_start, payload_end),
                   (payload_end, payload_end + SIGNATURE_SIZE) if signed else None, crc_offset,
                   (meta_end, payload_start) if streaming else None)


def assemble(header: Header, metadata: bytes, payload, signature_block: bytes | None = None) -> list:
    """The file as a list of parts (no part is copied), the CRC32 last."""
    parts = [header.to_bytes(), metadata, payload]
    if signature_block is not None:
        if len(signature_block) != SIGNATURE_BLOCK_SIZE:
            raise LayoutError(f"a signature block is {SIGNATURE_BLOCK_SIZE} bytes, not {len(signature_block)}")
        parts.append(signature_block)
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    parts.append(crc.to_bytes(CRC_SIZE, "little"))
    return parts


def inspect(source) -> dict:
    """Header and metadata, like aprender's ``inspect``: no CRC check, nothing decrypted.
    ``source`` is an :class:`aprfast.io.sources.Source`.  aprfast's own keys are left out
    of the metadata (the license block is reported by size)."""
    header = Header.from_bytes(bytes(source.read(0, HEADER_SIZE, "v1 header")), path=source.path)
    if header.metadata_size > MAX_METADATA_SIZE:
        raise LimitError(f"metadata declares {header.metadata_size} bytes, above the limit of "
                         f"{MAX_METADATA_SIZE}", path=source.path)
    raw = source.read(HEADER_SIZE, header.metadata_size, "v1 metadata")
    metadata = decode_metadata(raw, path=source.path)
    block = metadata.get(LICENSE_BLOCK_KEY)
    for key in INTERNAL_KEYS:
        metadata.pop(key, None)
    info = {"layout": NAME, "header": header.as_dict(), "metadata": metadata}
    if isinstance(block, (bytes, bytearray)):
        info["license_block_size"] = len(block)
    return info
