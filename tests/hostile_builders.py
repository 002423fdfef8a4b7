"""Craft raw ``.apr`` v2 files byte by byte, honest or lying, for tests/test_hostile_files.py.

Nothing here imports aprfast's layout code: the byte tables are written out again
from docs (APRENDER-COMPAT.md §2 for ``APR\\0``; the APR2 layout of aprfast/layouts/apr2.py),
so a file built here is an independent witness of what the bytes should be.

* :class:`Entry` is one index entry, with every field free to lie.
* :func:`build` lays out header | metadata | index | data | footer for either layout
  and then overwrites any header field a test names, recomputing the checksums
  (aprender's header CRC, both footers) unless told not to.
* :func:`honest` turns ``{name: array}`` into entries and a data section.
* :func:`fix_checksums` re-seals an already-mangled file so structural checks, not
  the CRC, are what a reader hits.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

APRENDER = "aprender"
APR2 = "apr2"
LAYOUTS = (APRENDER, APR2)

APRENDER_MAGIC = b"APR\x00"
APR2_MAGIC = b"APR2"
APR2_FOOTER_MAGIC = b"2RPA"

# aprender: magic, major, minor, u16 flags, u32 tensor_count, u64 metadata_offset,
# u32 metadata_size, u64 index_offset, u64 data_offset, u32 header_crc, 20 reserved.
APRENDER_HEADER = struct.Struct("<4sBBHIQIQQI20s")
APRENDER_ROW_MAJOR = 0x0400
APRENDER_COLUMN_MAJOR = 0x0800
APRENDER_ENCRYPTED = 0x0004
APRENDER_SIGNED = 0x0008
# apr2: magic, u16 major, u16 minor, u32 flags, u32 metadata_offset, u32 metadata_size,
# u32 index_offset, u32 index_size, u32 data_offset.
APR2_HEADER = struct.Struct("<4sHHIIIIII")
APR2_FOOTER = struct.Struct("<I4sQ")
APR2_ALIGNED_64 = 0x02
APR2_COMPRESSED = 0x01
APR2_ENCRYPTED = 0x10
APR2_SIGNED = 0x20
APR2_STREAMING = 0x80

#: On-disk dtype ids of the dtypes the tests use, per layout.
DTYPE_IDS = {
    APRENDER: {"F32": 0, "F16": 1, "F64": 3, "I32": 4, "I64": 5, "I8": 6, "U8": 7, "Q4_K": 12},
    APR2: {"F32": 0, "F16": 1, "I8": 3, "I32": 5, "I64": 6, "U8": 7, "F64": 32, "Q4_K": 37},
}
_NUMPY_NAME = {"float32": "F32", "float16": "F16", "float64": "F64", "int32": "I32",
               "int64": "I64", "int8": "I8", "uint8": "U8"}


def align(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def pad(blob: bytes, to: int = 64) -> bytes:
    return blob + bytes(align(len(blob), to) - len(blob))


@dataclass
class Entry:
    """One tensor index entry.  ``name`` may be bytes (to lie about UTF-8), ``offset``
    is relative to the data section, and nothing is checked against anything."""

    name: str | bytes
    dtype_id: int
    dims: tuple
    offset: int
    size: int
    raw_size: int = 0  # apr2 only
    flags: int = 0  # apr2 only
    name_len: int | None = None  # default: the name's byte length
    ndim: int | None = None  # default: len(dims)

    def encode(self, layout: str) -> bytes:
        name = self.name.encode("utf-8") if isinstance(self.name, str) else self.name
        name_len = len(name) if self.name_len is None else self.name_len
        ndim = len(self.dims) if self.ndim is None else self.ndim
        out = struct.pack("<H", name_len) + name + struct.pack("<BB", self.dtype_id, ndim)
        out += b"".join(struct.pack("<Q", d) for d in self.dims)
        out += struct.pack("<QQ", self.offset, self.size)
        if layout == APR2:
            out += struct.pack("<QI", self.raw_size, self.flags)
        return out


@dataclass
class Parts:
    """The sections of a file before they are laid out."""

    entries: list = field(default_factory=list)
    data: bytes = b""
    metadata: bytes | None = None  # default: a small valid JSON object for the layout


def honest(layout: str, tensors: dict) -> Parts:
    """Entries and a data section for ``tensors`` exactly as a writer would lay them out:
    sorted by name, each tensor at a 64-byte aligned offset, zero padded."""
    entries, data = [], b""
    for name in sorted(tensors):
        array = np.asarray(tensors[name])  # not ascontiguousarray: it makes 0-d arrays 1-d
        raw = array.tobytes()
        dtype_id = DTYPE_IDS[layout][_NUMPY_NAME[array.dtype.name]]
        entries.append(Entry(name, dtype_id, tuple(array.shape), len(data), len(raw)))
        data += pad(raw)
    return Parts(entries, data)


def default_metadata(layout: str) -> bytes:
    if layout == APRENDER:
        return (b'{"model_type":"","name":"hostile","license":null,"data_source":null,'
                b'"data_license":null,"total_size":0,"param_count":0}')
    return b'{"apr_version":"2.0.0","name":"hostile"}'


def build(layout: str, parts: Parts, *, index: bytes | None = None, seal: bool = True, **header) -> bytes:
    """A whole file of ``layout`` from ``parts``.

    ``index`` replaces the encoded entries with raw bytes.  Keyword arguments override
    header fields after layout (aprender: magic, major, minor, flags, tensor_count,
    metadata_offset, metadata_size, index_offset, data_offset, header_crc, reserved;
    apr2: magic, major, minor, flags, metadata_offset, metadata_size, index_offset,
    index_size, data_offset, plus tensor_count and index_reserved in the index header
    and footer_magic / footer_size in the footer).  ``seal`` recomputes the checksums
    (and, for apr2, the footer's file size unless ``footer_size`` is given).
    """
    if layout == APRENDER:
        return _build_aprender(parts, index, seal, **header)
    if layout == APR2:
        return _build_apr2(parts, index, seal, **header)
    raise ValueError(layout)


def _build_aprender(parts: Parts, index, seal, **over) -> bytes:
    meta = default_metadata(APRENDER) if parts.metadata is None else parts.metadata
    if index is None:
        index = b"".join(e.encode(APRENDER) for e in parts.entries)
    index_offset = 64 + align(len(meta))
    data_offset = index_offset + align(len(index))
    fields = dict(magic=APRENDER_MAGIC, major=2, minor=0, flags=APRENDER_ROW_MAJOR,
                  tensor_count=len(parts.entries), metadata_offset=64, metadata_size=len(meta),
                  index_offset=index_offset, data_offset=data_offset, header_crc=0, reserved=bytes(20))
    unknown = set(over) - set(fields)
    if unknown:
        raise TypeError(f"aprender header has no fields {sorted(unknown)}")
    fields.update(over)
    header = APRENDER_HEADER.pack(*fields.values())
    body = header + pad(meta) + pad(index) + pad(parts.data)
    out = body + struct.pack("<I", 0)
    if seal:
        out = seal_aprender(out, header_crc="header_crc" not in over)
    return out


def _build_apr2(parts: Parts, index, seal, **over) -> bytes:
    meta = default_metadata(APR2) if parts.metadata is None else parts.metadata
    if index is None:
        index = b"".join(e.encode(APR2) for e in parts.entries)
    count = over.pop("tensor_count", len(parts.entries))
    index_reserved = over.pop("index_reserved", 0)
    footer_magic = over.pop("footer_magic", APR2_FOOTER_MAGIC)
    footer_size = over.pop("footer_size", None)
    index = struct.pack("<II", count, index_reserved) + index
    index_offset = 32 + len(meta)
    data_offset = align(index_offset + len(index))
    fields = dict(magic=APR2_MAGIC, major=2, minor=0, flags=APR2_ALIGNED_64, metadata_offset=32,
                  metadata_size=len(meta), index_offset=index_offset, index_size=len(index),
                  data_offset=data_offset)
    unknown = set(over) - set(fields)
    if unknown:
        raise TypeError(f"apr2 header has no fields {sorted(unknown)}")
    fields.update(over)
    header = APR2_HEADER.pack(*fields.values())
    prefix = header + meta + index
    body = prefix + bytes(data_offset - len(prefix)) + pad(parts.data)
    size = len(body) + APR2_FOOTER.size
    out = body + APR2_FOOTER.pack(0, footer_magic, size if footer_size is None else footer_size)
    if seal:
        out = seal_apr2(out, file_size=footer_size is None)
    return out


# --- checksums ----------------------------------------------------------------------
def aprender_header_crc(header: bytes) -> int:
    """CRC32 of header bytes [0, 40) and [44, 64): everything but the CRC field."""
    return zlib.crc32(header[44:64], zlib.crc32(header[:40]))


def seal_aprender(data: bytes, *, header_crc: bool = True) -> bytes:
    """Recompute the header CRC (if the header is whole) and the 4-byte footer CRC."""
    data = bytearray(data)
    if header_crc and len(data) >= 64:
        data[40:44] = struct.pack("<I", aprender_header_crc(bytes(data[:64])))
    if len(data) >= 4:
        data[-4:] = struct.pack("<I", zlib.crc32(bytes(data[:-4])))
    return bytes(data)


def seal_apr2(data: bytes, *, file_size: bool = True) -> bytes:
    """Recompute the footer CRC and, if ``file_size``, the footer's file size field."""
    data = bytearray(data)
    if len(data) < APR2_FOOTER.size:
        return bytes(data)
    _, magic, size = APR2_FOOTER.unpack(bytes(data[-16:]))
    if file_size:
        size = len(data)
    crc = zlib.crc32(bytes(data[:-16]))
    data[-16:] = APR2_FOOTER.pack(crc, magic, size)
    return bytes(data)


def fix_checksums(data: bytes, *, apr2_file_size: bool = True) -> bytes:
    """Re-seal a file of either layout (chosen by its magic) after bytes were changed;
    anything else comes back unchanged.  ``apr2_file_size=False`` keeps whatever file
    size an APR2 footer states (it is not a checksum, but re-sealing fixes it by default)."""
    if data[:4] == APRENDER_MAGIC:
        return seal_aprender(data)
    if data[:4] == APR2_MAGIC:
        return seal_apr2(data, file_size=apr2_file_size)
    return data


# --- patching existing files ----------------------------------------------------------
def patch(data: bytes, offset: int, fmt: str, value, *, seal: bool = True) -> bytes:
    """``data`` with ``struct.pack(fmt, value)`` written at ``offset``, then re-sealed."""
    blob = struct.pack(fmt, value)
    out = data[:offset] + blob + data[offset + len(blob):]
    return fix_checksums(out) if seal else out


def sections(data: bytes) -> dict:
    """Byte ranges ``{name: (start, stop)}`` of a well-formed file's header, metadata,
    index, data and footer, read from its header (for choosing what a test damages)."""
    if data[:4] == APRENDER_MAGIC:
        h = APRENDER_HEADER.unpack(data[:64])
        meta_off, meta_size, index_off, data_off = h[5], h[6], h[7], h[8]
        return {"magic": (0, 4), "header": (4, 64), "metadata": (meta_off, meta_off + meta_size),
                "index": (index_off, data_off), "data": (data_off, len(data) - 4),
                "footer": (len(data) - 4, len(data))}
    if data[:4] == APR2_MAGIC:
        h = APR2_HEADER.unpack(data[:32])
        meta_off, meta_size, index_off, index_size, data_off = h[4:9]
        n = len(data)
        return {"magic": (0, 4), "header": (4, 32), "metadata": (meta_off, meta_off + meta_size),
                "index": (index_off, index_off + index_size), "data": (data_off, n - 16),
                "footer_crc": (n - 16, n - 12), "footer_magic": (n - 12, n - 8), "footer_size": (n - 8, n)}
    raise ValueError("not a v2 file")


def flip_bit(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)
