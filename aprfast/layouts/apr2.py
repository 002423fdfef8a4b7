"""The v2 tensor container as the APR 2.0 spec draws it (seed 001 §3.2-3.7): magic
``APR2``, 32-byte header with u32 flags and section offsets, JSON metadata carrying
``apr_version``, a binary index with an 8-byte index header and per-tensor
``raw_size`` and flags, tensors aligned to 64 (or 32) bytes, and a 16-byte footer
``crc32 | "2RPA" | u64 file_size``.

Where the spec is silent aprfast decides, and docs/FORMAT.md §3 records each choice:
metadata at byte 32 then the index with no gap, one padding run before the data,
every tensor padded to the alignment, offsets relative to the data section, and
dtype ids from 32 up for types the spec lacks.

Encrypted and signed files (ENCRYPTED/SIGNED, aprfast's design: docs/FORMAT.md §3.2)
add a security block between the index and the data; everything else keeps this
module's layout, and the checks and sealing live in :mod:`aprfast.security`.
"""

from __future__ import annotations

import struct

from .. import security as _security
from ..codecs import blocks as tensor_codecs
from ..dtypes import APR2_IDS
from ..errors import CorruptError, FormatError, LayoutError, LimitError, VersionError
from ..limits import MAX_ALIGNMENT, Limits
from . import serde_json as _serde_json
from ._common import (
    STREAM_END,
    ParsedFile,
    Plan,
    align,
    check_reserve,
    checked_inputs,
    encode_index,
    find_aliases,
    footer,
    lay_out_data,
    lay_out_in_order,
    lay_out_shared,
    parse_index,
    rule_tables,
    sorted_json,
    with_opaque_names,
)

NAME = "apr2"
MAGIC = b"APR2"
FOOTER_MAGIC = b"2RPA"
HEADER_SIZE = 32
#: A file saved with ``reserve`` (room for in-place edits) keeps [HEADER_SIZE, SLOT_END)
#: unreferenced: the commit slot an in-place edit writes with the header (docs/FORMAT.md §5.2).
SLOT_END = 64
FOOTER_SIZE = 16
INDEX_HEADER_SIZE = 8
APR_VERSION = "2.0.0"
MAX_NAME_BYTES = 65535
MAX_DIMS = 8

FLAGS = {"COMPRESSED": 0x01, "ALIGNED_64": 0x02, "ALIGNED_32": 0x04, "SHARDED": 0x08,
         "ENCRYPTED": 0x10, "SIGNED": 0x20, "QUANTIZED": 0x40, "STREAMING": 0x80}
_ALIGNMENT_FLAG = {64: FLAGS["ALIGNED_64"], 32: FLAGS["ALIGNED_32"]}
# Features the spec names that this build does not implement yet: refuse, don't misread.
# (COMPRESSED is per-tensor compression, aprfast.codecs.blocks: docs/FORMAT.md §3.1.)
# (ENCRYPTED and SIGNED are aprfast.security: docs/FORMAT.md §3.2.)
_UNSUPPORTED = FLAGS["STREAMING"]

_HEADER = struct.Struct("<4sHHIIIIII")
_FOOTER = struct.Struct("<I4sQ")
_RULES = rule_tables(APR2_IDS)


def caller_metadata(stored: dict) -> dict:
    """The metadata as the writer's caller gave it: without the ``apr_version`` key this
    layout adds to every file."""
    if stored.get("apr_version") == APR_VERSION:
        return {k: v for k, v in stored.items() if k != "apr_version"}
    return dict(stored)


def encode_metadata(metadata: dict) -> bytes:
    """Compact JSON: ``apr_version`` first, then every key sorted, recursively."""
    metadata = dict(metadata or {})
    version = metadata.pop("apr_version", APR_VERSION)
    if version != APR_VERSION:
        raise LayoutError(f"apr_version {version!r} cannot be written; this layout writes {APR_VERSION!r}")
    ordered = {"apr_version": APR_VERSION, **sorted_json(metadata)}
    try:
        return _serde_json.dumps(ordered)
    except (ValueError, TypeError) as exc:
        raise LayoutError(f"metadata cannot be written as JSON: {exc}") from None


