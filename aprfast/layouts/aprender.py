"""The v2 tensor container as aprender writes it: magic ``APR\\0``, 64-byte header with
its own CRC, compact JSON metadata in aprender's field order, a packed index sorted by
name, 64-byte padding after every section and tensor, and a 4-byte CRC32 footer.

Byte-identical to ``apr_format::v2::AprV2Writer`` (apr-format 0.72) for the same
content; reads everything aprender has written, including pre-#2254 null-filled
metadata and pre-GH-438 dtype ids.  docs/FORMAT.md §2 has the byte table.
"""

from __future__ import annotations

import numbers
import struct

import numpy as np

from .. import limits as _limits
from .._crc import crc32
from ..dtypes import APRENDER_IDS
from ..errors import ChecksumError, CorruptError, FormatError, LayoutError, LimitError, VersionError
from ..limits import Limits
from . import serde_json as _serde_json
from ._common import (
    STREAM_END,
    ParsedFile,
    Plan,
    align,
    check_reserve,
    checked_inputs,
    encode_index,
    footer,
    lay_out_data,
    lay_out_in_order,
    parse_index,
    rule_tables,
    sorted_json,
)

NAME = "aprender"
MAGIC = b"APR\x00"
#: The major version this layout is; other versions behind the same magic are refused first.
VERSION = 2
HEADER_SIZE = 64
FOOTER_SIZE = 4
ALIGNMENT = 64
#: A file saved with ``reserve`` (room for in-place edits) keeps [HEADER_SIZE, SLOT_END)
#: unreferenced: the commit slot an in-place edit writes with the header (docs/FORMAT.md §5.2).
SLOT_END = 128
#: aprender's writer silently truncates longer names; aprfast refuses them instead.
MAX_NAME_BYTES = 256
MAX_DIMS = 8

FLAGS = {
    "LZ4_COMPRESSED": 0x0001, "ZSTD_COMPRESSED": 0x0002, "ENCRYPTED": 0x0004, "SIGNED": 0x0008,
    "SHARDED": 0x0010, "QUANTIZED": 0x0020, "HAS_FILTERBANK": 0x0040, "HAS_MODEL_CARD": 0x0080,
    "STREAMING": 0x0100, "HAS_VOCAB": 0x0200, "LAYOUT_ROW_MAJOR": 0x0400, "LAYOUT_COLUMN_MAJOR": 0x0800,
}
# aprender refuses column-major files.  ENCRYPTED and SIGNED are read as aprender reads
# them, ignored: no aprender build encrypts or signs v2 data, but `set_header_flags`
# carries the bits over when a file is re-stamped.
_UNREADABLE = FLAGS["LAYOUT_COLUMN_MAJOR"]

_HEADER = struct.Struct("<4sBBHIQIQQI20s")
_RULES = rule_tables(APRENDER_IDS)

# --- metadata ---------------------------------------------------------------------
# AprV2Metadata's fields in declaration order (serde order) with their Rust types.
# "opt" fields are skipped when None; "null" fields are written as null when None
# (license provenance, #2254); "req" fields always appear, with a default if absent.
_FIELDS = (
    ("model_type", "str", "req", ""), ("name", "str", "opt", None), ("description", "str", "opt", None),
    ("author", "str", "opt", None), ("license", "str", "null", None), ("data_source", "str", "null", None),
    ("data_license", "str", "null", None), ("version", "str", "opt", None), ("source", "str", "opt", None),
    ("original_format", "str", "opt", None), ("created_at", "str", "opt", None),
    ("total_size", "u64", "req", 0), ("param_count", "u64", "req", 0),
    ("quantization", "quantization", "opt", None), ("sharding", "sharding", "opt", None),
    ("chat_template", "str", "opt", None), ("chat_format", "str", "opt", None),
    ("special_tokens", "special_tokens", "opt", None), ("architecture", "str", "opt", None),
    ("hf_architecture", "str", "opt", None), ("hf_model_type", "str", "opt", None),
    ("hidden_size", "u64", "opt", None), ("num_layers", "u64", "opt", None),
    ("num_heads", "u64", "opt", None), ("num_kv_heads", "u64", "opt", None),
    ("vocab_size", "u64", "opt", None), ("intermediate_size", "u64", "opt", None),
    ("max_position_embeddings", "u64", "opt", None), ("rope_theta", "f32", "opt", None),
    ("rope_type", "u32", "opt", None), ("rms_norm_eps", "f32", "opt", None),
    ("head_dim", "u64", "opt", None), ("num_experts", "u64", "opt", None),
    ("num_experts_per_tok", "u64", "opt", None), ("moe_intermediate_size", "u64", "opt", None),
)
_TYPED = {name for name, *_ in _FIELDS}
# What encode_metadata writes for a field the caller left out.
_FILLED = {name: default for name, _, policy, default in _FIELDS if policy in ("req", "null")}
# Nested structs: every field is written, None as null; missing required keys fail.
_NESTED = {
    "quantization": (("quant_type", "str", True), ("bits", "u8", True), ("block_size", "u64", False),
                     ("symmetric", "bool", True)),
    "sharding": (("shard_count", "u64", True), ("shard_index", "u64", True), ("total_size", "u64", True),
                 ("pattern", "str", False)),
    "special_tokens": tuple((k, "str", False) for k in (
        "bos_token", "eos_token", "unk_token", "pad_token", "im_start_token", "im_end_token")),
}
_INT_MAX = {"u64": 2**64, "u32": 2**32, "u8": 2**8}


