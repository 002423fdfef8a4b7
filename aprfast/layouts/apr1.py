"""The historical ``APR1`` layout (aprender's first ``serialization/apr.rs``), read only.

Byte layout (docs/FORMAT.md has the sources of each fact)::

    "APR1" | u32 meta_len | metadata JSON object | u32 n_tensors | u32 index_len
           | index JSON array of {name, dtype, shape, offset, size}
           | tensor data (offsets relative to its start, no alignment)
           | u32 CRC32 (IEEE, as zlib) of every byte before it

All integers little-endian.  The JSON index is checked field by field here and then
re-encoded as an aprender binary index, so the same C checks every v2 file passes
(extents inside the data section, size matching shape and dtype, no overlaps, names
unique) run on it and the rest of aprfast reads the tensors as it reads any v2 file.
Tensors are listed by name (the index is sorted), not in the file's order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .. import dtypes
from ..dtypes import APRENDER_IDS
from ..errors import AprError, CorruptError, FormatError, LimitError, UnknownDTypeError, VersionError
from ..limits import Limits
from ._common import ParsedFile, decode_json, encode_index, footer, parse_index, rule_tables

NAME = "apr1"
MAGIC = b"APR1"
VERSION = 1
#: magic + u32 meta_len; the two u32 after the metadata and the footer come on top.
HEADER_SIZE = 8
FOOTER_SIZE = 4
_U32 = struct.Struct("<I")
#: The smallest well-formed file: empty metadata, no tensors, empty index, CRC.
MIN_SIZE = HEADER_SIZE + 8 + FOOTER_SIZE
_FIELDS = ("name", "dtype", "shape", "offset", "size")
_RULES = rule_tables(APRENDER_IDS)
# APR1's dtype strings.  aprender's writer only ever wrote "F32" (add_tensor_f32) and
# its doc names "I8"; the other safetensors-style names are accepted because the
# descriptor's field is a free string and they name the same element types.
_DTYPES = {name: dtypes.by_name(name) for name in ("F32", "F16", "BF16", "F64", "I8", "U8", "I32", "I64")}
# The id an unknown dtype string gets with unknown_dtypes="raw": one aprender's ids
# leave undefined, so the tensor is listed as unknown and read as raw bytes.
_UNKNOWN_ID = 255


@dataclass
class _Entry:
    """One checked descriptor, in the shape encode_index wants."""

    name: str
    dtype: object
    shape: tuple
    nbytes: int
    offset: int
    type_id: int


def caller_metadata(stored: dict) -> dict:
    """APR1 adds no keys of its own: the metadata is the writer's."""
    return dict(stored)


def prefix_size(head, limits: Limits, path=None) -> int:
    """APR1's index length sits after the metadata, so a stream cannot size the prefix
    from a fixed-size head; streaming APR1 is not supported (open the file instead)."""
    raise VersionError("streaming an APR1 file is not supported; read it with aprfast.open() or "
                       "aprfast.load_file()", path=path)


def parse(source, limits: Limits, *, strict_dtypes: bool = True) -> ParsedFile:
    """Validate the sections, index and extents of an ``APR1`` file (not the CRC)."""
    path = source.path
    if source.size < MIN_SIZE:
        raise FormatError(f"file is {source.size} bytes; an APR1 file needs at least {MIN_SIZE}", path=path)
    body_end = source.size - FOOTER_SIZE
    meta_len = _u32(source, 4, "metadata length")
    counts_at = HEADER_SIZE + meta_len
    if counts_at + 8 > body_end:
        raise CorruptError(f"APR1 metadata of {meta_len} bytes leaves no room for the tensor count and index "
                           f"length before the CRC at {body_end}", path=path)
    if meta_len > limits.max_metadata_size:
        raise LimitError(f"metadata of {meta_len} bytes exceeds the limit of {limits.max_metadata_size} "
                         "(aprfast.limits.MAX_METADATA_SIZE)", path=path)
    count = _u32(source, counts_at, "tensor count")
    index_len = _u32(source, counts_at + 4, "index length")
    index_at = counts_at + 8
    if index_len > body_end - index_at:
        raise CorruptError(f"APR1 tensor index of {index_len} bytes at offset {index_at} runs past the CRC at "
                           f"{body_end}", path=path)
    if index_len > limits.max_index_size:
        raise LimitError(f"tensor index of {index_len} bytes exceeds the limit of {limits.max_index_size} "
                         "(aprfast.limits.MAX_INDEX_SIZE)", path=path)
    if count > limits.max_tensor_count:
        raise LimitError(f"file declares {count} tensors, above the limit of {limits.max_tensor_count} "
                         "(aprfast.limits.MAX_TENSOR_COUNT)", path=path)
    data_start = index_at + index_len
    data_len = body_end - data_start
    described = _read_descriptors(source, index_at, index_len, count)
    entries = _checked_entries(source, described, data_len, limits, strict_dtypes)
    header = {"magic": "APR1", "version": "1", "flags": 0, "flag_names": [], "tensor_count": count,
              "metadata_offset": HEADER_SIZE, "metadata_size": meta_len, "tensor_index_offset": index_at,
              "tensor_index_size": index_len, "data_offset": data_start, "file_size": source.size}
    parsed = ParsedFile(layout=NAME, ids=APRENDER_IDS, source=source, version=(VERSION, 0), flags=0,
                        header=header, metadata_range=(HEADER_SIZE, meta_len), entries=entries,
                        data_start=data_start, data_len=data_len, footer_crc_offset=body_end,
                        stored_crc=footer(source, body_end, FOOTER_SIZE, lambda raw: _U32.unpack(bytes(raw))[0]),
                        limits=limits)
    if meta_len == 0:  # aprender's reader takes an empty block as no metadata
        parsed.metadata = {}
    else:  # decoded now, as aprender's reader refused a file whose metadata is not JSON
        _ = parsed.metadata
    return parsed