def plan(inputs, metadata, *, alignment: int = 64, in_given_order: bool = False, compression=None,
         compression_level=None, security=None, reserve: int = 0) -> Plan:
    """Lay out a file; ``in_given_order``: data in the order of ``inputs`` (the index is
    sorted either way).  With ``compression`` ("lz4", "zstd") every tensor that
    compresses is stored as independent blocks (aprfast.codecs.blocks), the rest as is.
    ``security`` (aprfast.security.SecurityOptions) seals and/or signs the file: a
    security block after the index, each tensor's stored bytes sealed in chunks.
    ``reserve`` > 0 leaves the commit slot [32, 64) and at least ``reserve`` zero bytes
    before the data, room for :func:`aprfast.edit` in place."""
    if alignment not in _ALIGNMENT_FLAG:
        raise LayoutError(f"the apr2 layout aligns tensors to 64 or 32 bytes, not {alignment}")
    reserve = check_reserve(reserve)
    if compression is not None:
        tensor_codecs.codec_id(compression)  # an unknown codec is refused before any work
    ordered = checked_inputs(inputs, APR2_IDS, max_name_bytes=MAX_NAME_BYTES, max_dims=MAX_DIMS)
    meta = encode_metadata(with_opaque_names(ordered, metadata))
    if compression is not None:
        if in_given_order:
            raise LayoutError("compression needs every tensor's bytes before the index is written; "
                              "a Writer streaming a declared plan cannot compress")
        ordered = tensor_codecs.compress_inputs(ordered, compression, compression_level)
    if security is not None and in_given_order:
        raise LayoutError("encryption and signing need every tensor's bytes before the index is written; "
                          "a Writer streaming a declared plan cannot seal or sign")
    compressed = any(isinstance(t, tensor_codecs.StoredTensor) for t in ordered)
    meta_offset = SLOT_END if reserve else HEADER_SIZE
    index_offset = meta_offset + len(meta)
    data = ordered
    # a secured file seals each name's bytes under its own index position: no sharing
    aliases = find_aliases(ordered) if compression is None and not in_given_order and security is None else {}
    if in_given_order:
        data, offsets, pads, data_len = lay_out_in_order(ordered, inputs, alignment)
    elif aliases:  # one storage under several names: its bytes once, every name pointing at them
        data, offsets, pads, data_len = lay_out_shared(ordered, aliases, alignment)
    else:
        offsets, pads, data_len = lay_out_data(ordered, alignment)
    index = struct.pack("<II", len(ordered), 0) + encode_index(ordered, offsets, APR2_IDS, spec_layout=True,
                                                               codecs=compressed)
    sealer = security.sealer(ordered) if security is not None else None
    block_size = sealer.size if sealer is not None else 0
    data_start = align(index_offset + len(index) + block_size + reserve, alignment)
    if data_start >= 2**32:
        raise LayoutError(f"metadata and index end at byte {data_start}; the apr2 header's u32 offsets "
                          "stop at 4 GiB")
    flags = _ALIGNMENT_FLAG[alignment]
    if any(t.dtype.packed for t in ordered):
        flags |= FLAGS["QUANTIZED"]
    if compressed:
        flags |= FLAGS["COMPRESSED"]
    if sealer is not None:
        encrypted, signed = sealer.header_flags
        flags |= (FLAGS["ENCRYPTED"] if encrypted else 0) | (FLAGS["SIGNED"] if signed else 0)
    header = pack_header(flags, meta_offset, len(meta), index_offset, len(index), data_start)
    block = b""
    if sealer is not None:  # metadata and index as stored (sealed with encrypt_names), data sealed
        meta, index, block, data = sealer.finish(header, meta, index)
    prefix = (header + bytes(meta_offset - HEADER_SIZE) + meta + index + block
              + bytes(data_start - index_offset - len(index) - len(block)))
    total = data_start + data_len + FOOTER_SIZE
    return Plan(NAME, prefix, data, pads, total, lambda crc: _FOOTER.pack(crc, FOOTER_MAGIC, total))


def pack_header(flags, meta_offset, meta_size, index_offset, index_size, data_offset, version=(2, 0)) -> bytes:
    """The 32-byte header."""
    return _HEADER.pack(MAGIC, version[0], version[1], flags, meta_offset, meta_size, index_offset, index_size,
                        data_offset)


def pack_footer(crc: int, file_size: int) -> bytes:
    """The 16-byte footer: the CRC32 of every byte before it, the magic, the file's size."""
    return _FOOTER.pack(crc, FOOTER_MAGIC, file_size)