def encode_metadata(metadata: dict) -> bytes:
    """JSON exactly as serde_json writes aprender's ``AprV2Metadata``.

    Keys that are not typed fields go last, sorted (aprender's order for them is its
    HashMap's, random per process).  A value aprender could not hold raises LayoutError.
    """
    metadata = dict(metadata or {})
    for key in metadata:
        if not isinstance(key, str):
            raise LayoutError(f"metadata keys must be str, not {key!r}")
    ordered, f32_keys = {}, set()
    for key, kind, policy, default in _FIELDS:
        value = metadata.get(key, default)
        if value is None:
            if policy == "null":
                ordered[key] = None
            elif policy == "req":
                raise LayoutError(f"aprender metadata field {key!r} cannot be null")
            continue
        ordered[key] = _typed(key, kind, value)
        if kind == "f32":
            f32_keys.add(key)
    for key in sorted(k for k in metadata if k not in _TYPED):
        ordered[key] = sorted_json(metadata[key])
    try:
        return _serde_json.dumps(ordered, f32_paths=frozenset(f32_keys))
    except (ValueError, TypeError) as exc:
        raise LayoutError(f"metadata cannot be written as aprender JSON: {exc}") from None


#: aprender's struct fields that describe the tensors written, not the model.
COUNT_KEYS = ("param_count", "total_size")


def tensor_counts(entries) -> dict:
    """``{"param_count", "total_size"}`` of ``(element_count, nbytes)`` pairs: the
    elements of every tensor and the bytes of their data (uncompressed, without the
    padding between tensors), what a converter writes into aprender's two count
    fields (issue 28 item 4).  aprender's own ``AprV2Writer`` writes what its caller
    sets (0 when nothing), so :func:`aprfast.save_file` leaves them to its caller too
    (byte identity); ``aprfast.convert``, ``apr quantize`` and ``apr merge``, which
    know the tensors they write, fill them.

    Args:
        entries: ``(element_count, nbytes)`` per tensor.

    Returns:
        The two counts.

    Examples:
        >>> from aprfast.layouts.aprender import tensor_counts
        >>> tensor_counts([(6, 24), (2, 4)])
        {'param_count': 8, 'total_size': 28}
    """
    params = size = 0
    for count, nbytes in entries:
        params += int(count)
        size += int(nbytes)
    return {"param_count": params, "total_size": size}


def caller_metadata(stored: dict) -> dict:
    """The metadata as the writer's caller gave it: ``stored`` without the fields
    aprender's struct makes every file carry (``model_type`` "", ``license``,
    ``data_source``, ``data_license`` null, ``total_size`` and ``param_count`` 0) when
    they hold those defaults.  Byte identity with aprender needs them in the file; a
    caller who wrote exactly a default gets the same bytes, so it cannot be told apart."""
    return {k: v for k, v in stored.items() if k not in _FILLED or v != _FILLED[k] or type(v) is not type(_FILLED[k])}