def _u32(source, offset: int, what: str) -> int:
    return _U32.unpack(bytes(source.read(offset, 4, what)))[0]


def _read_descriptors(source, start: int, size: int, count: int) -> list:
    """The JSON index as a list of descriptor dicts, ``count`` of them."""
    raw = bytes(source.read(start, size, "tensor index"))
    if count == 0 and size == 0:
        return []
    # decode_json's scanner (depth, memory budget, UTF-8) takes an object at the top;
    # the index is an array, so it is wrapped in one to get the same guarded parse.
    try:
        value = decode_json(b'{"index":' + raw + b"}", source.path)["index"]
    except AprError as exc:
        raise type(exc)(f"tensor index ({size} bytes) is not a JSON array: {exc.message}",
                        path=source.path) from None
    if not isinstance(value, list):
        raise CorruptError(f"tensor index must be a JSON array, found {type(value).__name__}", path=source.path)
    if len(value) != count:
        raise CorruptError(f"file declares {count} tensors but its index lists {len(value)}", path=source.path)
    return value


def _checked_entries(source, described: list, data_len: int, limits: Limits, strict_dtypes: bool):
    """Each descriptor checked for its fields' types, then the whole index through the
    aprender index checks (re-encoded, sorted by name)."""
    path = source.path
    checked = [_entry(i, d, limits, strict_dtypes, path) for i, d in enumerate(described)]
    checked.sort(key=lambda e: e.name.encode("utf-8"))
    ids = _IdsWithUnknown({e.dtype: e.type_id for e in checked})
    blob = encode_index(checked, [e.offset for e in checked], ids, spec_layout=False)
    try:
        entries, _ = parse_index(_Blob(blob, path), start=0, end=len(blob), count=len(checked),
                                 spec_layout=False, ids=APRENDER_IDS, rules=_RULES, data_len=data_len,
                                 limits=limits, strict_dtypes=strict_dtypes)
    except AprError as exc:
        raise type(exc)(f"APR1 index: {exc.message}", path=path) from None
    return entries


def _entry(i: int, d, limits: Limits, strict_dtypes: bool, path) -> _Entry:
    if not isinstance(d, dict):
        raise CorruptError(f"tensor index entry {i} is a {type(d).__name__}, not an object", path=path)
    missing = [f for f in _FIELDS if f not in d]
    if missing:
        raise CorruptError(f"tensor index entry {i} lacks {', '.join(missing)}", path=path)
    name, dtype_name, shape = d["name"], d["dtype"], d["shape"]
    if not isinstance(name, str):
        raise CorruptError(f"tensor index entry {i}: name must be a string, not {name!r}", path=path)
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise CorruptError(f"tensor index entry {i}: name {name!r} is not valid UTF-8", path=path) from None
    if len(encoded) > min(limits.max_name_bytes, 0xFFFF):
        raise LimitError(f"tensor index entry {i}: name of {len(encoded)} bytes exceeds the limit of "
                         f"{limits.max_name_bytes} (aprfast.limits.MAX_NAME_BYTES)", path=path)
    if not isinstance(dtype_name, str):
        raise CorruptError(f"tensor {name!r}: dtype must be a string, not {dtype_name!r}", path=path)
    if not isinstance(shape, list):
        raise CorruptError(f"tensor {name!r}: shape must be an array, not {shape!r}", path=path)
    if len(shape) > min(limits.max_dims, 255):
        raise LimitError(f"tensor {name!r}: {len(shape)} dimensions exceed the limit of {limits.max_dims} "
                         "(aprfast.limits.MAX_DIMS)", path=path)
    dims = tuple(_count(name, "shape dimension", v, path) for v in shape)
    offset = _count(name, "offset", d["offset"], path)
    size = _count(name, "size", d["size"], path)
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        if strict_dtypes:
            raise UnknownDTypeError(f"tensor {name!r}: unknown APR1 dtype {dtype_name!r} (known: "
                                    f"{', '.join(_DTYPES)})", path=path)
        return _Entry(name, dtype_name, dims, size, offset, _UNKNOWN_ID)
    return _Entry(name, dtype, dims, size, offset, APRENDER_IDS.id_of(dtype))


def _count(name: str, what: str, value, path) -> int:
    """A JSON value that must be a usize (serde's type for shape, offset and size)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise CorruptError(f"tensor {name!r}: {what} must be an integer in [0, 2**64), not {value!r}", path=path)
    return value


class _IdsWithUnknown:
    """encode_index's ``ids``: each entry's id, including the placeholder id of a dtype
    string aprfast does not know (kept as the string itself)."""

    def __init__(self, ids: dict):
        self._ids = ids

    def id_of(self, dtype) -> int:
        return self._ids[dtype]


class _Blob:
    """The re-encoded index as the minimal source parse_index reads from."""

    def __init__(self, blob: bytes, path):
        self._blob = blob
        self.path = path

    def read(self, offset: int, n: int, what: str = "range"):
        return self._blob[offset:offset + n]