def parse(source, limits: Limits, *, strict_dtypes: bool = True, keys=None) -> ParsedFile:
    """Header, footer, metadata range and index, checked.  ``keys`` (password,
    private_key, trusted_keys, require_signature, allow_unencrypted) open an encrypted
    or signed file (aprfast.security) and are refused for one that is neither."""
    path = source.path
    if source.size < HEADER_SIZE + INDEX_HEADER_SIZE + FOOTER_SIZE:
        raise FormatError(f"file is {source.size} bytes; an APR2 file needs at least "
                          f"{HEADER_SIZE + INDEX_HEADER_SIZE + FOOTER_SIZE}", path=path)
    fields = _unpack_header(bytes(source.read(0, HEADER_SIZE, "header")), path)
    # the footer's magic and declared size are checked when it is read: at once for a
    # local file, when its CRC is first needed for a remote one (common.footer)
    stored_crc = footer(source, source.size - FOOTER_SIZE, FOOTER_SIZE,
                        lambda raw: read_footer(raw, source.size, path))
    parsed = _parse_sections(source, limits, strict_dtypes, fields, source.size, keys)
    parsed.stored_crc = stored_crc
    return parsed


def parse_prefix(source, limits: Limits, *, strict_dtypes: bool = True, file_size=None, keys=None) -> ParsedFile:
    """What :func:`parse` checks, from the bytes before the data alone (a streaming read).

    ``source`` holds the first :func:`prefix_size` bytes; ``file_size`` is the whole
    file's size when known, else None: then ``footer_crc_offset`` and the header's
    ``file_size`` are None (the footer is found at the end of the stream) and
    ``stored_crc`` is None until the reader checks the footer."""
    path = source.path
    if file_size is not None and file_size < HEADER_SIZE + INDEX_HEADER_SIZE + FOOTER_SIZE:
        raise FormatError(f"file is {file_size} bytes; an APR2 file needs at least "
                          f"{HEADER_SIZE + INDEX_HEADER_SIZE + FOOTER_SIZE}", path=path)
    fields = _unpack_header(bytes(source.read(0, HEADER_SIZE, "header")), path)
    return _parse_sections(source, limits, strict_dtypes, fields, file_size, keys)


def prefix_size(head, limits: Limits, path=None) -> int:
    """How many bytes a streaming reader must hold before the first tensor byte (the
    data offset), from the first HEADER_SIZE bytes of a stream (fewer if it ended),
    checked against ``limits`` before anything more is read or allocated."""
    if len(head) < HEADER_SIZE:
        raise CorruptError(f"stream ended after {len(head)} bytes, inside the {HEADER_SIZE}-byte header",
                           path=path)
    _, _, _, flags, meta_off, meta_size, index_off, index_size, data_off = _unpack_header(bytes(head), path)
    _check_flags(flags, path)
    if meta_size > limits.max_metadata_size:
        raise LimitError(f"metadata of {meta_size} bytes exceeds the limit of {limits.max_metadata_size} "
                         "(aprfast.limits.MAX_METADATA_SIZE)", path=path)
    if index_size - INDEX_HEADER_SIZE > limits.max_index_size:
        raise LimitError(f"tensor index of {index_size} bytes exceeds the limit of {limits.max_index_size} "
                         "(aprfast.limits.MAX_INDEX_SIZE)", path=path)
    # A stream cannot go back: metadata and index must come before the data.
    if meta_off + meta_size > data_off or index_off + index_size > data_off:
        raise CorruptError(f"metadata [{meta_off}, +{meta_size}) and index [{index_off}, +{index_size}) must "
                           f"end before the data at {data_off}; a stream cannot go back for them", path=path)
    most = HEADER_SIZE + limits.max_metadata_size + INDEX_HEADER_SIZE + limits.max_index_size + MAX_ALIGNMENT
    if flags & (FLAGS["ENCRYPTED"] | FLAGS["SIGNED"]):
        most += limits.max_index_size  # the security block, bounded like the index
    if data_off > most:
        raise LimitError(f"the data starts at byte {data_off}; a streaming read holds everything before it, "
                         f"at most {most} bytes (header, MAX_METADATA_SIZE, MAX_INDEX_SIZE, padding)", path=path)
    return data_off


def read_footer(raw, file_size, path=None) -> int:
    """The stored CRC32 of a 16-byte footer, once its magic and declared size (which
    must be ``file_size``: else the file was truncated or extended) are checked."""
    stored_crc, footer_magic, declared_size = _FOOTER.unpack(bytes(raw))
    if footer_magic != FOOTER_MAGIC or declared_size != file_size:
        raise CorruptError(f"footer says {footer_magic!r} and {declared_size} bytes, but the file has "
                           f"{file_size} bytes (expected {FOOTER_MAGIC!r}): truncated or extended?", path=path)
    return stored_crc