def _typed(key, kind, value):
    if kind in _NESTED:
        return _nested(key, value)
    if kind == "str":
        if not isinstance(value, str):
            raise LayoutError(f"aprender metadata field {key!r} must be a string, not {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise LayoutError(f"aprender metadata field {key!r} must be a bool, not {value!r}")
        return value
    if kind == "f32":
        return _f32(key, value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) \
            or not 0 <= value < _INT_MAX[kind]:
        raise LayoutError(f"aprender metadata field {key!r} must be an integer in [0, {_INT_MAX[kind]}), "
                          f"not {value!r}")
    return int(value)


def _f32(key, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise LayoutError(f"aprender metadata field {key!r} must be a number, not {value!r}")
    as_f32 = _serde_json.to_f32(value)  # one rounding, as serde's u64/f64 -> f32
    if not np.isfinite(as_f32):
        raise LayoutError(f"aprender metadata field {key!r} = {value!r} is not a finite f32")
    return float(as_f32)


def _nested(key, value):
    if not isinstance(value, dict):
        raise LayoutError(f"aprender metadata field {key!r} must be an object, not {value!r}")
    fields = _NESTED[key]
    extra = set(value) - {name for name, *_ in fields}
    if extra:
        raise LayoutError(f"aprender metadata field {key!r} has keys aprender would drop: {sorted(extra)}")
    out = {}
    for name, kind, required in fields:
        item = value.get(name)
        if item is None:
            if required:
                raise LayoutError(f"aprender metadata field {key}.{name} is required")
            out[name] = None
        else:
            out[name] = _typed(f"{key}.{name}", kind, item)
    return out


# --- writing ----------------------------------------------------------------------
def plan(inputs, metadata, *, alignment: int = ALIGNMENT, in_given_order: bool = False, reserve: int = 0) -> Plan:
    """Lay out a file; LayoutError says why aprender's layout cannot hold the request.
    ``in_given_order``: data in the order of ``inputs`` (the index is sorted either way).
    ``reserve`` > 0 leaves the commit slot [64, 128) and ``reserve`` zero bytes (rounded
    up to 64) between the index and the data, room for :func:`aprfast.edit` in place;
    0 writes aprender's own bytes."""
    if alignment != ALIGNMENT:
        raise LayoutError(f"the aprender layout always aligns tensors to 64 bytes, not {alignment}")
    reserve = check_reserve(reserve)
    ordered = checked_inputs(inputs, APRENDER_IDS, max_name_bytes=MAX_NAME_BYTES, max_dims=MAX_DIMS)
    meta = encode_metadata(metadata)
    if len(meta) >= 2**32:
        raise LayoutError(f"metadata of {len(meta)} bytes does not fit aprender's u32 size field")
    meta_offset = SLOT_END if reserve else HEADER_SIZE
    index_offset = meta_offset + align(len(meta), ALIGNMENT)
    data = ordered
    if in_given_order:
        data, offsets, pads, data_len = lay_out_in_order(ordered, inputs, ALIGNMENT)
    else:
        offsets, pads, data_len = lay_out_data(ordered, ALIGNMENT)
    index = encode_index(ordered, offsets, APRENDER_IDS, spec_layout=False)
    data_start = index_offset + align(len(index), ALIGNMENT) + align(reserve, ALIGNMENT)
    if reserve and data_start - index_offset > _limits.MAX_INDEX_SIZE:
        raise LayoutError(f"reserve={reserve}: readers take everything between the index and the data as the "
                          f"index, at most {_limits.MAX_INDEX_SIZE} bytes (aprfast.limits.MAX_INDEX_SIZE)")
    flags = header_flags(FLAGS["LAYOUT_ROW_MAJOR"], metadata)
    header = pack_header(flags, len(ordered), meta_offset, len(meta), index_offset, data_start)
    prefix = b"".join([header, bytes(meta_offset - HEADER_SIZE), _pad(meta, ALIGNMENT), _pad(index, ALIGNMENT),
                       bytes(data_start - index_offset - align(len(index), ALIGNMENT))])
    return Plan(NAME, prefix, data, pads, data_start + data_len + FOOTER_SIZE,
                lambda crc: struct.pack("<I", crc))


def header_flags(flags: int, metadata) -> int:
    """``flags`` with SHARDED and QUANTIZED following the metadata's ``sharding`` and
    ``quantization`` objects, as the writer sets them."""
    metadata = metadata or {}
    flags &= ~(FLAGS["SHARDED"] | FLAGS["QUANTIZED"])
    if metadata.get("sharding") is not None:
        flags |= FLAGS["SHARDED"]
    # QUANTIZED follows the `quantization` object as SHARDED follows `sharding`: aprender
    # sets it only through set_header_flags, so the same content gives the same bytes.
    if metadata.get("quantization") is not None:
        flags |= FLAGS["QUANTIZED"]
    return flags


def _pad(blob: bytes, to: int) -> bytes:
    return blob + bytes(align(len(blob), to) - len(blob))


def pack_header(flags, count, meta_offset, meta_size, index_offset, data_offset, version=(VERSION, 0)) -> bytes:
    """The 64-byte header, its CRC computed (the 20 reserved bytes zero)."""
    fields = (MAGIC, version[0], version[1], flags, count, meta_offset, meta_size, index_offset, data_offset)
    unsigned = _HEADER.pack(*fields, 0, bytes(20))
    return _HEADER.pack(*fields, _header_crc(unsigned), bytes(20))


def _header_crc(header: bytes) -> int:
    return crc32(header[44:64], crc32(header[:40]))


def _check_version(source) -> None:
    """Name the version before anything else is judged by v2's rules.

    Other tools write other formats behind the same magic (aprender-tsp: ``APR\\0``, u32
    version 1, u32 model type, payload CRC), whose bytes 40..44 are no header CRC, so a
    version byte other than 2 is a VersionError whatever the CRC says, even in a file
    too short for a v2 header.  Two exceptions stay as the v2 rules have them: a version
    byte of 0 (no writer uses it: an unwritten or cut-off header), and a whole 64-byte
    header whose CRC matches once its version byte is put back to 2, which is a v2
    header with a damaged version byte (a ChecksumError from :func:`parse`).
    """
    if source.size < 6:
        return
    major, minor = bytes(source.read(4, 2, "version"))
    if major in (0, VERSION):
        return
    if source.size >= HEADER_SIZE:
        raw = bytearray(source.read(0, HEADER_SIZE, "header"))
        stored = int.from_bytes(raw[40:44], "little")
        raw[4] = VERSION
        if _header_crc(bytes(raw)) == stored:
            return
    raise VersionError(f"APR\\0 file says version {major}.{minor}; this build reads version {VERSION}.x "
                       "(aprender's v2 tensor container) only, and other tools' formats behind the same "
                       "magic (aprender-tsp writes version 1) are not tensor containers",
                       path=source.path)


# --- reading ----------------------------------------------------------------------
def parse(source, limits: Limits, *, strict_dtypes: bool = True) -> ParsedFile:
    """Validate the header, index and extents of an ``APR\\0`` file (not the footer CRC)."""
    path = source.path
    _check_version(source)
    if source.size < HEADER_SIZE + FOOTER_SIZE:
        raise FormatError(f"file is {source.size} bytes; an aprender v2 file needs at least "
                          f"{HEADER_SIZE + FOOTER_SIZE}", path=path)
    parsed = _parse_sections(source, limits, strict_dtypes, source.size)
    parsed.stored_crc = footer(source, parsed.footer_crc_offset, FOOTER_SIZE, read_footer)
    return parsed


def parse_prefix(source, limits: Limits, *, strict_dtypes: bool = True, file_size=None) -> ParsedFile:
    """What :func:`parse` checks, from the bytes before the data alone (a streaming read).

    ``source`` holds the first :func:`prefix_size` bytes; ``file_size`` is the whole
    file's size when known (then extents are checked against it), else None.  The
    footer is not read: ``stored_crc`` is None, and ``footer_crc_offset`` (and the
    header's ``file_size``) say where the footer must be, which the index fixes."""
    _check_version(source)
    if file_size is not None and file_size < HEADER_SIZE + FOOTER_SIZE:
        raise FormatError(f"file is {file_size} bytes; an aprender v2 file needs at least "
                          f"{HEADER_SIZE + FOOTER_SIZE}", path=source.path)
    return _parse_sections(source, limits, strict_dtypes, file_size)


def prefix_size(head, limits: Limits, path=None) -> int:
    """How many bytes a streaming reader must hold before the first tensor byte (the
    data offset), from the first HEADER_SIZE bytes of a stream (fewer if it ended),
    checked against ``limits`` before anything more is read or allocated."""
    from ..io.sources import BufferSource

    _check_version(BufferSource(head, path))
    if len(head) < HEADER_SIZE:
        raise CorruptError(f"stream ended after {len(head)} bytes, inside the {HEADER_SIZE}-byte header",
                           path=path)
    _, _, _, _, _, meta_off, meta_size, index_off, data_off, _ = _unpack_header(bytes(head), path)
    if meta_size > limits.max_metadata_size:
        raise LimitError(f"metadata of {meta_size} bytes exceeds the limit of {limits.max_metadata_size} "
                         "(aprfast.limits.MAX_METADATA_SIZE)", path=path)
    if index_off > data_off:
        raise CorruptError(f"tensor index offset {index_off} lies after the data offset {data_off}", path=path)
    if data_off - index_off > limits.max_index_size:
        raise LimitError(f"tensor index of {data_off - index_off} bytes exceeds the limit of "
                         f"{limits.max_index_size} (aprfast.limits.MAX_INDEX_SIZE)", path=path)
    # A stream cannot go back: metadata and index must come before the data.  Gaps
    # beyond the sections' own padding would only make the reader buffer more.
    if meta_off + meta_size > data_off:
        raise CorruptError(f"metadata [{meta_off}, +{meta_size}) does not end before the data at {data_off}; "
                           "a stream cannot go back for it", path=path)
    most = HEADER_SIZE + align(limits.max_metadata_size, ALIGNMENT) + limits.max_index_size
    if data_off > most:
        raise LimitError(f"the data starts at byte {data_off}; a streaming read holds everything before it, "
                         f"at most {most} bytes (header, MAX_METADATA_SIZE, MAX_INDEX_SIZE)", path=path)
    return data_off


def read_footer(raw, file_size=None, path=None) -> int:
    """The CRC32 the 4-byte footer stores (nothing else to check in it)."""
    return struct.unpack("<I", bytes(raw))[0]


def _unpack_header(raw: bytes, path):
    """The header's fields, once its magic, CRC, version and flags have been checked."""
    magic, major, minor, flags, count, meta_off, meta_size, index_off, data_off, stored, _ = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise FormatError(f"magic {magic!r} is not {MAGIC!r}", path=path)
    if _header_crc(raw) != stored:
        damaged = ""
        if major != VERSION and _header_crc(raw[:4] + bytes([VERSION]) + raw[5:]) == stored:
            damaged = f" (it matches with version byte {VERSION}: the version byte {major} is damaged)"
        raise ChecksumError(f"header CRC32 is {stored:#010x} but bytes 0..64 give {_header_crc(raw):#010x}"
                            f"{damaged}", path=path)
    if major != VERSION:
        raise VersionError(f"aprender v2 header says version {major}.{minor}; this build reads version "
                           f"{VERSION}.x", path=path)
    if flags & _UNREADABLE:
        names = [n for n, bit in FLAGS.items() if flags & bit & _UNREADABLE]
        raise VersionError(f"flags {flags:#06x} ask for {', '.join(names)}, which aprender refuses too",
                           path=path)
    return magic, major, minor, flags, count, meta_off, meta_size, index_off, data_off, stored


def _parse_sections(source, limits: Limits, strict_dtypes: bool, file_size) -> ParsedFile:
    """Header, metadata range and index; ``file_size`` None means a stream of unknown
    length, whose extents are bounded by STREAM_END instead of the file."""
    path = source.path
    raw = bytes(source.read(0, HEADER_SIZE, "header"))
    _, major, minor, flags, count, meta_off, meta_size, index_off, data_off, stored = _unpack_header(raw, path)
    body_end = STREAM_END if file_size is None else file_size - FOOTER_SIZE
    if meta_size > limits.max_metadata_size:
        raise LimitError(f"metadata of {meta_size} bytes exceeds the limit of {limits.max_metadata_size} "
                         "(aprfast.limits.MAX_METADATA_SIZE)", path=path)
    source.check_range(meta_off, meta_size, "metadata")
    if file_size is not None and index_off <= data_off and data_off > body_end:
        raise CorruptError(f"truncated: the header promises at least {data_off + FOOTER_SIZE} bytes (data "
                           f"section at {data_off}, then the {FOOTER_SIZE}-byte footer), the file has "
                           f"{file_size}", path=path)
    if not (index_off <= data_off <= body_end):
        raise CorruptError(f"tensor index offset {index_off} and data offset {data_off} must satisfy "
                           f"index <= data <= {body_end} (file size minus footer)", path=path)
    entries, data_end = parse_index(
        source, start=index_off, end=data_off, count=count, spec_layout=False, ids=APRENDER_IDS,
        rules=_RULES, data_len=body_end - data_off, limits=limits, strict_dtypes=strict_dtypes,
        pad_to=ALIGNMENT)
    # Both aprender writers pad every tensor to 64 bytes, so the index fixes where the footer
    # is (aprender's own required_file_len): anything else was cut short or extended, caught
    # here even where every tensor's bytes are still present.
    if file_size is not None and data_off + data_end != body_end:
        raise CorruptError(f"file is {file_size} bytes but its index puts the footer at "
                           f"{data_off + data_end}: truncated or extended", path=path)
    header = {"magic": "APR\\0", "version": f"{major}.{minor}", "flags": flags,
              "flag_names": [n for n, bit in FLAGS.items() if flags & bit], "tensor_count": count,
              "metadata_offset": meta_off, "metadata_size": meta_size, "tensor_index_offset": index_off,
              "data_offset": data_off, "header_crc32": stored, "file_size": data_off + data_end + FOOTER_SIZE}
    return ParsedFile(layout=NAME, ids=APRENDER_IDS, source=source, version=(major, minor), flags=flags,
                      header=header, metadata_range=(meta_off, meta_size), entries=entries,
                      data_start=data_off, data_len=data_end, footer_crc_offset=data_off + data_end,
                      stored_crc=None, limits=limits)