def _unpack_header(raw: bytes, path):
    fields = _HEADER.unpack(raw)
    magic, major, minor = fields[:3]
    if magic != MAGIC:
        raise FormatError(f"magic {magic!r} is not {MAGIC!r}", path=path)
    if major != 2:
        raise VersionError(f"APR2 header says version {major}.{minor}; this build reads 2.x", path=path)
    return fields


def _check_flags(flags, path) -> None:
    if flags & _UNSUPPORTED:
        names = [n for n, bit in FLAGS.items() if flags & bit & _UNSUPPORTED]
        every = [n for n, bit in FLAGS.items() if flags & bit]
        raise VersionError(f"flags {flags:#x} ({', '.join(every)}) ask for {', '.join(names)}, not supported by "
                           "this build", path=path)


def _parse_sections(source, limits: Limits, strict_dtypes: bool, fields, file_size, keys=None) -> ParsedFile:
    """Flags, metadata range and index; ``file_size`` None means a stream of unknown
    length, whose extents are bounded by STREAM_END instead of the file."""
    path = source.path
    _, major, minor, flags, meta_off, meta_size, index_off, index_size, data_off = fields
    _check_flags(flags, path)
    if meta_size > limits.max_metadata_size:
        raise LimitError(f"metadata of {meta_size} bytes exceeds the limit of {limits.max_metadata_size} "
                         "(aprfast.limits.MAX_METADATA_SIZE)", path=path)
    body_end = STREAM_END if file_size is None else file_size - FOOTER_SIZE
    source.check_range(meta_off, meta_size, "metadata")
    if index_size < INDEX_HEADER_SIZE or index_off + index_size > data_off or data_off > body_end:
        raise CorruptError(f"index [{index_off}, +{index_size}) and data offset {data_off} must satisfy "
                           f"index_size >= 8, index end <= data offset <= {body_end}", path=path)
    if index_size - INDEX_HEADER_SIZE > limits.max_index_size:
        raise LimitError(f"tensor index of {index_size} bytes exceeds the limit of {limits.max_index_size} "
                         "(aprfast.limits.MAX_INDEX_SIZE)", path=path)
    # Encrypted or signed: checked (CRC, signature, key, context tag) before the index is parsed.
    sec = _security.open_security(source, fields, limits, keys or {}, path)
    names = sec.names_source if sec is not None and sec.names_source is not None else source
    count, _reserved = struct.unpack("<II", bytes(names.read(index_off, INDEX_HEADER_SIZE, "index header")))
    # Per-tensor flags naming no known codec are refused there (VersionError), entry by entry.
    entries, data_end = parse_index(
        names, start=index_off + INDEX_HEADER_SIZE, end=index_off + index_size, count=count, spec_layout=True,
        ids=APR2_IDS, rules=_RULES, data_len=body_end - data_off, limits=limits, strict_dtypes=strict_dtypes)
    if entries.compressed and not flags & FLAGS["COMPRESSED"]:
        # A reader trusting the header flag alone would hand out compressed bytes as data.
        raise CorruptError(f"{entries.compressed} tensors are compressed but the header's COMPRESSED flag "
                           f"is clear (flags {flags:#x})", path=path)
    if sec is not None:
        sec.bind(entries, data_off)
    header = {"magic": "APR2", "version": f"{major}.{minor}", "flags": flags,
              "flag_names": [n for n, bit in FLAGS.items() if flags & bit], "tensor_count": count,
              "metadata_offset": meta_off, "metadata_size": meta_size, "index_offset": index_off,
              "index_size": index_size, "data_offset": data_off, "file_size": file_size}
    known = file_size is not None
    if sec is not None:
        header["security"] = sec.describe()
    parsed = ParsedFile(layout=NAME, ids=APR2_IDS, source=_security.SecureSource(source, sec) if sec else source,
                        version=(major, minor), flags=flags, header=header, metadata_range=(meta_off, meta_size),
                        entries=entries, data_start=data_off, data_len=body_end - data_off if known else data_end,
                        footer_crc_offset=body_end if known else None, stored_crc=None, limits=limits)
    parsed.security, parsed.names_source = sec, names if names is not source else None
    return parsed

